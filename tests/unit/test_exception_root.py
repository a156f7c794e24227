"""One exception root (issue 20): every exception class pyprovlib defines derives from
:class:`pyprovlib._errors.PyprovlibError`, so ``except PyprovlibError`` catches anything
pyprovlib raised on purpose; the builtin base a class had before stays as a second base.

Every module under ``src/pyprovlib`` is imported (generated protobuf code aside: it defines
messages, not errors) and every exception class whose ``__module__`` is that module is checked,
private ones included: a private control-flow exception that escapes by mistake must still be
recognisable as pyprovlib's.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import warnings
from types import ModuleType

import pytest

import pyprovlib
from pyprovlib._errors import InvalidOptionsError, PyprovlibError


def _modules() -> list[ModuleType]:
    modules = []
    for info in pkgutil.walk_packages(pyprovlib.__path__, "pyprovlib."):
        if "._proto" in info.name:
            continue
        with warnings.catch_warnings():
            # the deprecated old module paths warn on import; their classes are checked anyway
            warnings.filterwarnings("ignore", r"pyprovlib\..* is deprecated", DeprecationWarning)
            modules.append(importlib.import_module(info.name))
    return modules


def _exception_classes(module: ModuleType) -> list[type[BaseException]]:
    found = []
    for obj in vars(module).values():
        if (
            inspect.isclass(obj)
            and issubclass(obj, BaseException)
            and obj.__module__ == module.__name__
        ):
            found.append(obj)
            # Nested classes (an error defined inside a class body) count too.
            found.extend(
                inner
                for inner in vars(obj).values()
                if inspect.isclass(inner) and issubclass(inner, BaseException)
            )
    return found


MODULES = _modules()
EXCEPTIONS = sorted(
    {cls for module in MODULES for cls in _exception_classes(module)},
    key=lambda cls: f"{cls.__module__}.{cls.__qualname__}",
)


def test_the_walk_sees_the_whole_package() -> None:
    names = {module.__name__ for module in MODULES}
    # One module from each layer, and a private one: a walk that stopped early would pass the
    # root check vacuously.
    for expected in (
        "pyprovlib.kube._config",
        "pyprovlib.controller._options",
        "pyprovlib.runtime._app",
        "pyprovlib.csi._connection",
        "pyprovlib.testing._controlplane",
        "pyprovlib.examples.rbd._rbd_cli",
        "pyprovlib._lazy_kubernetes",
    ):
        assert expected in names
    assert len(EXCEPTIONS) >= 40


@pytest.mark.parametrize(
    "cls", EXCEPTIONS, ids=[f"{c.__module__}.{c.__qualname__}" for c in EXCEPTIONS]
)
def test_every_exception_derives_from_the_root(cls: type[BaseException]) -> None:
    assert issubclass(cls, PyprovlibError), (
        f"{cls.__module__}.{cls.__qualname__} must derive from pyprovlib._errors.PyprovlibError "
        "(keep its builtin base as a second base: class X(PyprovlibError, ValueError))"
    )


@pytest.mark.parametrize(
    ("dotted", "builtin"),
    [
        ("pyprovlib.csi._server.CapabilityError", ValueError),
        ("pyprovlib.csi.resizer._controller.DriverCannotExpandError", RuntimeError),
        ("pyprovlib.testing._controlplane.ControlPlaneError", RuntimeError),
        ("pyprovlib.kube._rest.WatchError", Exception),
        ("pyprovlib.controller._attach.options.InvalidAttachOptionsError", ValueError),
        ("pyprovlib.controller._resize.options.InvalidResizeOptionsError", ValueError),
    ],
)
def test_the_builtin_base_is_kept(dotted: str, builtin: type[BaseException]) -> None:
    module, _, name = dotted.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    assert issubclass(cls, PyprovlibError)
    assert issubclass(cls, builtin)


def test_watch_error_is_still_an_api_exception() -> None:
    from kubernetes_asyncio.client.exceptions import ApiException

    from pyprovlib.kube._rest import WatchError

    assert issubclass(WatchError, ApiException)


def test_invalid_options_errors_share_one_base() -> None:
    from pyprovlib.controller._attach.options import InvalidAttachOptionsError
    from pyprovlib.controller._resize.options import InvalidResizeOptionsError

    assert issubclass(InvalidAttachOptionsError, InvalidOptionsError)
    assert issubclass(InvalidResizeOptionsError, InvalidOptionsError)

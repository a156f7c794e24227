"""Lazy re-exports for package ``__init__`` files (PEP 562): each name is imported from its
module the first time it is used, so importing a package runs none of its modules.

That is what keeps ``python -m pyprovlib.<entry point>`` light until its ``__main__`` runs:
Python imports every package on the way to ``__main__`` first, and the entry point must be able
to call ``pyprovlib.enable_lazy_kubernetes_imports()`` before anything imports
kubernetes-asyncio. A package ``__init__`` uses it so::

    if TYPE_CHECKING:  # what type checkers and readers see
        from pyprovlib.csi.attacher._controller import CSIAttacher

    __all__ = ["CSIAttacher"]
    __getattr__, __dir__ = lazy_reexports(__name__, {".controller": ["CSIAttacher"]})
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterable, Mapping
from types import ModuleType
from typing import Any

from pyprovlib._errors import PyprovlibError

__all__ = ["ReexportListError", "lazy_reexports"]


class ReexportListError(PyprovlibError, ValueError):
    """A package's re-export lists contradict each other (a bug in that ``__init__``)."""


_SHADOWED = "__pyprovlib_shadowed_reexports__"
"""In a package's namespace: its re-exports named like the submodule they come from."""


class _ReexportingPackage(ModuleType):
    """A package re-exporting a name from its submodule of the same name (``main`` from
    ``.main``). The import system binds a submodule to its package's attribute of that name
    once the submodule is imported; here the re-exported object takes the attribute instead,
    as it does after an eager ``from .main import main`` in the ``__init__``."""

    def __setattr__(self, name: str, value: Any) -> None:
        if (
            name in self.__dict__.get(_SHADOWED, ())
            and isinstance(value, ModuleType)
            and value.__name__ == f"{self.__name__}.{name}"
        ):
            value = getattr(value, name)
        super().__setattr__(name, value)


def lazy_reexports(
    package: str,
    exports: Mapping[str, Iterable[str]],
    *,
    submodules: Iterable[str] = (),
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` (PEP 562) of ``package`` (its ``__name__``).

    ``exports`` maps a module (absolute, or relative to ``package`` with a leading dot) to the
    names the package re-exports from it; ``submodules`` are the package's submodules that are
    its attributes from the start (as after an eager ``from pkg import submodule``), in
    ``__all__`` or not. Any other public (not ``_``-prefixed) submodule is imported when it is
    first asked for as an attribute. Nothing is imported by this call.

    Raises ReexportListError when a name is listed twice (two modules would claim it) or when
    these lists and the package's ``__all__`` (defined before this call; less the names the
    package binds itself) disagree, so that neither drifts from the other.
    """
    where: dict[str, str] = {}
    for module, names in exports.items():
        absolute = f"{package}{module}" if module.startswith(".") else module
        for name in names:
            if name in where:
                raise ReexportListError(
                    f"{package} re-exports {name!r} from both {where[name]} and {absolute}: "
                    "list it under one module"
                )
            where[name] = absolute
    modules = frozenset(submodules)
    namespace = vars(sys.modules[package])
    # Names the ``__init__`` binds itself (a version string, a function) are not re-exports;
    # a submodule may be public without being in ``__all__`` (``from pkg import *`` skips it).
    public = {name for name in namespace.get("__all__", ()) if name not in namespace}
    listed = set(where) | (modules & public)
    if public != listed:
        raise ReexportListError(
            f"{package}: __all__ and the lazy re-exports differ (only in __all__: "
            f"{sorted(public - listed)}; only re-exported: {sorted(listed - public)}): "
            "list each public name in both"
        )
    shadowed = frozenset(name for name, module in where.items() if module == f"{package}.{name}")
    if shadowed:
        namespace[_SHADOWED] = shadowed
        sys.modules[package].__class__ = _ReexportingPackage

    def __getattr__(name: str) -> Any:
        if name in modules:
            return importlib.import_module(f"{package}.{name}")
        module = where.get(name)
        if module is None:
            # A public submodule is an attribute on first use, as it was once an eager
            # ``__init__`` had imported it (``pyprovlib.testing._support`` after ``import
            # pyprovlib.testing``).
            if not name.startswith("_") and importlib.util.find_spec(f"{package}.{name}"):
                return importlib.import_module(f"{package}.{name}")
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value  # later lookups skip this hook
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(where) | modules)

    return __getattr__, __dir__

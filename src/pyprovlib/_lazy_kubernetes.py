"""Import kubernetes-asyncio's generated API and model packages on first use.

``kubernetes_asyncio.client`` (and its ``api`` and ``models`` subpackages) import every one of
the ~830 generated API and model modules up front: 38 MB of RSS and ~0.4 s of CPU in every
process that touches the client, although a storage controller uses a few dozen of them. That
import alone put a controller above the 75 MB the provisioner benchmark allows (issue #4).

Those three ``__init__`` files are pure re-export lists (``from <submodule> import Name``, plus
``__all__`` and a version string). :func:`install` puts a finder first on ``sys.meta_path`` that
loads exactly those three packages with a loader that reads the re-export list instead of
running it, and gives each package a module ``__getattr__`` (PEP 562) that imports a name's
submodule the first time the name is asked for. Everything else is unchanged: the names resolve
to the very same classes, ``__all__`` and ``from ... import *`` work (a star import loads all),
``ApiClient``'s ``getattr(kubernetes_asyncio.client.models, klass)`` deserialisation works, and
any other statement in one of those files (a future release changing their shape) makes the
loader run the file as usual.

It does nothing when ``kubernetes_asyncio.client`` is already imported, and is skipped when the
environment sets ``PYPROVLIB_EAGER_KUBERNETES_IMPORTS`` to a non-empty value.
``import pyprovlib`` installs it, before anything imports the client.
"""

from __future__ import annotations

import ast
import importlib
import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

__all__ = ["LAZY_PACKAGES", "install", "installed", "uninstall"]

#: The packages whose ``__init__`` is read as a list of lazy re-exports.
LAZY_PACKAGES = frozenset(
    {
        "kubernetes_asyncio.client",
        "kubernetes_asyncio.client.api",
        "kubernetes_asyncio.client.models",
    }
)

#: Set to a non-empty value to keep kubernetes-asyncio's eager imports.
EAGER_ENV = "PYPROVLIB_EAGER_KUBERNETES_IMPORTS"


class _Eager(Exception):
    """The ``__init__`` has a statement the lazy loader does not understand."""


def _parse_reexports(
    source: str, filename: str
) -> tuple[dict[str, tuple[str, str]], list[ast.stmt]]:
    """Split a package ``__init__`` into ``{name: (module, attribute)}`` and the other statements.

    Raises _Eager for anything but absolute ``from X import Y [as Z]`` lines, ``from __future__``,
    simple assignments and the docstring.
    """
    tree = ast.parse(source, filename)
    exports: dict[str, tuple[str, str]] = {}
    rest: list[ast.stmt] = []
    for stmt in tree.body:
        if isinstance(stmt, ast.ImportFrom):
            if stmt.module == "__future__":
                continue
            if stmt.level != 0 or stmt.module is None:
                raise _Eager(f"relative import at line {stmt.lineno}")
            for alias in stmt.names:
                if alias.name == "*":
                    raise _Eager(f"star import at line {stmt.lineno}")
                exports[alias.asname or alias.name] = (stmt.module, alias.name)
        elif isinstance(stmt, ast.Assign) and all(isinstance(t, ast.Name) for t in stmt.targets):
            rest.append(stmt)
        elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
            rest.append(stmt)  # the docstring
        else:
            raise _Eager(f"{type(stmt).__name__} at line {stmt.lineno}")
    return exports, rest


class _LazyPackageLoader(importlib.abc.Loader):
    """Loads one package ``__init__`` as lazy re-exports, or runs it as usual when it cannot."""

    def __init__(self, wrapped: importlib.abc.Loader, origin: str) -> None:
        self._wrapped = wrapped
        self._origin = origin

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None  # the default module object

    def exec_module(self, module: ModuleType) -> None:
        try:
            with open(self._origin, encoding="utf-8") as f:
                source = f.read()
            exports, rest = _parse_reexports(source, self._origin)
        except (OSError, SyntaxError, _Eager):
            self._wrapped.exec_module(module)
            return
        namespace = module.__dict__
        if rest:
            body = ast.Module(body=rest, type_ignores=[])
            exec(compile(body, self._origin, "exec"), namespace)  # noqa: S102 - the package's own assignments
        name = module.__name__

        def __getattr__(attr: str) -> Any:  # PEP 562 hook
            target = exports.get(attr)
            if target is None:
                raise AttributeError(f"module {name!r} has no attribute {attr!r}")
            value = getattr(importlib.import_module(target[0]), target[1])
            namespace[attr] = value  # later lookups skip this hook
            return value

        def __dir__() -> list[str]:  # PEP 562 hook
            return sorted(set(namespace) | set(exports))

        namespace["__getattr__"] = __getattr__
        namespace["__dir__"] = __dir__


class _LazyPackageFinder(importlib.abc.MetaPathFinder):
    """Finds :data:`LAZY_PACKAGES` with the other finders and swaps in the lazy loader."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in LAZY_PACKAGES:
            return None
        for finder in sys.meta_path:
            if finder is self or isinstance(finder, _LazyPackageFinder):
                continue
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec: importlib.machinery.ModuleSpec | None = find(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        origin = spec.origin
        if spec.loader is None or origin is None or not origin.endswith("__init__.py"):
            return spec
        spec.loader = _LazyPackageLoader(spec.loader, origin)
        return spec


_FINDER = _LazyPackageFinder()


def install() -> bool:
    """Make the kubernetes-asyncio client packages lazy; True when the finder is in place.

    A no-op (False) when ``kubernetes_asyncio.client`` is already imported or the
    ``PYPROVLIB_EAGER_KUBERNETES_IMPORTS`` environment variable is set; True when already
    installed.
    """
    if _FINDER in sys.meta_path:
        return True
    if os.environ.get(EAGER_ENV) or "kubernetes_asyncio.client" in sys.modules:
        return False
    sys.meta_path.insert(0, _FINDER)
    return True


def installed() -> bool:
    """Whether the lazy finder is on ``sys.meta_path``."""
    return _FINDER in sys.meta_path


def uninstall() -> None:
    """Remove the finder (packages already imported lazily stay lazy)."""
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)


install()

"""Import kubernetes-asyncio's generated API and model packages on first use — only when asked.

``kubernetes_asyncio.client`` (and its ``api`` and ``models`` subpackages) import every one of
the ~830 generated API and model modules up front: 38 MB of RSS and ~0.4 s of CPU in every
process that touches the client, although a storage controller uses a few dozen of them.

Those three ``__init__`` files are pure re-export lists (``from <submodule> import Name``, plus
``__all__`` and a version string). :func:`enable` loads exactly those three packages with a
loader that reads the re-export list instead of running it, and gives each package a module
``__getattr__`` (PEP 562) that imports a name's submodule the first time the name is asked for.
Everything else is unchanged: the names resolve to the very same classes, ``__all__`` and
``from ... import *`` work (a star import loads all), ``ApiClient``'s
``getattr(kubernetes_asyncio.client.models, klass)`` deserialisation works, and any other
statement in one of those files (a future release changing their shape) makes the loader run
the file as usual.

Importing this module (or ``pyprovlib``) changes nothing and reads nothing (no ``sys.argv``).
:func:`enable` is the one switch, public as ``pyprovlib.enable_lazy_kubernetes_imports()``:
each of pyprovlib's ``python -m`` entry points calls it first thing in its ``__main__``, and
an application opts in the same way, before anything imports ``kubernetes_asyncio``. The
finder it needs is on ``sys.meta_path`` only while :func:`enable` imports the three packages;
it is gone when the call returns. The environment variable
``PYPROVLIB_EAGER_KUBERNETES_IMPORTS`` (any non-empty value) turns it into a no-op.
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

from pyprovlib._errors import PyprovlibError

__all__ = ["EAGER_ENV", "LAZY_PACKAGES", "enable", "enabled"]

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


class _Eager(PyprovlibError):
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
        namespace[_MARK] = True


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
            if isinstance(finder, _LazyPackageFinder):
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


_MARK = "__pyprovlib_lazy_reexports__"
"""Set in a package's namespace by the lazy loader: how :func:`enabled` tells."""


def enabled() -> bool:
    """Whether ``kubernetes_asyncio.client`` was loaded lazily (by :func:`enable`)."""
    module = sys.modules.get("kubernetes_asyncio.client")
    return module is not None and bool(getattr(module, _MARK, False))


def enable() -> bool:
    """Make kubernetes-asyncio load its ~830 generated API and model modules on first use
    instead of all at once (about 38 MB of RSS and 0.4 s of start-up saved); True when on.

    Public as ``pyprovlib.enable_lazy_kubernetes_imports()``. Call it first thing in your
    process, before anything imports ``kubernetes_asyncio`` (``import pyprovlib`` alone does
    not import it before this call could run; the rest of pyprovlib does): once its client
    package is imported eagerly, this is a no-op returning False, as it is when the
    ``PYPROVLIB_EAGER_KUBERNETES_IMPORTS`` environment variable is set. Calling it again is
    harmless. The names, classes and (de)serialisation are kubernetes-asyncio's own,
    unchanged, and ``sys.meta_path`` is the same after the call as before. pyprovlib's own
    ``python -m`` entry points call it first thing in their ``__main__``.
    """
    if enabled():
        return True
    if os.environ.get(EAGER_ENV) or "kubernetes_asyncio.client" in sys.modules:
        return False
    finder = _LazyPackageFinder()
    sys.meta_path.insert(0, finder)
    try:
        # The packages themselves load now, under the finder; their submodules on first use.
        for name in sorted(LAZY_PACKAGES):
            importlib.import_module(name)
    finally:
        sys.meta_path.remove(finder)
    return enabled()

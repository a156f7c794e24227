"""pyprovlib._reexports: a package ``__init__``'s lazy re-exports (PEP 562) import nothing until
a name is used, give the same objects an eager ``from .module import name`` would, and refuse
lists that contradict the package's ``__all__``.

Each test builds a small package of its own in a temporary directory.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

from pyprovlib._reexports import ReexportListError

INIT = """
from pyprovlib._reexports import lazy_reexports

__all__ = {all!r}
__getattr__, __dir__ = lazy_reexports(__name__, {exports!r}, submodules={submodules!r})
"""


@pytest.fixture
def make_package(tmp_path: Path) -> Iterator[Callable[..., ModuleType]]:
    made: list[str] = []

    def make(
        name: str,
        exports: dict[str, list[str]],
        files: dict[str, str],
        *,
        submodules: tuple[str, ...] = (),
        public: list[str] | None = None,
    ) -> ModuleType:
        package = tmp_path / name
        package.mkdir()
        if public is None:
            public = [n for names in exports.values() for n in names] + list(submodules)
        init = INIT.format(all=public, exports=exports, submodules=list(submodules))
        (package / "__init__.py").write_text(init)
        for file, text in files.items():
            (package / f"{file}.py").write_text(textwrap.dedent(text))
        made.append(name)
        return importlib.import_module(name)

    sys.path.insert(0, str(tmp_path))
    try:
        yield make
    finally:
        sys.path.remove(str(tmp_path))
        for name in list(sys.modules):
            if any(name == m or name.startswith(m + ".") for m in made):
                del sys.modules[name]


def test_a_name_is_imported_on_first_use_and_cached(
    make_package: Callable[..., ModuleType],
) -> None:
    pkg = make_package(
        "reexp_a",
        {".thing": ["Thing"], "reexp_a.other": ["OTHER"]},
        {"thing": "class Thing:\n    pass\n", "other": "OTHER = 1\n"},
    )
    assert "reexp_a.thing" not in sys.modules
    assert sorted(set(dir(pkg)) & {"OTHER", "Thing"}) == ["OTHER", "Thing"]
    thing = pkg.Thing
    assert thing is sys.modules["reexp_a.thing"].Thing
    assert "Thing" in vars(pkg)  # cached: the hook is not asked again
    assert "reexp_a.other" not in sys.modules
    from reexp_a import OTHER  # type: ignore[import-not-found]

    assert OTHER == 1
    with pytest.raises(AttributeError, match="module 'reexp_a' has no attribute 'Nothing'"):
        _ = pkg.Nothing


def test_a_name_shared_with_its_submodule_stays_the_reexport(
    make_package: Callable[..., ModuleType],
) -> None:
    # `main` from `.main`: importing the submodule directly first binds the module to the
    # package's attribute; an eager `from .main import main` would leave the function there.
    pkg = make_package("reexp_b", {".main": ["main"]}, {"main": "def main():\n    return 7\n"})
    importlib.import_module("reexp_b.main")
    assert callable(pkg.main)
    assert pkg.main() == 7
    from reexp_b import main  # type: ignore[import-not-found]

    assert main is sys.modules["reexp_b.main"].main


def test_a_submodule_is_reexported_as_a_module(make_package: Callable[..., ModuleType]) -> None:
    pkg = make_package("reexp_c", {}, {"helpers": "X = 1\n"}, submodules=("helpers",))
    assert "reexp_c.helpers" not in sys.modules
    assert pkg.helpers is sys.modules["reexp_c.helpers"]
    # Public without being in __all__, as `from pkg import helpers` in an eager __init__.
    quiet = make_package("reexp_f", {}, {"tools": "Y = 1\n"}, submodules=("tools",), public=[])
    assert quiet.tools.Y == 1


def test_a_name_listed_twice_is_refused(make_package: Callable[..., ModuleType]) -> None:
    with pytest.raises(ReexportListError, match=r"'X' from both reexp_d\.a and reexp_d\.b"):
        make_package(
            "reexp_d",
            {".a": ["X"], ".b": ["X"]},
            {"a": "X = 1\n", "b": "X = 2\n"},
            public=["X"],
        )


def test_all_and_the_lists_must_agree(make_package: Callable[..., ModuleType]) -> None:
    with pytest.raises(
        ReexportListError, match=r"only in __all__: \['Y'\]; only re-exported: \['X'\]"
    ):
        make_package("reexp_e", {".a": ["X"]}, {"a": "X = 1\n"}, public=["Y"])


def test_any_public_submodule_is_an_attribute_on_first_use(
    make_package: Callable[..., ModuleType],
) -> None:
    # An eager __init__ bound the submodules it imported (``testing.support`` after ``import
    # pyprovlib.testing``); the lazy one imports a public submodule when it is asked for.
    pkg = make_package("reexp_g", {}, {"support": "Z = 3\n", "_private": "P = 1\n"}, public=[])
    assert "reexp_g.support" not in sys.modules
    assert pkg.support.Z == 3
    assert pkg.support is sys.modules["reexp_g.support"]
    with pytest.raises(AttributeError, match="has no attribute '_private'"):
        _ = pkg._private
    with pytest.raises(AttributeError, match="has no attribute 'missing'"):
        _ = pkg.missing


def test_the_testing_package_imports_nothing_until_a_name_is_used() -> None:
    code = (
        "import pyprovlib.testing as t, sys; "
        "assert 'pyprovlib.testing._server' not in sys.modules; "
        "print(t.ApiServer.__name__, 'pyprovlib.testing._server' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=60
    )
    assert out.stdout.split() == ["ApiServer", "True"]

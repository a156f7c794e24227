"""The public API fits on a page, and it is listed in one place (issue 29).

What a user may import is what the public packages list in ``__all__``; the packages are named
below and in docs/reference/index.md, and nothing else is public: every other module has a
``_`` in its path (the deprecated old paths of :mod:`pyprovlib._moved` aside, which list
nothing). The test fails when a module becomes public without being added here, when a public
package re-exports with ``import *`` (which publishes whatever the module defines), when a
private name appears in a public ``__all__``, when one object is listed by two packages, or
when the total grows past the budget. (That every listed name has a docstring is checked by
tests/docs/test_docs_build.py, which reads them as mkdocstrings does.)
"""

from __future__ import annotations

import ast
import importlib
import pathlib

from pyprovlib._moved import MOVED

SRC = pathlib.Path(__file__).resolve().parents[2] / "src"
REFERENCE_INDEX = SRC.parent / "docs" / "reference" / "index.md"

PUBLIC_PACKAGES = [
    "pyprovlib",
    "pyprovlib.controller",
    "pyprovlib.kube",
    "pyprovlib.runtime",
    "pyprovlib.csi",
    "pyprovlib.csi.messages",
    "pyprovlib.csi.provisioner",
    "pyprovlib.csi.attacher",
    "pyprovlib.csi.resizer",
    "pyprovlib.testing",
    "pyprovlib.examples",
    "pyprovlib.examples.hostpath",
    "pyprovlib.examples.nfs",
    "pyprovlib.examples.rbd",
    "pyprovlib.examples.csi_hostpath",
]
"""Every public module: the user contract, five packages of building blocks, the CSI spec's
messages, the runnable sidecars and examples (whose ``__main__`` is their interface)."""

BUDGET = 300
"""The public names, all packages together (the CSI messages included), stay under this."""


def _module_files() -> dict[str, pathlib.Path]:
    found = {}
    for path in sorted((SRC / "pyprovlib").rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _is_public(name: str) -> bool:
    parts = name.split(".")
    return parts[-1] != "__main__" and not any(p.startswith("_") for p in parts)


def _exports() -> dict[str, list[str]]:
    return {name: list(importlib.import_module(name).__all__) for name in PUBLIC_PACKAGES}


def test_the_public_modules_are_the_listed_ones() -> None:
    public = {name for name in _module_files() if _is_public(name)} - set(MOVED)
    assert public == set(PUBLIC_PACKAGES), (
        "a module without `_` in its path is public API: make it private (`_name`) and export "
        "what users need from its package, or add it to PUBLIC_PACKAGES and docs/reference"
    )


def test_the_reference_index_names_every_public_package() -> None:
    index = REFERENCE_INDEX.read_text(encoding="utf-8")
    missing = [name for name in PUBLIC_PACKAGES if f"`{name}`" not in index]
    assert not missing, f"docs/reference/index.md does not list {missing}"


def test_no_public_package_star_imports() -> None:
    files = _module_files()
    for name in PUBLIC_PACKAGES:
        tree = ast.parse(files[name].read_text(encoding="utf-8"))
        stars = [
            node.module
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names)
        ]
        assert not stars, f"{name} re-exports everything of {stars}: list the names"


def test_public_lists_hold_no_private_names() -> None:
    for name, exported in _exports().items():
        private = [n for n in exported if n.startswith("_") and n != "__version__"]
        assert not private, f"{name}.__all__ lists private names {private}"


def test_each_object_is_listed_by_one_package() -> None:
    seen: dict[int, str] = {}
    for package, exported in _exports().items():
        module = importlib.import_module(package)
        for name in exported:
            value = getattr(module, name)
            if isinstance(value, (str, int, float, frozenset, tuple)) or value is None:
                continue  # constants: equal values are not one object listed twice
            where = f"{package}.{name}"
            assert id(value) not in seen, f"{where} is also listed as {seen[id(value)]}"
            seen[id(value)] = where


def test_the_public_surface_is_under_budget() -> None:
    total = sum(len(names) for names in _exports().values())
    assert total < BUDGET, f"{total} public names; the budget is {BUDGET}"


def test_a_private_module_listed_as_public_fails() -> None:
    """The check above would see a new public module (it is not a tautology)."""
    assert not _is_public("pyprovlib.kube._informer")
    assert not _is_public("pyprovlib.controller._provision.claims")
    assert _is_public("pyprovlib.kube.informer")
    assert not _is_public("pyprovlib.csi.__main__")

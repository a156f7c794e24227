"""No function in ``src/`` is longer than a screen (issue 29): a longer one is split into named
steps. Declarative tables — the flag definitions, one ``add_argument`` after another — are the
exception, listed here by name.

Lengths are read from the source with :mod:`ast` (``end_lineno - lineno + 1`` of each function
or method, decorators not counted), so nothing is imported. The generated CSI bindings
(``csi/_proto``) are not ours to shape.
"""

from __future__ import annotations

import ast
import pathlib
from collections.abc import Iterator

SRC = pathlib.Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "pyprovlib"
GENERATED = PACKAGE / "csi" / "_proto"
MAX_LINES = 100

# Declarative tables of flags (module path relative to src/pyprovlib, qualified name).
ALLOWED: frozenset[tuple[str, str]] = frozenset(
    {
        ("runtime/_flags.py", "common_parser"),
        ("csi/provisioner/_options.py", "build_parser"),
        ("examples/hostpath/_cli.py", "build_parser"),
        ("examples/csi_hostpath/_cli.py", "build_parser"),
    }
)


def function_lengths(source: str) -> Iterator[tuple[str, int]]:
    """(qualified name, lines) of every function and method in ``source``, nested ones too."""

    def walk(node: ast.AST, prefix: str) -> Iterator[tuple[str, int]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                assert child.end_lineno is not None
                yield name, child.end_lineno - child.lineno + 1
                yield from walk(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")
            else:
                yield from walk(child, prefix)

    yield from walk(ast.parse(source), "")


def measured() -> Iterator[tuple[str, str, int]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.is_relative_to(GENERATED):
            continue
        module = path.relative_to(PACKAGE).as_posix()
        for name, lines in function_lengths(path.read_text(encoding="utf-8")):
            yield module, name, lines


def test_no_function_is_longer_than_a_screen() -> None:
    too_long = [
        f"src/pyprovlib/{module}: {name} has {lines} lines"
        for module, name, lines in measured()
        if lines > MAX_LINES and (module, name) not in ALLOWED
    ]
    assert not too_long, (
        f"functions over {MAX_LINES} lines; split each into named steps (a declarative table "
        "of flags may be added to ALLOWED instead):\n" + "\n".join(too_long)
    )


def test_the_allow_list_names_existing_functions() -> None:
    found = {(module, name) for module, name, _ in measured()}
    stale = sorted(ALLOWED - found)
    assert not stale, f"ALLOWED names functions that no longer exist; remove them: {stale}"


def test_lengths_are_measured_for_methods_and_nested_functions() -> None:
    body = "\n".join(f"        x{i} = {i}" for i in range(MAX_LINES))
    source = (
        "class C:\n"
        "    @property\n"
        "    def short(self):\n"
        "        return 1\n"
        "    async def long(self):\n"
        f"{body}\n"
        "        def inner():\n"
        "            pass\n"
    )
    lengths = dict(function_lengths(source))
    assert lengths == {"C.short": 2, "C.long": MAX_LINES + 3, "C.long.inner": 2}

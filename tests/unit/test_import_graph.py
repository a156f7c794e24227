"""The shape of the package's import graph (issue 20): layers point one way, nothing cycles.

The graph is read from the source with :mod:`ast` (module-level imports and imports inside
functions alike; ``if TYPE_CHECKING:`` blocks are skipped, they never run), so the test needs
nothing imported and sees every module under ``src/pyprovlib``.

Layers, lowest first: ``kube`` (the API machinery) and the dependency-free helpers
(``errors``, ``redaction``, ``_logging``); the user contracts (``provisioner``, ``attacher``,
``resizer``); ``controller``; ``runtime`` (process wiring: flags, logging set-up, HTTP
endpoints); ``csi`` (its sidecars are processes built on ``runtime``). ``examples`` and
``testing`` sit on top, then the package's own ``__init__``; above everything, each entry
point's ``__main__`` (a script: it calls ``pyprovlib.enable_lazy_kubernetes_imports()`` first).
A module may import its own layer and the ones below it, never one above.
"""

from __future__ import annotations

import ast
import pathlib
from collections.abc import Iterator

import pytest

SRC = pathlib.Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "pyprovlib"

# Lower number = lower layer. A module's layer is that of its first matching prefix.
LAYERS: list[tuple[str, int]] = [
    ("pyprovlib._errors", 0),
    ("pyprovlib._redaction", 0),
    ("pyprovlib._logging", 0),
    ("pyprovlib._version", 0),
    ("pyprovlib._lazy_kubernetes", 0),
    ("pyprovlib._reexports", 0),
    ("pyprovlib._moved", 0),
    ("pyprovlib.kube", 1),
    ("pyprovlib._provisioner", 2),
    ("pyprovlib._attacher", 2),
    ("pyprovlib._resizer", 2),
    ("pyprovlib._modifier", 2),
    ("pyprovlib.controller", 3),
    ("pyprovlib.runtime", 4),
    ("pyprovlib.csi", 5),
    ("pyprovlib.examples", 6),
    ("pyprovlib.testing", 6),
    ("pyprovlib", 7),  # the package's own __init__ (lazy re-exports of everything)
]
MAIN_LAYER = 8  # an entry point's __main__: a script, which imports what it runs


# Import cycles tolerated for now (none left: the last two went with issue 20); the test fails
# when a new one appears, or when a listed one is fixed and still listed.
KNOWN_CYCLES: set[frozenset[str]] = set()


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, module: str, is_package: bool) -> Iterator[str]:
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                if not is_package:
                    base = base[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            yield target
            for alias in node.names:
                yield f"{target}.{alias.name}"  # `from pkg import submodule`
        stack.extend(ast.iter_child_nodes(node))


def _graph() -> dict[str, set[str]]:
    files = {
        _module_name(p): p
        for p in PACKAGE.rglob("*.py")
        if "_proto" not in p.relative_to(SRC).parts
    }
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        is_package = path.name == "__init__.py"
        targets = set()
        for imported in _imports(tree, name, is_package):
            # A package's __init__ re-exporting its own submodules is the package itself.
            own = is_package and imported.startswith(name + ".")
            if imported in files and imported != name and not own:
                targets.add(imported)
        graph[name] = targets
    return graph


def _layer(module: str) -> int:
    if module.endswith(".__main__"):
        return MAIN_LAYER
    for prefix, layer in LAYERS:
        if module == prefix or module.startswith(prefix + "."):
            return layer
    raise AssertionError(f"{module} is in no layer: add it to LAYERS")


def _cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[frozenset[str]] = []
    counter = 0

    def visit(node: str) -> None:
        nonlocal counter
        index[node] = low[node] = counter
        counter += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.add(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


GRAPH = _graph()


def test_layers_point_down() -> None:
    wrong = []
    for module, targets in sorted(GRAPH.items()):
        for target in sorted(targets):
            if _layer(target) > _layer(module):
                wrong.append(f"{module} ({_layer(module)}) imports {target} ({_layer(target)})")
    assert not wrong, "imports pointing up the layers:\n" + "\n".join(wrong)


def test_no_import_cycles() -> None:
    cycles = set(_cycles(GRAPH))
    new = cycles - KNOWN_CYCLES
    fixed = KNOWN_CYCLES - cycles
    assert not new, "import cycles:\n" + "\n".join(" <-> ".join(sorted(c)) for c in new)
    assert not fixed, "fixed cycles still listed in KNOWN_CYCLES: " + repr(fixed)


@pytest.mark.parametrize(
    ("importer", "imported"),
    [
        ("pyprovlib.controller._provision", "pyprovlib.runtime._logging"),
        ("pyprovlib.kube._informer", "pyprovlib.controller._provision"),
    ],
)
def test_the_layer_check_sees_an_upward_import(importer: str, imported: str) -> None:
    assert _layer(imported) > _layer(importer)


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset("abc")]

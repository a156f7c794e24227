"""mkdocs hook: API reference blocks for modules a page does not list yet.

A reference page lists its modules in reading order with ``::: module`` blocks and ends with
``<!-- modules: pyprovlib.kube -->``. The hook replaces that marker with a ``::: module`` block
for every public module of the package (found in ``src/``) that the page does not already
render, so a module added to the code appears in the reference without anyone editing the
docs; ``<!-- modules: pyprovlib, top level only -->`` leaves out the subpackages.

Public modules are the ``.py`` files with no path component starting with ``_``
(``__init__.py`` stands for its package, rendered without members, which it only
re-exports); ``__main__`` stubs are left out.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

SRC = Path(__file__).resolve().parents[2] / "src"
_MARKER = re.compile(r"^<!-- modules: (?P<package>[\w.]+)(?P<shallow>, top level only)? -->$", re.M)
_BLOCK = re.compile(r"^:::\s+(?P<name>\S+)", re.M)


def public_modules(package: str, *, shallow: bool = False) -> list[tuple[str, bool]]:
    """``(dotted name, is_package)`` of every public module in ``package`` (with ``shallow``,
    only the package itself and its own modules, not its subpackages), sorted."""
    root = SRC.joinpath(*package.split("."))
    found = []
    for path in sorted(root.glob("*.py") if shallow else root.rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        if parts[-1] == "__main__" or any(p.startswith("_") for p in parts):
            continue
        found.append((".".join(parts), is_package))
    return sorted(found)


def _blocks(package: str, shallow: bool, listed: set[str]) -> str:
    out = []
    for name, is_package in public_modules(package, shallow=shallow):
        if name in listed:
            continue
        out.append(f"::: {name}")
        if is_package:
            out += ["    options:", "      members: false"]
        out.append("")
    return "\n".join(out)


def on_page_markdown(markdown: str, **_: Any) -> str:
    """Expand the modules markers of one page."""
    listed = {m["name"] for m in _BLOCK.finditer(markdown)}
    return _MARKER.sub(lambda m: _blocks(m["package"], bool(m["shallow"]), listed), markdown)

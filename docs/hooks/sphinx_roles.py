"""mkdocs hook: turn the Sphinx roles of the project's docstrings into links.

The docstrings use Sphinx cross-reference roles (``:class:`ProvisioningError```,
``:meth:`~pyprovlib.controller._provision.ProvisionController.run```). mkdocstrings renders
docstrings as Markdown, where such a role arrives as the literal text ``:class:`` before a code
span. This hook replaces each one with an optional autorefs cross-reference, resolved by
mkdocs-autorefs after every page is rendered: a dotted target is used as it is, a bare name is
looked up from the documented object outward (a method named in its class's docstring), then
qualified when exactly one object rendered on the same page ends with it; and ``~`` shows only
the last component, as Sphinx does. Targets that resolve nowhere render as plain code.
"""

from __future__ import annotations

import bisect
import html
import re
from typing import Any

_ROLE = re.compile(
    r":(?:py:)?(?:class|func|meth|attr|data|mod|exc|obj|const|type)\:"
    r"<code>(?P<tilde>~?)(?P<target>[A-Za-z_][A-Za-z0-9_.]*)(?P<call>\(\))?</code>"
)
_ANCHOR = re.compile(r'\bid="(?P<id>[A-Za-z_][A-Za-z0-9_.]*)"')


def _qualify(target: str, ids: set[str], scope: str) -> str:
    """The anchor ``target`` most likely means, seen from inside the object ``scope``."""
    if target in ids:
        return target
    parts = scope.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end]) + "." + target
        if candidate in ids:
            return candidate
    matches = [i for i in ids if i.endswith("." + target)]
    return matches[0] if len(matches) == 1 else target


def on_page_content(html_text: str, **_: Any) -> str:
    """Rewrite the roles of one rendered page."""
    if ":<code>" not in html_text:
        return html_text
    anchors = [(m.start(), m["id"]) for m in _ANCHOR.finditer(html_text)]
    positions = [position for position, _ in anchors]
    ids = {anchor for _, anchor in anchors}

    def replace(match: re.Match[str]) -> str:
        target = match["target"]
        shown = target.rsplit(".", 1)[-1] if match["tilde"] else target
        shown += match["call"] or ""
        # The docstring belongs to the object whose heading precedes it.
        index = bisect.bisect_right(positions, match.start()) - 1
        scope = anchors[index][1] if index >= 0 else ""
        identifier = html.escape(_qualify(target, ids, scope), quote=True)
        return f'<autoref identifier="{identifier}" optional><code>{shown}</code></autoref>'

    return _ROLE.sub(replace, html_text)

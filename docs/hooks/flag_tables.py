"""mkdocs hook: flag tables generated from the entry points' own ``--help``.

A page writes ``<!-- flags: python -m pyprovlib.csi.attacher -->`` on a line of its own; the hook
replaces it with one table per argparse group (flag, default, environment variable, meaning),
read from ``python -m pyprovlib.csi.attacher --help`` run with the interpreter building the
docs. ``<!-- flags: common -->`` does the same for :func:`pyprovlib.runtime.common_parser`.
The tables therefore always match the code; an entry point whose ``--help`` fails fails the
build.
"""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from typing import Any

from mkdocs.exceptions import PluginError

_MARKER = re.compile(r"^<!-- flags: (?P<what>.+?) -->$", re.M)
_GROUP = re.compile(r"^(?P<title>\S.*):$")
_OPTION = re.compile(r"^  (?P<invocation>-\S.*?)(?:\s{2,}(?P<help>\S.*))?$")
_SUFFIX = re.compile(r"^(?P<text>.*?)\s*\(default: (?P<default>.*?)(?:; env: (?P<env>[^)]*))?\)$")
_WIDTH = "10000"  # one line per help text


def _help_text(what: str) -> str:
    env = {**os.environ, "COLUMNS": _WIDTH, "NO_COLOR": "1"}
    if what == "common":
        code = (
            "from pyprovlib.runtime import common_parser;"
            "common_parser('ENTRYPOINT', 'the common flags').print_help()"
        )
        argv = [sys.executable, "-c", code]
    elif what.startswith("python -m "):
        argv = [sys.executable, "-m", what.removeprefix("python -m ").strip(), "--help"]
    else:
        raise PluginError(f"flag_tables: unknown marker {what!r}")
    result = subprocess.run(  # noqa: S603 - our own interpreter, fixed arguments
        argv, capture_output=True, text=True, env=env, timeout=120, check=False
    )
    if result.returncode != 0:
        raise PluginError(f"flag_tables: `{what} --help` failed:\n{result.stderr[-2000:]}")
    return result.stdout


def _cell(text: str, *, code: bool = False) -> str:
    # HTML, not Markdown: a pipe inside a backtick code span would split the table cell.
    escaped = html.escape(text.strip(), quote=False).replace("|", "&#124;")
    if not escaped:
        return " "
    return f"<code>{escaped}</code>" if code else escaped


def _tables(help_text: str) -> str:
    groups: list[tuple[str, list[tuple[str, str]]]] = []
    current: list[tuple[str, str]] | None = None
    for line in help_text.splitlines():
        group = _GROUP.match(line)
        if group:
            current = []
            groups.append((group["title"], current))
            continue
        option = _OPTION.match(line)
        if option and current is not None:
            current.append((option["invocation"], option["help"] or ""))
        elif current and line.startswith("    ") and line.strip():
            invocation, text = current[-1]
            current[-1] = (invocation, f"{text} {line.strip()}".strip())
    out: list[str] = []
    for title, options in groups:
        # -h/--help and --version need no table row.
        rows = [(inv, text) for inv, text in options if not inv.startswith(("-h", "--version"))]
        if not rows:
            continue
        out += [f"**{title[0].upper()}{title[1:]}**", ""]
        out += ["| Flag | Default | Environment | Meaning |", "| --- | --- | --- | --- |"]
        for invocation, text in rows:
            suffix = _SUFFIX.match(text)
            meaning, default, env = text, "", ""
            if suffix:
                meaning, default, env = suffix["text"], suffix["default"], suffix["env"] or ""
            env_cell = ", ".join(_cell(name, code=True) for name in env.split(",") if name.strip())
            out.append(
                f"| {_cell(invocation, code=True)} | {_cell(default)} | {env_cell or ' '} "
                f"| {_cell(meaning)} |"
            )
        out.append("")
    return "\n".join(out)


def on_page_markdown(markdown: str, **_: Any) -> str:
    """Replace every flags marker of one page with its tables."""
    return _MARKER.sub(lambda m: _tables(_help_text(m["what"])), markdown)

"""The documentation builds and covers the public API.

- ``mkdocs build --strict`` succeeds (broken links, missing pages, unresolvable ``:::``
  references and docstring warnings all fail it) — skipped when the docs extra is not installed;
- every public module is importable as documented (a package, found by mkdocstrings) and is
  rendered in ``docs/reference/`` (a ``::: module`` block, or a ``<!-- modules: package -->``
  marker that docs/hooks/reference_pages.py expands);
- every name in ``pyprovlib.__all__`` and in each public module's ``__all__`` has a docstring
  (attribute docstrings included, which is why this reads the source with griffe, as
  mkdocstrings does, rather than ``__doc__``).

Public modules are the ``.py`` files under ``src/pyprovlib`` with no path component starting
with ``_`` (``__init__.py`` stands for its package); ``__main__`` stubs and the deprecated old
paths of :mod:`pyprovlib._moved` are exempt.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from module_support import load_file

from pyprovlib._moved import MOVED

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
PACKAGE = SRC / "pyprovlib"
REFERENCE = ROOT / "docs" / "reference"


def _have(*modules: str) -> bool:
    return all(importlib.util.find_spec(m) is not None for m in modules)


def public_modules() -> list[str]:
    """Dotted names of the public modules, from the source tree."""
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts[-1] == "__main__" or any(p.startswith("_") for p in parts):
            continue
        if ".".join(parts) in MOVED:
            continue  # a deprecated old path: it forwards, and lists nothing
        names.append(".".join(parts))
    return names


def referenced_modules() -> set[str]:
    """Objects rendered in docs/reference/: ``::: name`` blocks, and the public modules of the
    packages named by ``<!-- modules: package -->`` markers (expanded by
    docs/hooks/reference_pages.py when the site is built)."""
    hook = _load_hook("reference_pages")
    found: set[str] = set()
    for page in REFERENCE.glob("*.md"):
        text = page.read_text(encoding="utf-8")
        found.update(re.findall(r"^:::\s+(\S+)", text, re.M))
        for package, shallow in re.findall(
            r"^<!-- modules: ([\w.]+)(, top level only)? -->$", text, re.M
        ):
            found.update(name for name, _ in hook.public_modules(package, shallow=bool(shallow)))
    return found


def _load_hook(name: str) -> Any:
    return load_file(name, ROOT / "docs" / "hooks" / f"{name}.py")


@pytest.mark.skipif(
    not _have("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python"),
    reason="the docs extra (mkdocs-material, mkdocstrings[python]) is not installed",
)
@pytest.mark.heavy
def test_mkdocs_build_strict(tmp_path: Path) -> None:
    # Run from the repository root: pymdownx.snippets resolves included files from there.
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    problems = [
        line for line in result.stderr.splitlines() if line.startswith(("WARNING", "ERROR"))
    ]
    assert result.returncode == 0, "mkdocs build --strict failed:\n" + (
        "\n".join(problems) or result.stderr[-4000:]
    )
    assert (tmp_path / "index.html").is_file()


def test_every_public_module_is_in_the_reference() -> None:
    missing = sorted(set(public_modules()) - referenced_modules())
    assert not missing, f"add a '::: module' block to a page in docs/reference/ for: {missing}"


@pytest.mark.skipif(not _have("griffe"), reason="griffe (from mkdocstrings[python]) is missing")
def test_public_modules_are_packages_griffe_finds() -> None:
    """mkdocstrings cannot document a module of a directory without ``__init__.py``."""
    package = _load_package()
    unfound = []
    for name in public_modules():
        try:
            _module(package, name)
        except KeyError:
            unfound.append(name)
    assert not unfound, f"not found by griffe (missing __init__.py in a package?): {unfound}"


@pytest.mark.skipif(not _have("griffe"), reason="griffe (from mkdocstrings[python]) is missing")
def test_every_exported_name_has_a_docstring() -> None:
    import griffe

    package = _load_package()
    undocumented = []
    for name in public_modules():
        try:
            module = _module(package, name)
        except KeyError:
            continue  # reported by test_public_modules_are_packages_griffe_finds
        if not _docstring(module):
            undocumented.append(f"{name} (module docstring)")
        for export in module.exports or ():
            if not isinstance(export, str):
                # `__all__ += sub.__all__` that griffe did not expand: it expands exports only
                # below packages that have an `__all__` themselves.
                undocumented.append(f"{name}: {export} not expanded (give its parents __all__)")
                continue
            member = module.members.get(str(export))
            if member is None:
                undocumented.append(f"{name}.{export} (in __all__ but not defined)")
                continue
            if member.is_alias and not str(member.target_path).startswith("pyprovlib"):
                continue  # a re-exported third-party name, documented upstream
            if member.is_alias and str(member.target_path).startswith("pyprovlib.csi._proto."):
                continue  # generated from the CSI spec (pyprovlib.csi.messages): its comments
            try:
                target = member.final_target if member.is_alias else member
            except (griffe.AliasResolutionError, griffe.CyclicAliasError):
                undocumented.append(f"{name}.{export} (cannot resolve {member.target_path})")
                continue
            if not _docstring(target):
                undocumented.append(f"{name}.{export}")
    assert not undocumented, "public names without a docstring:\n" + "\n".join(undocumented)


def _load_package() -> Any:
    import griffe

    return griffe.load(
        "pyprovlib", search_paths=[str(SRC)], resolve_aliases=True, resolve_external=False
    )


def _docstring(obj: Any) -> bool:
    return obj.docstring is not None and bool(obj.docstring.value.strip())


def _module(package: Any, name: str) -> Any:
    return package if name == "pyprovlib" else package[name.removeprefix("pyprovlib.")]

"""mkdocs.yml links to no repository that does not exist: the project has no public home, so
the site's header carries no repository link at all (a placeholder host is a dead link on
every page)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_no_placeholder_repository_link() -> None:
    # mkdocs.yml may hold !!python/name tags (pymdownx): read it as plain text lines.
    keys = {
        line.split(":", 1)[0]: line.split(":", 1)[1].strip()
        for line in (ROOT / "mkdocs.yml").read_text().splitlines()
        if line and not line[0].isspace() and ":" in line
    }
    assert "repo_url" not in keys, keys.get("repo_url")
    assert "edit_uri" not in keys
    assert "example.invalid" not in (ROOT / "mkdocs.yml").read_text()

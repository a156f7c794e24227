"""What a release carries besides the code: the Apache-2.0 LICENSE at the root and in the wheel,
the package metadata ``pip show`` prints (license, project URLs, a classifier for every Python
the suite runs on), a CHANGELOG in Keep a Changelog's shape, and the documentation's
``site_url`` agreeing with the metadata's Documentation URL."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
KEEP_A_CHANGELOG_SECTIONS = {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}


def mkdocs_key(key: str) -> str | None:
    # mkdocs.yml may hold !!python/name tags (pymdownx): read top-level keys as plain text.
    for line in (ROOT / "mkdocs.yml").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return line.split(":", 1)[1].strip()
    return None


def test_the_license_file_is_apache_2_and_packaged() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License")
    assert "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert PROJECT["license"] == "Apache-2.0"
    assert "LICENSE" in PROJECT["license-files"]


def test_project_urls_name_the_docs_source_issues_and_changelog() -> None:
    urls = PROJECT["urls"]
    assert {"Homepage", "Documentation", "Source", "Issues", "Changelog"} <= urls.keys()
    assert all(url.startswith("https://") for url in urls.values()), urls
    assert urls["Changelog"].endswith("/CHANGELOG.md")
    assert urls["Issues"].startswith(urls["Source"])
    # The site says where it is published; the metadata points there.
    assert mkdocs_key("site_url") == urls["Documentation"]


def test_a_classifier_for_this_python_and_none_below_requires_python() -> None:
    versions = [
        c.rsplit(" :: ", 1)[1]
        for c in PROJECT["classifiers"]
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    ]
    running = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert running in versions, f"add the classifier 'Programming Language :: Python :: {running}'"
    lowest = PROJECT["requires-python"].removeprefix(">=")
    assert lowest in versions
    minor = int(lowest.split(".")[1])
    assert all(int(v.split(".")[1]) >= minor for v in versions), versions


def test_the_changelog_keeps_a_changelog() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    assert text.startswith("# Changelog\n")
    assert "https://keepachangelog.com/en/1.1.0/" in text
    releases = re.findall(r"^## \[([^\]]+)\]", text, flags=re.MULTILINE)
    assert releases
    assert releases[0] == "Unreleased"
    sections = set(re.findall(r"^### (.+)$", text, flags=re.MULTILINE))
    assert sections <= KEEP_A_CHANGELOG_SECTIONS, sections - KEEP_A_CHANGELOG_SECTIONS


@pytest.mark.heavy
def test_the_wheel_carries_the_license_and_the_metadata(tmp_path: Path) -> None:
    """Built as a user's ``pip install`` builds it (hatchling, from the checkout)."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("pyprovlib-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (license_path,) = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
        assert archive.read(license_path).decode() == (ROOT / "LICENSE").read_text()
        (metadata_path,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        metadata = archive.read(metadata_path).decode()
    assert "License-Expression: Apache-2.0" in metadata
    for label, url in PROJECT["urls"].items():
        assert f"Project-URL: {label}, {url}" in metadata

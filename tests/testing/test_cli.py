"""``python -m pyprovlib.testing`` (and ``pyprovlib-apiserver``) as a user meets it: it names
itself as it was called, has ``--version``, and a busy port or a kubeconfig it cannot write or
read ends in one line naming the flag and the fix, not a traceback (issue 30)."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pyprovlib import __version__, testing

MODULE = [sys.executable, "-m", "pyprovlib.testing"]
SCRIPT = Path(sys.executable).parent / "pyprovlib-apiserver"


def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=60, check=False, env=testing.child_env()
    )


def one_line_error(result: subprocess.CompletedProcess[str], prog: str, status: int = 1) -> str:
    assert result.returncode == status, result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"{prog}: error: ")
    assert "Traceback" not in result.stderr
    return lines[0]


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield int(listener.getsockname()[1])


def test_version_names_the_module() -> None:
    result = run([*MODULE, "--version"])
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"python -m pyprovlib.testing (pyprovlib {__version__})"


def test_the_installed_command_names_itself() -> None:
    if not SCRIPT.is_file():
        pytest.skip(f"pyprovlib-apiserver is not installed beside {sys.executable}")
    result = run([str(SCRIPT), "--help"])
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: pyprovlib-apiserver ")
    assert "python -m" not in result.stdout
    version = run([str(SCRIPT), "--version"])
    assert version.stdout.strip() == f"pyprovlib-apiserver (pyprovlib {__version__})"


def test_a_busy_port_is_one_line(busy_port: int, tmp_path: Path) -> None:
    result = run([*MODULE, "--port", str(busy_port), "--kubeconfig", str(tmp_path / "kc")])
    line = one_line_error(result, "python -m pyprovlib.testing")
    assert f"cannot listen on 127.0.0.1:{busy_port}: address already in use" in line
    assert "pick another --port, or leave it out to get a free one" in line
    assert not (tmp_path / "kc").exists()


def test_a_busy_port_names_the_installed_command(busy_port: int) -> None:
    if not SCRIPT.is_file():
        pytest.skip(f"pyprovlib-apiserver is not installed beside {sys.executable}")
    one_line_error(run([str(SCRIPT), "--port", str(busy_port)]), "pyprovlib-apiserver")


def test_a_kubeconfig_that_cannot_be_written_is_one_line(tmp_path: Path) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("")
    target = a_file / "kubeconfig"  # below a regular file: no directory can be made there
    line = one_line_error(
        run([*MODULE, "--kubeconfig", str(target)]), "python -m pyprovlib.testing"
    )
    assert f"cannot write --kubeconfig {target}: " in line
    assert line.endswith("name a file in a directory this process can write to")


def test_binder_only_with_a_file_that_is_not_a_kubeconfig_is_one_line(tmp_path: Path) -> None:
    hostname = tmp_path / "hostname"
    hostname.write_text("my-host\n")
    line = one_line_error(
        run([*MODULE, "--binder-only", "--kubeconfig", str(hostname)]),
        "python -m pyprovlib.testing",
    )
    assert f"--kubeconfig {hostname}: not a kubeconfig" in line
    missing = one_line_error(
        run([*MODULE, "--binder-only", "--kubeconfig", str(tmp_path / "nope")]),
        "python -m pyprovlib.testing",
    )
    assert f"--kubeconfig {tmp_path / 'nope'}: file not found" in missing
    without = one_line_error(
        run([*MODULE, "--binder-only"]), "python -m pyprovlib.testing", status=2
    )
    assert without.endswith("--binder-only needs --kubeconfig naming the API server")


@pytest.mark.parametrize(("flag", "value"), [("--port", "99999"), ("--nodes", "-1")])
def test_out_of_range_numbers_are_usage_errors(flag: str, value: str) -> None:
    result = run([*MODULE, flag, value])
    assert result.returncode == 2
    assert f"argument {flag}: invalid" in result.stderr
    assert "Traceback" not in result.stderr

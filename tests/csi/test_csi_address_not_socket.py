"""A ``--csi-address`` naming a regular file (or a directory) can never become the driver's
socket: each sidecar exits at start-up with one error line saying so, instead of waiting
forever "for the CSI socket"."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "http://127.0.0.1:9"}}]
users: [{name: u, user: {}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
"""


def run_sidecar(module: str, address: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)  # never contacted: the check comes first
    return subprocess.run(
        [
            sys.executable,
            "-m",
            module,
            f"--kubeconfig={kubeconfig}",
            f"--csi-address={address}",
            "--log-format=json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    "module", ["pyprovlib.csi.provisioner", "pyprovlib.csi.attacher", "pyprovlib.csi.resizer"]
)
def test_a_regular_file_is_refused_in_one_line(module: str, tmp_path: Path) -> None:
    path = tmp_path / "csi.sock"
    path.write_text("")
    result = run_sidecar(module, f"unix://{path}", tmp_path)
    assert result.returncode == 1, result.stderr
    errors = [
        json.loads(line)
        for line in result.stderr.splitlines()
        if line.startswith("{") and json.loads(line)["level"] == "error"
    ]
    assert [e["event"] for e in errors] == [
        f"--csi-address unix://{path}: {path} is a regular file, not a unix socket; point "
        "--csi-address at the socket the CSI driver listens on (or remove the file so the "
        "driver can create it)"
    ]
    assert "Traceback" not in result.stderr
    assert "waiting for the CSI socket" not in result.stderr


def test_a_directory_is_refused_too(tmp_path: Path) -> None:
    result = run_sidecar("pyprovlib.csi.attacher", str(tmp_path), tmp_path)
    assert result.returncode == 1
    assert f"{tmp_path} is a directory, not a unix socket" in result.stderr

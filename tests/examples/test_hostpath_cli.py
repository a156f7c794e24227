"""The hostpath entry point: ``--help``, usage errors, the ``--demo`` (the README's first
command) as a subprocess, and the real process against the in-memory API server through a
kubeconfig, stopped with SIGTERM."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import pytest
from kubernetes_asyncio.client import (
    CoreV1Api,
    StorageV1Api,
    V1Node,
    V1ObjectMeta,
    V1PersistentVolumeClaim,
    V1PersistentVolumeClaimSpec,
    V1StorageClass,
    V1VolumeResourceRequirements,
)

from pyprovlib.examples.hostpath.cli import build_parser, main
from pyprovlib.testing.binder import set_selected_node
from pyprovlib.testing.server import ApiServer

# The subprocesses must not inherit settings from the developer's environment.
_CLEAN_ENV = {
    k: v
    for k, v in os.environ.items()
    if not k.startswith("PYPROVLIB_") and k not in ("NODE_NAME", "PROVISIONER_NAME")
}


async def run_module(*args: str, timeout: float = 60) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**_CLEAN_ENV, "COLUMNS": "120"},
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def option_flags() -> list[str]:
    flags = []
    for action in build_parser()._actions:
        flags.extend(s for s in action.option_strings if s.startswith("--"))
    return flags


async def test_help_documents_every_flag() -> None:
    code, out, _ = await run_module("-m", "pyprovlib.examples.hostpath", "--help")
    assert code == 0
    for flag in option_flags():
        assert flag in out, flag
    for flag in (
        "--provisioner-name",
        "--mode",
        "--node-name",
        "--helper-image",
        "--helper-timeout",
        "--dir-mode",
        "--demo",
        "--kubeconfig",
        "--leader-election",
    ):
        assert flag in option_flags()
    # Every flag but --help/--version states its default.
    parser = build_parser()
    for action in parser._actions:
        if action.option_strings and action.dest not in ("help", "version"):
            assert "default:" in (action.help or ""), action.option_strings
    flat = " ".join(out.split())
    for text in (
        "default: pyprovlib.io/hostpath",
        "default: busybox:1.36",
        "default: 0777",
        "default: 2m0s",
        "default: node",
        "NODE_NAME",
    ):
        assert text in flat, text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "--mode=node needs --node-name"),
        (["--node-name", "n1", "--leader-election"], "turn --leader-election off"),
        (["--mode", "sideways"], "must be one of node, helper-pod"),
        (["--mode", "helper-pod", "--dir-mode", "999"], "not an octal mode"),
        (["--mode", "helper-pod", "--provisioner-name", ""], "must not be empty"),
    ],
)
def test_usage_errors(
    argv: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    monkeypatch.delenv("PYPROVLIB_NODE_NAME", raising=False)
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


async def test_demo_binds_three_claims() -> None:
    code, out, err = await run_module("-m", "pyprovlib.examples.hostpath", "--demo")
    assert code == 0, out + err
    bound = [line for line in out.splitlines() if "-> Bound" in line]
    assert len(bound) == 3, out
    for line in bound:
        assert "directory /" in line
        assert "created, mode 0777" in line
    assert "all 3 claims Bound" in out
    # Then one claim is deleted: its PV goes and its directory with it.
    assert "deleted claim demo/data-0" in out
    assert any(
        ": deleted; directory /" in line and line.endswith(" removed") for line in out.splitlines()
    )
    assert "claim demo/data-0: Pending" in out
    # Human-readable: no JSON log lines anywhere.
    for line in (out + err).splitlines():
        assert not line.lstrip().startswith("{"), line


async def test_demo_needs_no_test_dependencies() -> None:
    script = (
        "import sys\n"
        "from pyprovlib.examples.hostpath.cli import main\n"
        "rc = main(['--demo'])\n"
        "test_only = ('pytest', 'hypothesis', 'pytest_asyncio')\n"
        "leaked = sorted(m for m in test_only if m in sys.modules)\n"
        "print('LEAKED', leaked)\n"
        "sys.exit(rc)\n"
    )
    code, out, err = await run_module("-c", script)
    assert code == 0, out + err
    assert "LEAKED []" in out


async def test_entry_point_runs_the_controller(tmp_path: Path) -> None:
    """`python -m pyprovlib.examples.hostpath --mode=node` against the in-memory server: a
    claim gets Bound, then SIGTERM stops the process with exit code 0."""
    base = tmp_path / "disk"
    base.mkdir()
    async with ApiServer(binder=True) as server, server.api_client() as client:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        core = CoreV1Api(client)
        await core.create_node(
            V1Node(metadata=V1ObjectMeta(name="n1", labels={"kubernetes.io/hostname": "n1"}))
        )
        await StorageV1Api(client).create_storage_class(
            V1StorageClass(
                metadata=V1ObjectMeta(name="local"),
                provisioner="example.com/local",
                parameters={"basePath": str(base)},
                volume_binding_mode="WaitForFirstConsumer",
            )
        )
        await core.create_namespaced_persistent_volume_claim(
            "default",
            V1PersistentVolumeClaim(
                metadata=V1ObjectMeta(name="data"),
                spec=V1PersistentVolumeClaimSpec(
                    storage_class_name="local",
                    access_modes=["ReadWriteOnce"],
                    resources=V1VolumeResourceRequirements(requests={"storage": "1Gi"}),
                ),
            ),
        )
        await set_selected_node(client, "default", "data", "n1")
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "pyprovlib.examples.hostpath",
            "--kubeconfig",
            str(kubeconfig),
            "--provisioner-name",
            "example.com/local",
            "--log-format",
            "json",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**_CLEAN_ENV, "NODE_NAME": "n1"},
        )
        try:
            for _ in range(600):
                pvc = await core.read_namespaced_persistent_volume_claim("data", "default")
                if pvc.status.phase == "Bound" or proc.returncode is not None:
                    break
                await asyncio.sleep(0.05)
            assert pvc.status.phase == "Bound"
            assert (base / pvc.spec.volume_name).is_dir()
            proc.send_signal(signal.SIGTERM)
            _, err = await asyncio.wait_for(proc.communicate(), 30)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert proc.returncode == 0, err.decode()
    # Production logs are JSON lines.
    first = next(line for line in err.decode().splitlines() if line.strip())
    assert json.loads(first)["event"]


async def test_demo_reports_failure_with_nonzero_exit() -> None:
    # No time to bind anything: the demo must say so and exit 1, not pretend success.
    script = (
        "import asyncio, sys\n"
        "from pyprovlib.examples.hostpath.demo import run_demo\n"
        "sys.exit(asyncio.run(run_demo(wait_seconds=0)))\n"
    )
    code, out, err = await run_module("-c", script)
    assert code == 1, out + err
    assert "FAILED: not every claim was Bound within 0s" in out

"""The hostpath entry point: ``--help``, usage errors, the ``--demo`` (the README's first
command) as a subprocess, and the real process against the in-memory API server through a
kubeconfig, stopped with SIGTERM."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from example_support import (
    UsageError,
    claim_model,
    example_process,
    help_documents_every_flag,
    run_module,
    stops_on_sigterm,
    wait_claim_bound,
)
from kubernetes_asyncio.client import CoreV1Api, StorageV1Api, V1Node, V1ObjectMeta, V1StorageClass

from pyprovlib.examples.hostpath._cli import build_parser, main
from pyprovlib.testing._binder import set_selected_node
from pyprovlib.testing._server import ApiServer


async def test_help_documents_every_flag() -> None:
    parser = build_parser()
    flat = await help_documents_every_flag("hostpath", parser)
    flags = {flag for action in parser._actions for flag in action.option_strings}
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
        assert flag in flags, flag
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
def test_usage_errors(argv: list[str], message: str, usage_error: UsageError) -> None:
    assert message in usage_error(main, argv)


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
        "from pyprovlib.examples.hostpath._cli import main\n"
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
            "default", claim_model("data", "local", "1Gi")
        )
        await set_selected_node(client, "default", "data", "n1")
        async with example_process(
            "hostpath", kubeconfig, "--provisioner-name", "example.com/local", NODE_NAME="n1"
        ) as proc:
            pvc = await wait_claim_bound(core, "data", by=proc)
            assert (base / pvc.spec.volume_name).is_dir()
            await stops_on_sigterm(proc)
    # Production logs are JSON lines.
    first = next(line for line in proc.raw if line.strip())
    assert json.loads(first)["event"]


async def test_demo_reports_failure_with_nonzero_exit() -> None:
    # No time to bind anything: the demo must say so and exit 1, not pretend success.
    script = (
        "import asyncio, sys\n"
        "from pyprovlib.examples.hostpath._demo import run_demo\n"
        "sys.exit(asyncio.run(run_demo(wait_seconds=0)))\n"
    )
    code, out, err = await run_module("-c", script)
    assert code == 1, out + err
    assert "FAILED: not every claim was Bound within 0s" in out

"""The RBD entry point: ``--help``, usage errors (a missing ``rbd`` is one clear error at
start-up), and the real process against the in-memory API server through a kubeconfig and a
real Ceph: claim → Bound → image, claim deleted → image removed, SIGTERM → exit 0, and the key
nowhere in its debug logs."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path
from typing import Any

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
from kubernetes_asyncio.client import (
    CoreV1Api,
    StorageV1Api,
    V1ObjectMeta,
    V1Secret,
    V1StorageClass,
)
from kubernetes_asyncio.client.exceptions import ApiException

from pyprovlib import testing
from pyprovlib.examples.rbd._cli import build_parser, main
from pyprovlib.testing._server import ApiServer


async def test_help_documents_every_flag() -> None:
    parser = build_parser()
    flat = await help_documents_every_flag("rbd", parser)
    for text in ("default: pyprovlib.io/rbd", "--rbd-binary", "--rbd-timeout", "default: 10s"):
        assert text in flat, text
    assert parser.parse_args([]).leader_election is True


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rbd-binary", "/nonexistent/rbd"], "'/nonexistent/rbd' is not found in PATH"),
        (["--rbd-binary", "no-such-rbd-program"], "install ceph-common"),
        (["--rbd-timeout", "0s"], "--rbd-timeout must be positive"),
        (["--provisioner-name", ""], "--provisioner-name must not be empty"),
    ],
)
def test_usage_errors(argv: list[str], message: str, usage_error: UsageError) -> None:
    assert message in usage_error(main, argv)


async def test_missing_rbd_fails_once_at_start_up(tmp_path: Path) -> None:
    # PATH without rbd: the process exits at once with one clear message, no retry loop.
    code, _, text = await run_module(
        "-m", "pyprovlib.examples.rbd", "--kubeconfig", str(tmp_path / "unused"), PATH=str(tmp_path)
    )
    assert code == 2
    assert text.count("the rbd program 'rbd' is not found in PATH") == 1
    assert "install ceph-common" in text


@pytest.mark.ceph
async def test_entry_point_runs_the_controller(tmp_path: Path, ceph: Any) -> None:
    key = ceph.admin_key
    async with ApiServer(binder=True) as server, server.api_client() as client:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        core = CoreV1Api(client)
        for name in ("ceph-admin", "ceph-user"):
            await core.create_namespaced_secret(
                "default",
                V1Secret(
                    metadata=V1ObjectMeta(name=name),
                    type="kubernetes.io/rbd",
                    data={"key": base64.b64encode(key.encode()).decode()},
                ),
            )
        await StorageV1Api(client).create_storage_class(
            V1StorageClass(
                metadata=V1ObjectMeta(name="rbd"),
                provisioner="pyprovlib.io/rbd",
                reclaim_policy="Delete",
                parameters={
                    "monitors": ceph.monitors,
                    "adminSecretName": "ceph-admin",
                    "userSecretName": "ceph-user",
                    "imageFeatures": "layering",
                },
            )
        )
        await core.create_namespaced_persistent_volume_claim(
            "default", claim_model("block", "rbd", "8Mi")
        )
        async with example_process(
            "rbd",
            kubeconfig,
            "--leader-election-namespace",
            "default",
            "--log-level",
            "debug",
            "--rbd-timeout",
            "10s",
            stdout=asyncio.subprocess.PIPE,
        ) as proc:
            pvc = await wait_claim_bound(core, "block", by=proc)
            pv = await core.read_persistent_volume(pvc.spec.volume_name)
            image = pv.spec.rbd.image
            assert pv.spec.capacity == {"storage": "8Mi"}
            assert ceph.rbd_json("info", "--pool", "rbd", "--image", image)["size"] == 8 << 20
            assert server.storage.get("leases", "default", "pyprovlib.io-rbd") is not None

            await core.delete_namespaced_persistent_volume_claim("block", "default")

            async def pv_gone() -> bool:
                try:
                    await core.read_persistent_volume(pv.metadata.name)
                except ApiException as err:
                    if err.status == 404:
                        return True
                    raise
                return False

            await testing.eventually(pv_gone, message=f"PV {pv.metadata.name} deleted")
            assert image not in ceph.rbd("ls", "--pool", "rbd").split()
            await stops_on_sigterm(proc)
            assert proc.proc.stdout is not None
            out = await proc.proc.stdout.read()
    logs = out.decode() + "\n".join(proc.raw)
    assert '"running rbd"' in logs  # debug logging was on
    assert key not in logs
    assert base64.b64encode(key.encode()).decode() not in logs

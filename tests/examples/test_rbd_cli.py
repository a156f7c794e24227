"""The RBD entry point: ``--help``, usage errors (a missing ``rbd`` is one clear error at
start-up), and the real process against the in-memory API server through a kubeconfig and a
real Ceph: claim → Bound → image, claim deleted → image removed, SIGTERM → exit 0, and the key
nowhere in its debug logs."""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio.client import (
    CoreV1Api,
    StorageV1Api,
    V1ObjectMeta,
    V1PersistentVolumeClaim,
    V1PersistentVolumeClaimSpec,
    V1Secret,
    V1StorageClass,
    V1VolumeResourceRequirements,
)
from kubernetes_asyncio.client.exceptions import ApiException

from pyprovlib.examples.rbd.cli import build_parser, main
from pyprovlib.testing.server import ApiServer

_CLEAN_ENV = {
    k: v
    for k, v in os.environ.items()
    if not k.startswith(("PYPROVLIB_", "CEPH_")) and k != "PROVISIONER_NAME"
}


async def test_help_documents_every_flag() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "pyprovlib.examples.rbd",
        "--help",
        stdout=asyncio.subprocess.PIPE,
        env={**_CLEAN_ENV, "COLUMNS": "120"},
    )
    out_bytes, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0
    out = out_bytes.decode()
    parser = build_parser()
    for action in parser._actions:
        for flag in action.option_strings:
            if flag.startswith("--"):
                assert flag in out, flag
        if action.option_strings and action.dest not in ("help", "version"):
            assert "default:" in (action.help or ""), action.option_strings
    flat = " ".join(out.split())
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
def test_usage_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


async def test_missing_rbd_fails_once_at_start_up(tmp_path: Path) -> None:
    # PATH without rbd: the process exits at once with one clear message, no retry loop.
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "pyprovlib.examples.rbd",
        "--kubeconfig",
        str(tmp_path / "unused"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**_CLEAN_ENV, "PATH": str(tmp_path)},
    )
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2
    text = err.decode()
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
            "default",
            V1PersistentVolumeClaim(
                metadata=V1ObjectMeta(name="block"),
                spec=V1PersistentVolumeClaimSpec(
                    storage_class_name="rbd",
                    access_modes=["ReadWriteOnce"],
                    resources=V1VolumeResourceRequirements(requests={"storage": "8Mi"}),
                ),
            ),
        )
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "pyprovlib.examples.rbd",
            "--kubeconfig",
            str(kubeconfig),
            "--leader-election-namespace",
            "default",
            "--log-format",
            "json",
            "--log-level",
            "debug",
            "--rbd-timeout",
            "10s",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=_CLEAN_ENV,
        )
        try:
            for _ in range(600):
                pvc = await core.read_namespaced_persistent_volume_claim("block", "default")
                if pvc.status.phase == "Bound" or proc.returncode is not None:
                    break
                await asyncio.sleep(0.05)
            assert pvc.status.phase == "Bound"
            pv = await core.read_persistent_volume(pvc.spec.volume_name)
            image = pv.spec.rbd.image
            assert pv.spec.capacity == {"storage": "8Mi"}
            assert ceph.rbd_json("info", "--pool", "rbd", "--image", image)["size"] == 8 << 20
            assert server.storage.get("leases", "default", "pyprovlib.io-rbd") is not None

            await core.delete_namespaced_persistent_volume_claim("block", "default")
            for _ in range(600):
                try:
                    await core.read_persistent_volume(pv.metadata.name)
                except ApiException as err:
                    if err.status == 404:
                        break
                    raise
                await asyncio.sleep(0.05)
            assert image not in ceph.rbd("ls", "--pool", "rbd").split()
            proc.send_signal(signal.SIGTERM)
            out, err = await asyncio.wait_for(proc.communicate(), 30)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert proc.returncode == 0, err.decode()
    logs = out.decode() + err.decode()
    assert '"running rbd"' in logs  # debug logging was on
    assert key not in logs
    assert base64.b64encode(key.encode()).decode() not in logs

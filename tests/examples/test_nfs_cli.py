"""The NFS entry point: ``--help``, usage errors, and the real process against the in-memory
API server through a kubeconfig (configured the upstream way, NFS_SERVER / NFS_PATH in the
environment), stopped with SIGTERM."""

from __future__ import annotations

from pathlib import Path

import pytest
from example_support import (
    UsageError,
    claim_model,
    example_process,
    help_documents_every_flag,
    stops_on_sigterm,
    wait_claim_bound,
)
from kubernetes_asyncio.client import CoreV1Api, StorageV1Api, V1ObjectMeta, V1StorageClass

from pyprovlib.examples.nfs._cli import build_parser, main
from pyprovlib.testing._server import ApiServer


async def test_help_documents_every_flag() -> None:
    parser = build_parser()
    flat = await help_documents_every_flag("nfs", parser)
    for text in (
        "--nfs-server",
        "--nfs-path",
        "--nfs-mount-path",
        "default: pyprovlib.io/nfs",
        "default: /persistentvolumes",
        "NFS_SERVER",
        "NFS_PATH",
        "run only while holding a coordination.k8s.io Lease",
    ):
        assert text in flat, text
    # One Deployment for the cluster: leader election is on by default.
    assert parser.parse_args([]).leader_election is True


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "--nfs-server (or NFS_SERVER) is required"),
        (["--nfs-server", "s"], "--nfs-path (or NFS_PATH) is required"),
        (["--nfs-server", "s", "--nfs-path", "srv"], "must be an absolute path"),
        (["--nfs-server", "s", "--nfs-path", "/srv/../etc"], "must not contain '..'"),
        (["--nfs-server", "s", "--nfs-path", "/srv", "--nfs-mount-path", "/"], "root directory"),
    ],
)
def test_usage_errors(argv: list[str], message: str, usage_error: UsageError) -> None:
    assert message in usage_error(main, argv)


async def test_entry_point_runs_the_controller(tmp_path: Path) -> None:
    export = tmp_path / "export"
    export.mkdir()
    async with ApiServer(binder=True) as server, server.api_client() as client:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        core = CoreV1Api(client)
        await StorageV1Api(client).create_storage_class(
            V1StorageClass(
                metadata=V1ObjectMeta(name="nfs"),
                provisioner="pyprovlib.io/nfs",
                mount_options=["nfsvers=4.1"],
            )
        )
        await core.create_namespaced_persistent_volume_claim(
            "default", claim_model("shared", "nfs", "10Gi", ["ReadWriteMany"])
        )
        async with example_process(
            "nfs",
            kubeconfig,
            "--nfs-mount-path",
            str(export),
            "--leader-election-namespace",
            "default",
            NFS_SERVER="10.0.0.5",
            NFS_PATH="/export",
        ) as proc:
            pvc = await wait_claim_bound(core, "shared", by=proc)
            pv = await core.read_persistent_volume(pvc.spec.volume_name)
            subdir = f"default-shared-{pv.metadata.name}"
            assert pv.spec.nfs.server == "10.0.0.5"
            assert pv.spec.nfs.path == f"/export/{subdir}"
            assert pv.spec.mount_options == ["nfsvers=4.1"]
            assert (export / subdir).is_dir()
            # Leader election is on by default: the process held a Lease to do this.
            lease = server.storage.get("leases", "default", "pyprovlib.io-nfs")
            assert lease is not None
            await stops_on_sigterm(proc)

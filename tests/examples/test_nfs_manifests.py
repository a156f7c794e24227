"""The manifests in examples/nfs/: they parse, use only flags the entry point has, grant exactly
the RBAC the provisioner needs, and the StorageClass and claim they ship provision through the
real controller against the in-memory API server."""

from __future__ import annotations

from pathlib import Path

from example_support import running, wait_claim_bound
from kubernetes_asyncio.client import CoreV1Api, StorageV1Api, V1ObjectMeta, V1StorageClass
from manifest_support import (
    LEADER_ELECTION_RULE,
    PROVISIONER_RULES,
    Manifests,
    parse_container_args,
)

from pyprovlib.examples.nfs import NFSProvisioner
from pyprovlib.examples.nfs._cli import build_parser
from pyprovlib.examples.nfs._provisioner import parse_parameters
from pyprovlib.testing._server import ApiServer

NFS = Manifests("nfs")


def test_least_privilege_rbac() -> None:
    assert NFS.rules("ClusterRole", "pyprovlib-nfs") == PROVISIONER_RULES
    assert NFS.rules("Role", "pyprovlib-nfs-leader-election") == {LEADER_ELECTION_RULE}
    NFS.assert_no_wildcard_or_privilege()


def test_deployment_wiring() -> None:
    (deployment,) = NFS.by_kind("Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    args = parse_container_args(c, "pyprovlib.examples.nfs", build_parser())
    assert args.leader_election is True
    env = {e["name"]: e.get("value") for e in c["env"]}
    (volume,) = pod["volumes"]
    # The PVs point at the same export the provisioner mounts.
    assert volume["nfs"] == {"server": env["NFS_SERVER"], "path": env["NFS_PATH"]}
    (mount,) = c["volumeMounts"]
    assert mount["mountPath"] == args.nfs_mount_path


async def test_shipped_class_and_claim_provision(tmp_path: Path) -> None:
    (sc,) = NFS.by_kind("StorageClass")
    parse_parameters(
        V1StorageClass(
            metadata=V1ObjectMeta(name="x"), provisioner="p", parameters=sc["parameters"]
        )
    )
    claim = NFS.claim()
    async with ApiServer(binder=True) as server, server.api_client() as client:
        await StorageV1Api(client).create_storage_class(sc)
        core = CoreV1Api(client)
        await core.create_namespaced_persistent_volume_claim("default", claim)
        provisioner = NFSProvisioner(
            client, "nfs.example.internal", "/exports/kubernetes", str(tmp_path)
        )
        async with running(client, sc["provisioner"], provisioner):
            pvc = await wait_claim_bound(core, claim["metadata"]["name"])
            pv = await core.read_persistent_volume(pvc.spec.volume_name)
            assert pv.spec.nfs.path == "/exports/kubernetes/default/nfs-demo"
            assert pv.spec.mount_options == ["nfsvers=4.1"]
            assert (tmp_path / "default" / "nfs-demo").is_dir()

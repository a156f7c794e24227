"""The manifests in examples/nfs/: they parse, use only flags the entry point has, grant exactly
the RBAC the provisioner needs, and the StorageClass and claim they ship provision through the
real controller against the in-memory API server."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio.client import CoreV1Api, StorageV1Api, V1ObjectMeta, V1StorageClass

from pyprovlib.controller.options import ProvisionControllerOptions
from pyprovlib.controller.provision import ProvisionController
from pyprovlib.examples.nfs import NFSProvisioner, parse_parameters
from pyprovlib.examples.nfs.cli import build_parser
from pyprovlib.testing.server import ApiServer

ROOT = Path(__file__).resolve().parents[2] / "examples" / "nfs"


def docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((ROOT / name).read_text()) if d]


def by_kind(kind: str) -> list[dict[str, Any]]:
    return [d for p in sorted(ROOT.glob("*.yaml")) for d in docs(p.name) if d["kind"] == kind]


def rules(kind: str, name: str) -> set[tuple[str, str, frozenset[str]]]:
    (role,) = [d for d in by_kind(kind) if d["metadata"]["name"] == name]
    return {
        (group, resource, frozenset(rule["verbs"]))
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }


def test_readme_and_manifests_exist() -> None:
    assert sorted(p.name for p in ROOT.iterdir()) == [
        "README.md",
        "claim-and-pod.yaml",
        "deployment.yaml",
        "namespace.yaml",
        "rbac.yaml",
        "storageclass.yaml",
    ]


def test_least_privilege_rbac() -> None:
    assert rules("ClusterRole", "pyprovlib-nfs") == {
        (
            "",
            "persistentvolumes",
            frozenset({"get", "list", "watch", "create", "delete", "patch", "update"}),
        ),
        ("", "persistentvolumeclaims", frozenset({"get", "list", "watch", "update", "patch"})),
        ("storage.k8s.io", "storageclasses", frozenset({"get", "list", "watch"})),
        ("", "events", frozenset({"create", "patch", "update"})),
    }
    assert rules("Role", "pyprovlib-nfs-leader-election") == {
        ("coordination.k8s.io", "leases", frozenset({"get", "create", "update"})),
    }
    text = "".join(p.read_text() for p in ROOT.glob("*.yaml"))
    assert '"*"' not in text
    assert "privileged: true" not in text


def test_deployment_wiring() -> None:
    (deployment,) = by_kind("Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["command"] == ["python", "-m", "pyprovlib.examples.nfs"]
    known = {s for a in build_parser()._actions for s in a.option_strings}
    for arg in c["args"]:
        assert arg.split("=", 1)[0] in known, arg
    args = build_parser().parse_args(c["args"])
    assert args.leader_election is True
    env = {e["name"]: e.get("value") for e in c["env"]}
    (volume,) = pod["volumes"]
    # The PVs point at the same export the provisioner mounts.
    assert volume["nfs"] == {"server": env["NFS_SERVER"], "path": env["NFS_PATH"]}
    (mount,) = c["volumeMounts"]
    assert mount["mountPath"] == args.nfs_mount_path


async def test_shipped_class_and_claim_provision(tmp_path: Path) -> None:
    (sc,) = by_kind("StorageClass")
    parse_parameters(
        V1StorageClass(
            metadata=V1ObjectMeta(name="x"), provisioner="p", parameters=sc["parameters"]
        )
    )
    claim = next(d for d in docs("claim-and-pod.yaml") if d["kind"] == "PersistentVolumeClaim")
    async with ApiServer(binder=True) as server, server.api_client() as client:
        await StorageV1Api(client).create_storage_class(sc)
        core = CoreV1Api(client)
        await core.create_namespaced_persistent_volume_claim("default", claim)
        controller = ProvisionController(
            client,
            sc["provisioner"],
            NFSProvisioner(client, "nfs.example.internal", "/exports/kubernetes", str(tmp_path)),
            ProvisionControllerOptions(leader_election=False),
        )
        task = asyncio.create_task(controller.run())
        try:
            for _ in range(600):
                pvc = await core.read_namespaced_persistent_volume_claim(
                    claim["metadata"]["name"], "default"
                )
                if pvc.status.phase == "Bound":
                    break
                await asyncio.sleep(0.05)
            assert pvc.status.phase == "Bound"
            pv = await core.read_persistent_volume(pvc.spec.volume_name)
            assert pv.spec.nfs.path == "/exports/kubernetes/default/nfs-demo"
            assert pv.spec.mount_options == ["nfsvers=4.1"]
            assert (tmp_path / "default" / "nfs-demo").is_dir()
        finally:
            controller.stop()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(task, 15)

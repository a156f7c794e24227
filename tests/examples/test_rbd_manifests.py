"""The manifests in examples/rbd/: they parse, use only flags the entry point has, grant exactly
the RBAC the provisioner needs, and the shipped Secrets, StorageClass and claim provision through
the real controller against the in-memory API server and the real Ceph (monitors and pool
pointed at the test cluster)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio.client import CoreV1Api, StorageV1Api, V1ObjectMeta, V1StorageClass

from pyprovlib.controller.options import ProvisionControllerOptions
from pyprovlib.controller.provision import ProvisionController
from pyprovlib.examples.rbd import RBDProvisioner, RbdRunner, parse_parameters
from pyprovlib.examples.rbd.cli import build_parser
from pyprovlib.testing.server import ApiServer

ROOT = Path(__file__).resolve().parents[2] / "examples" / "rbd"


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
        "secret.yaml",
        "storageclass.yaml",
    ]


def test_least_privilege_rbac() -> None:
    assert rules("ClusterRole", "pyprovlib-rbd") == {
        (
            "",
            "persistentvolumes",
            frozenset({"get", "list", "watch", "create", "delete", "patch", "update"}),
        ),
        ("", "persistentvolumeclaims", frozenset({"get", "list", "watch", "update", "patch"})),
        ("storage.k8s.io", "storageclasses", frozenset({"get", "list", "watch"})),
        ("", "secrets", frozenset({"get"})),
        ("", "events", frozenset({"create", "patch", "update"})),
    }
    assert rules("Role", "pyprovlib-rbd-leader-election") == {
        ("coordination.k8s.io", "leases", frozenset({"get", "create", "update"})),
    }
    text = "".join(p.read_text() for p in ROOT.glob("*.yaml"))
    assert '"*"' not in text
    assert "privileged: true" not in text


def test_deployment_wiring() -> None:
    (deployment,) = by_kind("Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["command"] == ["python", "-m", "pyprovlib.examples.rbd"]
    known = {s for a in build_parser()._actions for s in a.option_strings}
    for arg in c["args"]:
        assert arg.split("=", 1)[0] in known, arg
    args = build_parser().parse_args(c["args"])
    assert args.leader_election is True
    assert args.rbd_timeout == 10
    # A read-only root filesystem: the temporary keyfiles need a writable /tmp.
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert [m["mountPath"] for m in c["volumeMounts"]] == ["/tmp"]


def test_secret_templates() -> None:
    secrets = by_kind("Secret")
    assert {s["metadata"]["name"] for s in secrets} == {"ceph-admin-secret", "ceph-user-secret"}
    for s in secrets:
        assert s["type"] == "kubernetes.io/rbd"
        assert list(s["stringData"]) == ["key"]
        assert s["stringData"]["key"].startswith("REPLACE-WITH-")
    (sc,) = by_kind("StorageClass")
    p = sc["parameters"]
    admin = next(s for s in secrets if s["metadata"]["name"] == p["adminSecretName"])
    assert admin["metadata"]["namespace"] == p["adminSecretNamespace"]
    claim = next(d for d in docs("claim-and-pod.yaml") if d["kind"] == "PersistentVolumeClaim")
    user = next(s for s in secrets if s["metadata"]["name"] == p["userSecretName"])
    assert user["metadata"]["namespace"] == claim["metadata"]["namespace"]


@pytest.mark.ceph
async def test_shipped_class_and_claim_provision(ceph: Any) -> None:
    (sc,) = by_kind("StorageClass")
    parse_parameters(
        V1StorageClass(
            metadata=V1ObjectMeta(name="x"), provisioner="p", parameters=sc["parameters"]
        )
    )
    # Point the class at the test cluster; everything else as shipped.
    sc["parameters"].update(monitors=ceph.monitors, pool="rbd", userId="admin")
    claim = next(d for d in docs("claim-and-pod.yaml") if d["kind"] == "PersistentVolumeClaim")
    async with ApiServer(binder=True) as server, server.api_client() as client:
        core = CoreV1Api(client)
        await core.create_namespace({"metadata": {"name": "pyprovlib-system"}})
        for secret in by_kind("Secret"):
            del secret["stringData"]
            secret["data"] = {"key": base64.b64encode(ceph.admin_key.encode()).decode()}
            await core.create_namespaced_secret(secret["metadata"]["namespace"], secret)
        await StorageV1Api(client).create_storage_class(sc)
        await core.create_namespaced_persistent_volume_claim("default", claim)
        controller = ProvisionController(
            client,
            sc["provisioner"],
            RBDProvisioner(client, RbdRunner(timeout=10)),
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
            assert pv.spec.capacity == {"storage": "1024Mi"}
            assert pv.spec.rbd.user == "admin"
            assert pv.spec.rbd.fs_type == "ext4"
            assert (pv.spec.rbd.secret_ref.name, pv.spec.rbd.secret_ref.namespace) == (
                "ceph-user-secret",
                "default",
            )
            info = ceph.rbd_json("info", "--pool", "rbd", "--image", pv.spec.rbd.image)
            assert (info["size"], info["features"]) == (1 << 30, ["layering"])
            await core.delete_namespaced_persistent_volume_claim(
                claim["metadata"]["name"], "default"
            )
            for _ in range(600):
                if pv.spec.rbd.image not in ceph.rbd("ls", "--pool", "rbd").split():
                    break
                await asyncio.sleep(0.05)
            assert pv.spec.rbd.image not in ceph.rbd("ls", "--pool", "rbd").split()
        finally:
            controller.stop()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(task, 15)

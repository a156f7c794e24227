"""The manifests in examples/hostpath/: they parse, use only flags the entry point has, grant
exactly the RBAC the provisioner needs, and the StorageClass and claim they ship provision
through the real controller against the in-memory API server."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio.client import (
    ApiClient,
    CoreV1Api,
    StorageV1Api,
    V1Node,
    V1ObjectMeta,
    V1StorageClass,
)

from pyprovlib.controller.options import ProvisionControllerOptions
from pyprovlib.controller.provision import ProvisionController
from pyprovlib.examples.hostpath import NodeHostPathProvisioner, parse_parameters
from pyprovlib.examples.hostpath.cli import build_parser
from pyprovlib.testing.binder import set_selected_node
from pyprovlib.testing.server import ApiServer

ROOT = Path(__file__).resolve().parents[2] / "examples" / "hostpath"


def docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((ROOT / name).read_text()) if d]


def all_docs() -> list[dict[str, Any]]:
    return [d for p in sorted(ROOT.glob("*.yaml")) for d in docs(p.name)]


def by_kind(kind: str) -> list[dict[str, Any]]:
    return [d for d in all_docs() if d["kind"] == kind]


def rules(kind: str, name: str) -> set[tuple[str, str, frozenset[str]]]:
    (role,) = [d for d in by_kind(kind) if d["metadata"]["name"] == name]
    out = set()
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.add((group, resource, frozenset(rule["verbs"])))
    return out


def container(kind: str) -> dict[str, Any]:
    (workload,) = by_kind(kind)
    (c,) = workload["spec"]["template"]["spec"]["containers"]
    return c


def test_readme_and_manifests_exist() -> None:
    names = sorted(p.name for p in ROOT.iterdir())
    assert names == [
        "README.md",
        "claim-and-pod.yaml",
        "daemonset.yaml",
        "deployment-helper-pod.yaml",
        "namespace.yaml",
        "rbac.yaml",
        "storageclass.yaml",
    ]


def test_least_privilege_rbac() -> None:
    assert rules("ClusterRole", "pyprovlib-hostpath") == {
        (
            "",
            "persistentvolumes",
            frozenset({"get", "list", "watch", "create", "delete", "patch", "update"}),
        ),
        ("", "persistentvolumeclaims", frozenset({"get", "list", "watch", "update", "patch"})),
        ("storage.k8s.io", "storageclasses", frozenset({"get", "list", "watch"})),
        ("", "events", frozenset({"create", "patch", "update"})),
        ("", "nodes", frozenset({"get"})),
    }
    assert rules("Role", "pyprovlib-hostpath-helper") == {
        ("coordination.k8s.io", "leases", frozenset({"get", "create", "update"})),
        ("", "pods", frozenset({"create", "get", "delete"})),
    }
    text = "".join(p.read_text() for p in ROOT.glob("*.yaml"))
    assert '"*"' not in text
    assert "privileged: true" not in text


@pytest.mark.parametrize("kind", ["DaemonSet", "Deployment"])
def test_args_are_real_flags(kind: str) -> None:
    c = container(kind)
    assert c["command"] == ["python", "-m", "pyprovlib.examples.hostpath"]
    known = {s for a in build_parser()._actions for s in a.option_strings}
    for arg in c["args"]:
        assert arg.split("=", 1)[0] in known, arg
    args = build_parser().parse_args(c["args"])
    if kind == "DaemonSet":
        assert (args.mode, args.leader_election) == ("node", False)
    else:
        assert (args.mode, args.leader_election) == ("helper-pod", True)


def test_daemonset_wiring() -> None:
    (ds,) = by_kind("DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "pyprovlib-hostpath"
    env = {e["name"]: e for e in container("DaemonSet")["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    (sc,) = by_kind("StorageClass")
    base = sc["parameters"]["basePath"]
    (volume,) = pod["volumes"]
    assert volume["hostPath"] == {"path": base, "type": "DirectoryOrCreate"}
    (mount,) = container("DaemonSet")["volumeMounts"]
    assert mount["mountPath"] == base  # node mode: the same path inside and outside


def test_storage_class_is_valid() -> None:
    (sc,) = by_kind("StorageClass")
    assert sc["provisioner"] == "pyprovlib.io/hostpath"
    assert sc["volumeBindingMode"] == "WaitForFirstConsumer"
    params = parse_parameters(
        V1StorageClass(
            metadata=V1ObjectMeta(name="x"), provisioner="p", parameters=sc["parameters"]
        )
    )
    assert params.base_path == "/var/pyprovlib/local"


async def test_shipped_class_and_claim_provision(tmp_path: Path) -> None:
    """storageclass.yaml and claim-and-pod.yaml as shipped (basePath pointed at a temporary
    directory) get a Bound claim through the real controller."""
    (sc,) = by_kind("StorageClass")
    sc["parameters"]["basePath"] = str(tmp_path)
    claim = next(d for d in docs("claim-and-pod.yaml") if d["kind"] == "PersistentVolumeClaim")
    async with ApiServer(binder=True) as server, server.api_client() as client:
        await create(client, sc, claim)
        await CoreV1Api(client).create_node(
            V1Node(metadata=V1ObjectMeta(name="n1", labels={"kubernetes.io/hostname": "n1"}))
        )
        await set_selected_node(client, "default", claim["metadata"]["name"], "n1")
        controller = ProvisionController(
            client,
            sc["provisioner"],
            NodeHostPathProvisioner(client, "n1"),
            ProvisionControllerOptions(leader_election=False),
        )
        task = asyncio.create_task(controller.run())
        try:
            core = CoreV1Api(client)
            for _ in range(600):
                pvc = await core.read_namespaced_persistent_volume_claim(
                    claim["metadata"]["name"], "default"
                )
                if pvc.status.phase == "Bound":
                    break
                await asyncio.sleep(0.05)
            assert pvc.status.phase == "Bound"
            assert (tmp_path / pvc.spec.volume_name).is_dir()
        finally:
            controller.stop()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(task, 15)


async def create(client: ApiClient, sc: dict[str, Any], claim: dict[str, Any]) -> None:
    await StorageV1Api(client).create_storage_class(sc)
    await CoreV1Api(client).create_namespaced_persistent_volume_claim("default", claim)

"""The manifests in examples/rbd/: they parse, use only flags the entry point has, grant exactly
the RBAC the provisioner needs, and the shipped Secrets, StorageClass and claim provision through
the real controller against the in-memory API server and the real Ceph (monitors and pool
pointed at the test cluster)."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from example_support import running, wait_claim_bound
from kubernetes_asyncio.client import CoreV1Api, StorageV1Api, V1ObjectMeta, V1StorageClass
from manifest_support import (
    LEADER_ELECTION_RULE,
    PROVISIONER_RULES,
    Manifests,
    parse_container_args,
)

from pyprovlib import testing
from pyprovlib.examples.rbd import RBDProvisioner
from pyprovlib.examples.rbd._cli import build_parser
from pyprovlib.examples.rbd._provisioner import parse_parameters
from pyprovlib.examples.rbd._rbd_cli import RbdRunner
from pyprovlib.testing._server import ApiServer

RBD = Manifests("rbd")


def test_least_privilege_rbac() -> None:
    assert RBD.rules("ClusterRole", "pyprovlib-rbd") == PROVISIONER_RULES | {
        ("", "secrets", frozenset({"get"}))
    }
    assert RBD.rules("Role", "pyprovlib-rbd-leader-election") == {LEADER_ELECTION_RULE}
    RBD.assert_no_wildcard_or_privilege()


def test_deployment_wiring() -> None:
    c = RBD.container("Deployment")
    args = parse_container_args(c, "pyprovlib.examples.rbd", build_parser())
    assert args.leader_election is True
    assert args.rbd_timeout == 10
    # A read-only root filesystem: the temporary keyfiles need a writable /tmp.
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert [m["mountPath"] for m in c["volumeMounts"]] == ["/tmp"]


def test_secret_templates() -> None:
    secrets = RBD.by_kind("Secret")
    assert {s["metadata"]["name"] for s in secrets} == {"ceph-admin-secret", "ceph-user-secret"}
    for s in secrets:
        assert s["type"] == "kubernetes.io/rbd"
        assert list(s["stringData"]) == ["key"]
        assert s["stringData"]["key"].startswith("REPLACE-WITH-")
    (sc,) = RBD.by_kind("StorageClass")
    p = sc["parameters"]
    admin = next(s for s in secrets if s["metadata"]["name"] == p["adminSecretName"])
    assert admin["metadata"]["namespace"] == p["adminSecretNamespace"]
    claim = RBD.claim()
    user = next(s for s in secrets if s["metadata"]["name"] == p["userSecretName"])
    assert user["metadata"]["namespace"] == claim["metadata"]["namespace"]


@pytest.mark.ceph
async def test_shipped_class_and_claim_provision(ceph: Any) -> None:
    (sc,) = RBD.by_kind("StorageClass")
    parse_parameters(
        V1StorageClass(
            metadata=V1ObjectMeta(name="x"), provisioner="p", parameters=sc["parameters"]
        )
    )
    # Point the class at the test cluster; everything else as shipped.
    sc["parameters"].update(monitors=ceph.monitors, pool="rbd", userId="admin")
    claim = RBD.claim()
    async with ApiServer(binder=True) as server, server.api_client() as client:
        core = CoreV1Api(client)
        await core.create_namespace({"metadata": {"name": "pyprovlib-system"}})
        for secret in RBD.by_kind("Secret"):
            del secret["stringData"]
            secret["data"] = {"key": base64.b64encode(ceph.admin_key.encode()).decode()}
            await core.create_namespaced_secret(secret["metadata"]["namespace"], secret)
        await StorageV1Api(client).create_storage_class(sc)
        await core.create_namespaced_persistent_volume_claim("default", claim)
        provisioner = RBDProvisioner(client, RbdRunner(timeout=10))
        async with running(client, sc["provisioner"], provisioner):
            pvc = await wait_claim_bound(core, claim["metadata"]["name"])
            pv = await core.read_persistent_volume(pvc.spec.volume_name)
            assert pv.spec.capacity == {"storage": "1024Mi"}
            assert pv.spec.rbd.user == "admin"
            assert pv.spec.rbd.fs_type == "ext4"
            assert (pv.spec.rbd.secret_ref.name, pv.spec.rbd.secret_ref.namespace) == (
                "ceph-user-secret",
                "default",
            )
            image = pv.spec.rbd.image
            info = ceph.rbd_json("info", "--pool", "rbd", "--image", image)
            assert (info["size"], info["features"]) == (1 << 30, ["layering"])
            await core.delete_namespaced_persistent_volume_claim(
                claim["metadata"]["name"], "default"
            )
            await testing.eventually(
                lambda: image not in ceph.rbd("ls", "--pool", "rbd").split(),
                message=f"image {image} removed",
            )

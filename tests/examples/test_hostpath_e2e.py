"""End to end: the hostpath example under the real ProvisionController, against the
``kube_cluster`` (the in-memory API server with its PV binder, or a real cluster when
PYPROVLIB_E2E_KUBECONFIG is set), with real temporary directories standing for the node's disk.

On a real cluster the directories are made on the machine running the tests (they stand in
for the node's disk); the claims, PVs, binding, release and deletion are the cluster's.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
from example_support import (
    claim_model,
    create_claim,
    create_class,
    running,
    tree,
    wait_bound,
    wait_event,
    wait_pv_gone,
)
from kubernetes_asyncio.client import (
    CoreV1Api,
)

from pyprovlib.controller._options import NodeDeployment
from pyprovlib.examples.hostpath import HostPathProvisioner, NodeHostPathProvisioner
from pyprovlib.examples.hostpath._provisioner import (
    ANNOTATION_NODE,
    HOSTNAME_LABEL,
    LocalDirectories,
)
from pyprovlib.kube._objects import name_of
from pyprovlib.kube._resources import NODES
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.testing._cluster import TestCluster

pytestmark = pytest.mark.e2e


async def make_class(
    c: TestCluster,
    provisioner: str,
    params: dict[str, str] | None,
    binding: str = "WaitForFirstConsumer",
) -> str:
    return await create_class(
        c, "hostpath", provisioner, parameters=params, volume_binding_mode=binding
    )


async def make_claim(c: TestCluster, sc: str, name: str | None = None) -> str:
    return await create_claim(c, claim_model(name or c.unique_name("data"), sc, "64Mi"))


async def delete_claim_and_pods(c: TestCluster, claim: str) -> None:
    core = CoreV1Api(c.api_client)
    for pod in (await core.list_namespaced_pod(c.namespace)).items:
        await core.delete_namespaced_pod(pod.metadata.name, c.namespace, grace_period_seconds=0)
    await core.delete_namespaced_persistent_volume_claim(claim, c.namespace)


async def node_hostname(c: TestCluster, pv: Any) -> tuple[str, str]:
    """(selected node name, its hostname label) for a provisioned PV."""
    claim = await CoreV1Api(c.api_client).read_namespaced_persistent_volume_claim(
        pv.spec.claim_ref.name, c.namespace
    )
    node_name = claim.metadata.annotations["volume.kubernetes.io/selected-node"]
    node = await CoreV1Api(c.api_client).read_node(node_name)
    return node_name, node.metadata.labels.get("kubernetes.io/hostname", node_name)


@pytest.mark.parametrize("on_delete", ["delete", "retain"])
async def test_create_bind_write_delete(
    kube_cluster: TestCluster, tmp_path: Path, on_delete: str
) -> None:
    c = kube_cluster
    name = c.unique_name("pyprovlib.io/hostpath-e2e")
    sc = await make_class(c, name, {"basePath": str(tmp_path), "onDelete": on_delete})
    claim = await make_claim(c, sc)
    prov = HostPathProvisioner(c.api_client, LocalDirectories())
    async with running(c.api_client, name, prov):
        await c.create_consumer_pod(claim)
        pv = await wait_bound(c, claim)
        pv_dir = tmp_path / pv.metadata.name
        assert pv_dir.is_dir()
        assert pv.spec.local.path == str(pv_dir)
        assert pv.spec.capacity["storage"] == "64Mi"
        assert pv.spec.access_modes == ["ReadWriteOnce"]
        assert pv.spec.storage_class_name == sc
        assert pv.spec.persistent_volume_reclaim_policy == "Delete"
        assert pv.metadata.annotations["pv.kubernetes.io/provisioned-by"] == name
        _, hostname = await node_hostname(c, pv)
        req = pv.spec.node_affinity.required.node_selector_terms[0].match_expressions[0]
        assert (req.key, req.operator, req.values) == ("kubernetes.io/hostname", "In", [hostname])

        (pv_dir / "hello.txt").write_text("written by a pod")
        await delete_claim_and_pods(c, claim)
        await wait_pv_gone(c, pv.metadata.name)

    if on_delete == "retain":
        assert tree(tmp_path) == [
            f"archived-{pv.metadata.name}",
            f"archived-{pv.metadata.name}/hello.txt",
        ]
    else:
        assert tree(tmp_path) == []


@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        ({"basePath": "/"}, "must not be the root directory"),
        ({"basePath": "relative/path"}, "must be an absolute path"),
        ({"basePath": "/a/../b"}, "must not contain '..'"),
        ({"basePath": "/" + "x" * 300}, "longer than 255 bytes"),
        ({"basePath": "/var/lib\x00/x"}, "contains a NUL byte"),
        ({"basePath": "/tmp", "size": "1Gi"}, "unknown parameter(s) size"),
        ({"onDelete": "archive"}, "onDelete='archive' is invalid"),
    ],
)
async def test_bad_parameters_get_an_event(
    kube_cluster: TestCluster, tmp_path: Path, params: dict[str, str], fragment: str
) -> None:
    c = kube_cluster
    name = c.unique_name("pyprovlib.io/hostpath-e2e")
    sc = await make_class(c, name, params)
    claim = await make_claim(c, sc)
    prov = HostPathProvisioner(c.api_client, LocalDirectories())
    async with running(c.api_client, name, prov):
        await c.create_consumer_pod(claim)
        message = await wait_event(c, claim, "ProvisioningFailed", fragment)
    assert f"StorageClass '{sc}'" in message
    pvc = await CoreV1Api(c.api_client).read_namespaced_persistent_volume_claim(claim, c.namespace)
    assert pvc.status.phase == "Pending"
    assert tree(tmp_path) == []


async def test_immediate_class_gets_an_event(kube_cluster: TestCluster, tmp_path: Path) -> None:
    c = kube_cluster
    name = c.unique_name("pyprovlib.io/hostpath-e2e")
    sc = await make_class(c, name, {"basePath": str(tmp_path)}, binding="Immediate")
    claim = await make_claim(c, sc)
    prov = HostPathProvisioner(c.api_client, LocalDirectories())
    async with running(c.api_client, name, prov):
        message = await wait_event(
            c, claim, "ProvisioningFailed", "requires volumeBindingMode: WaitForFirstConsumer"
        )
    assert sc in message
    assert tree(tmp_path) == []


async def test_node_mode_serves_only_its_node(kube_cluster: TestCluster, tmp_path: Path) -> None:
    """Two DaemonSet pods, two nodes, two disks: each provisioner takes only the claims
    scheduled to its node and deletes only its node's volumes."""
    c = kube_cluster
    core = CoreV1Api(c.api_client)
    node_a, node_b = await c.ready_nodes(2)
    disks: dict[str, Path] = {}
    for node in (node_a, node_b):
        disks[name_of(node)] = tmp_path / name_of(node)
        disks[name_of(node)].mkdir()
    name = c.unique_name("pyprovlib.io/hostpath-e2e")
    # The class's basePath is the same on every node; each node's "disk" is mounted there.
    # Here each provisioner gets its own disk through its own LocalDirectories root.
    sc_a = await make_class(c, name, {"basePath": str(disks[name_of(node_a)])})
    sc_b = await make_class(c, name, {"basePath": str(disks[name_of(node_b)])})
    claim_a = await make_claim(c, sc_a, "claim-a")
    claim_b = await make_claim(c, sc_b, "claim-b")
    prov_a = NodeHostPathProvisioner(c.api_client, name_of(node_a))
    prov_b = NodeHostPathProvisioner(c.api_client, name_of(node_b))
    async with running(c.api_client, name, prov_a), running(c.api_client, name, prov_b):
        await c.create_consumer_pod(claim_a, node=node_a)
        await c.create_consumer_pod(claim_b, node=node_b)
        pv_a = await wait_bound(c, claim_a)
        pv_b = await wait_bound(c, claim_b)
        assert tree(disks[name_of(node_a)]) == [pv_a.metadata.name]
        assert tree(disks[name_of(node_b)]) == [pv_b.metadata.name]
        values = pv_b.spec.node_affinity.required.node_selector_terms[0].match_expressions[0]
        assert values.values == [node_b["metadata"]["labels"]["kubernetes.io/hostname"]]
        await core.delete_namespaced_persistent_volume_claim(claim_a, c.namespace)
        await wait_pv_gone(c, pv_a.metadata.name)
        assert tree(disks[name_of(node_a)]) == []
        assert tree(disks[name_of(node_b)]) == [pv_b.metadata.name]


async def test_node_deployment_two_nodes_immediate_and_delayed_binding(
    kube_cluster: TestCluster, tmp_path: Path
) -> None:
    """Node mode as a node deployment: one instance per node (its hostname label differs from
    its name, as on some clouds). A WaitForFirstConsumer claim goes to the scheduler's node's
    instance; an Immediate claim to the one instance that selected its own node; each volume is
    deleted by its node's instance."""
    c = kube_cluster
    c.require_own_cluster("the test registers Node objects")
    nodes = ResourceClient(c.api_client, NODES)
    names = []
    for _ in range(2):
        node = c.unique_name("node")
        await nodes.create(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": node, "labels": {HOSTNAME_LABEL: f"{node}.internal"}},
            }
        )
        c.track(NODES, node)
        names.append(node)
    name = c.unique_name("pyprovlib.io/hostpath-e2e")
    params = {"basePath": str(tmp_path)}
    delayed = await make_class(c, name, params)
    immediate = await make_class(c, name, params, binding="Immediate")
    async with contextlib.AsyncExitStack() as stack:
        for node in names:
            deployment = NodeDeployment(node, base_delay=0.05, max_delay=0.5)
            await stack.enter_async_context(
                running(
                    c.api_client,
                    name,
                    NodeHostPathProvisioner(c.api_client, node),
                    node_deployment=deployment,
                )
            )
        first = await make_claim(c, delayed)
        await c.schedule(first, names[1])
        second = await make_claim(c, immediate)
        pv_first, pv_second = await wait_bound(c, first), await wait_bound(c, second)
        assert pv_first.metadata.annotations[ANNOTATION_NODE] == names[1]
        claim = await CoreV1Api(c.api_client).read_namespaced_persistent_volume_claim(
            second, c.namespace
        )
        owner = claim.metadata.annotations["volume.kubernetes.io/selected-node"]
        assert owner in names
        assert pv_second.metadata.annotations[ANNOTATION_NODE] == owner
        req = pv_second.spec.node_affinity.required.node_selector_terms[0].match_expressions[0]
        assert req.values == [f"{owner}.internal"]
        assert tree(tmp_path) == sorted([pv_first.metadata.name, pv_second.metadata.name])
        for claim_name in (first, second):
            await delete_claim_and_pods(c, claim_name)
        await wait_pv_gone(c, pv_first.metadata.name)
        await wait_pv_gone(c, pv_second.metadata.name)
    assert tree(tmp_path) == []

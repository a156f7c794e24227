"""The pod scheduler of the standalone server (kube-scheduler's volume binding): it selects a
node for the WaitForFirstConsumer claims of pending pods, and only a node that fits."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from claim_support import claim_body, class_body
from kubernetes_asyncio.client import ApiClient
from standalone_support import standalone

from pyprovlib import testing
from pyprovlib.kube._objects import Obj, annotations_of
from pyprovlib.kube._resources import (
    CSI_STORAGE_CAPACITIES,
    CSIDRIVERS,
    NODES,
    PERSISTENT_VOLUME_CLAIMS,
    PERSISTENT_VOLUMES,
    PODS,
    STORAGE_CLASSES,
)
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.testing._binder import ANN_SELECTED_NODE
from pyprovlib.testing._scheduler import PodScheduler, node_matches_terms
from pyprovlib.testing._server import ApiServer

NS = "default"


@pytest.fixture
async def api() -> AsyncIterator[ApiClient]:
    async with ApiServer(binder=True) as server, server.api_client() as client:
        yield client


@pytest.fixture
async def scheduler(api: ApiClient) -> AsyncIterator[PodScheduler]:
    async with PodScheduler(api, resync_period=0.2) as running:
        yield running


async def add_node(
    api: ApiClient, name: str, *, ready: bool = True, labels: dict[str, str] | None = None
) -> None:
    nodes = ResourceClient(api, NODES)
    await nodes.create(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {"kubernetes.io/hostname": name, **(labels or {})},
            },
        }
    )
    status = "True" if ready else "False"
    await nodes.patch(
        name,
        {"status": {"conditions": [{"type": "Ready", "status": status}]}},
        subresource="status",
    )


async def add_class(
    api: ApiClient,
    name: str,
    mode: str = "WaitForFirstConsumer",
    provisioner: str = "example.com/late",
    **extra: object,
) -> None:
    await ResourceClient(api, STORAGE_CLASSES).create(
        class_body(name, provisioner, volumeBindingMode=mode, **extra)
    )


async def add_claim(api: ApiClient, name: str, class_name: str) -> Obj:
    return await ResourceClient(api, PERSISTENT_VOLUME_CLAIMS).create(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": NS},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": class_name,
                "resources": {"requests": {"storage": "1Gi"}},
            },
        }
    )


async def add_pod(api: ApiClient, name: str, claim: str, **spec: object) -> Obj:
    return await ResourceClient(api, PODS).create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": NS},
            "spec": {
                "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
                **spec,
            },
        }
    )


async def selected_node(api: ApiClient, claim: str) -> str | None:
    obj = await ResourceClient(api, PERSISTENT_VOLUME_CLAIMS).get(claim, NS)
    return annotations_of(obj).get(ANN_SELECTED_NODE)


async def wait_selected(api: ApiClient, claim: str, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        node = await selected_node(api, claim)
        if node:
            return node
        await asyncio.sleep(0.02)
    raise AssertionError(f"no node selected for claim {claim} within {timeout}s")


async def test_idle_after_a_pass_over_what_its_caches_show(api: ApiClient) -> None:
    scheduler = PodScheduler(api, resync_period=60.0)
    assert not scheduler.idle()  # not running
    async with scheduler:
        await testing.wait_idle(scheduler)
        await add_node(api, "n1")
        await add_class(api, "late")
        await add_claim(api, "data", "late")
        pod = await add_pod(api, "app", "data")
        # No resync within the test: the pod's arrival itself caused the pass that placed it.
        await testing.wait_idle(scheduler, pod)
        assert await selected_node(api, "data") == "n1"
    assert not scheduler.idle()


async def test_selects_a_ready_node_for_a_pods_late_claim(
    api: ApiClient, scheduler: PodScheduler
) -> None:
    await add_node(api, "a-not-ready", ready=False)
    await add_node(api, "b-ready")
    await add_class(api, "late")
    claim = await add_claim(api, "data", "late")
    await testing.wait_idle(scheduler, claim)  # nothing selects a node without a pod
    assert await selected_node(api, "data") is None
    await add_pod(api, "app", "data")
    assert await wait_selected(api, "data") == "b-ready"


async def test_reselects_after_a_provisioner_removed_the_node(
    api: ApiClient, scheduler: PodScheduler
) -> None:
    """ProvisioningState.RESCHEDULE removes selected-node; the pod is still pending, so the
    scheduler picks a node again."""
    await add_node(api, "node-1")
    await add_class(api, "late")
    await add_claim(api, "data", "late")
    await add_pod(api, "app", "data")
    assert await wait_selected(api, "data") == "node-1"
    await ResourceClient(api, PERSISTENT_VOLUME_CLAIMS).patch(
        "data", {"metadata": {"annotations": {ANN_SELECTED_NODE: None}}}, namespace=NS
    )
    assert await wait_selected(api, "data") == "node-1"


async def test_respects_node_selector_topologies_and_bound_volumes(
    api: ApiClient, scheduler: PodScheduler
) -> None:
    for name, zone in (("n1", "z1"), ("n2", "z2"), ("n3", "z2")):
        await add_node(api, name, labels={"zone": zone, "disk": "ssd" if name != "n2" else "hdd"})
    zoned = [{"matchLabelExpressions": [{"key": "zone", "values": ["z2"]}]}]
    await add_class(api, "zoned", allowedTopologies=zoned)
    # A bound claim whose PV lives on n3 only: the late claim must follow it there.
    await ResourceClient(api, PERSISTENT_VOLUMES).create(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": "local-pv"},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "hostPath": {"path": "/tmp/x"},
                "claimRef": {"namespace": NS, "name": "bound"},
                "nodeAffinity": {
                    "required": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {
                                        "key": "kubernetes.io/hostname",
                                        "operator": "In",
                                        "values": ["n3"],
                                    }
                                ]
                            }
                        ]
                    }
                },
            },
        }
    )
    await ResourceClient(api, PERSISTENT_VOLUME_CLAIMS).create(
        claim_body("bound", "", namespace=NS, volumeName="local-pv")
    )
    await add_claim(api, "late", "zoned")
    await ResourceClient(api, PODS).create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "app", "namespace": NS},
            "spec": {
                "nodeSelector": {"disk": "ssd"},
                "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
                "volumes": [
                    {"name": "a", "persistentVolumeClaim": {"claimName": "bound"}},
                    {"name": "b", "persistentVolumeClaim": {"claimName": "late"}},
                ],
            },
        }
    )
    assert await wait_selected(api, "late") == "n3"


async def test_leaves_immediate_claims_and_unfit_pods_alone(
    api: ApiClient, scheduler: PodScheduler
) -> None:
    await add_node(api, "node-1", labels={"zone": "z1"})
    await add_class(api, "now", mode="Immediate")
    await add_class(
        api,
        "elsewhere",
        allowedTopologies=[{"matchLabelExpressions": [{"key": "zone", "values": ["z9"]}]}],
    )
    written = [
        await add_claim(api, "immediate", "now"),
        await add_claim(api, "nowhere", "elsewhere"),
        await add_pod(api, "app-1", "immediate"),
        await add_pod(api, "app-2", "nowhere"),
        await add_pod(api, "app-3", "missing-claim"),
    ]
    await testing.wait_idle(scheduler, *written)  # every pod looked at since
    assert await selected_node(api, "immediate") is None
    assert await selected_node(api, "nowhere") is None


async def test_only_nodes_with_enough_published_capacity(
    api: ApiClient, scheduler: PodScheduler
) -> None:
    """kube-scheduler's storage capacity check, for a CSIDriver with storageCapacity: true."""
    for name in ("n1", "n2"):
        await add_node(api, name, labels={"zone": name})
    await ResourceClient(api, CSIDRIVERS).create(
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "CSIDriver",
            "metadata": {"name": "capacity.example.com"},
            "spec": {"storageCapacity": True},
        }
    )
    await add_class(api, "late", provisioner="capacity.example.com")
    capacities = ResourceClient(api, CSI_STORAGE_CAPACITIES)

    async def publish(zone: str, capacity: str, maximum: str | None = None) -> None:
        body: Obj = {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "CSIStorageCapacity",
            "metadata": {"generateName": "csisc-", "namespace": NS},
            "storageClassName": "late",
            "nodeTopology": {"matchLabels": {"zone": zone}},
            "capacity": capacity,
        }
        if maximum is not None:
            body["maximumVolumeSize"] = maximum
        await capacities.create(body)

    # n1 has room in total but no volume of 1Gi fits (maximumVolumeSize wins); n2 too little.
    await publish("n1", "10Gi", maximum="512Mi")
    await publish("n2", "512Mi")
    claim = await add_claim(api, "data", "late")
    pod = await add_pod(api, "app", "data")
    await testing.wait_idle(scheduler, claim, pod)
    assert await selected_node(api, "data") is None
    await publish("n2", "2Gi")
    assert await wait_selected(api, "data") == "n2"


def test_node_selector_terms() -> None:
    node: Obj = {"metadata": {"name": "n1", "labels": {"zone": "z1", "gen": "3"}}}

    def term(*exprs: Obj, fields: list[Obj] | None = None) -> Obj:
        return {"matchExpressions": list(exprs), "matchFields": fields or []}

    assert node_matches_terms(node, [])
    assert node_matches_terms(node, [term({"key": "zone", "operator": "In", "values": ["z1"]})])
    assert not node_matches_terms(
        node, [term({"key": "zone", "operator": "NotIn", "values": ["z1"]})]
    )
    assert node_matches_terms(node, [term({"key": "gen", "operator": "Gt", "values": ["2"]})])
    assert not node_matches_terms(node, [term({"key": "gen", "operator": "Lt", "values": ["2"]})])
    assert node_matches_terms(node, [term({"key": "rack", "operator": "DoesNotExist"})])
    assert not node_matches_terms(node, [term({"key": "rack", "operator": "Exists"})])
    name_field = {"key": "metadata.name", "operator": "In", "values": ["n1"]}
    assert node_matches_terms(node, [term(fields=[name_field])])
    assert not node_matches_terms(node, [term()])  # an empty term matches no node
    # Terms are ORed.
    other = term({"key": "zone", "operator": "In", "values": ["z2"]})
    assert node_matches_terms(node, [other, term({"key": "zone", "operator": "Exists"})])


async def test_standalone_server_with_scheduler_and_nodes(tmp_path: Path) -> None:
    """``python -m pyprovlib.testing --scheduler --nodes 2``: Ready nodes and a scheduler, as the
    real-cluster mode of the e2e tests needs (tests/e2e/standalone.py)."""
    kubeconfig = tmp_path / "kubeconfig"
    async with standalone(kubeconfig, "--scheduler", "--nodes", "2") as server:
        url = json.loads(kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
        assert url == server.url
        from kubernetes_asyncio.client import Configuration

        config = Configuration(host=url)
        async with ApiClient(config) as api:
            nodes = (await ResourceClient(api, NODES).list())["items"]
            assert sorted(n["metadata"]["name"] for n in nodes) == [
                "pyprovlib-node-1",
                "pyprovlib-node-2",
            ]
            assert all(n["status"]["conditions"][0]["status"] == "True" for n in nodes)
            await add_class(api, "late")
            await add_claim(api, "data", "late")
            await add_pod(api, "app", "data")
            assert await wait_selected(api, "data") == "pyprovlib-node-1"
        server.child.proc.send_signal(signal.SIGTERM)
        assert await server.child.exit_code(10) == 0

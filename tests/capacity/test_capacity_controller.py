"""The CapacityController against the in-memory API server (real kubernetes-asyncio client), and
against a real cluster with ``PYPROVLIB_KUBE_ASSETS`` or ``PYPROVLIB_E2E_KUBECONFIG``:
one CSIStorageCapacity per class of the driver and topology segment, kept current as classes,
nodes, CSINodes and the reported capacity change; objects of others left alone; stale and
duplicate objects deleted; upstream's metrics."""

from __future__ import annotations

from typing import Any

import pytest
from capacity_support import (
    GI,
    TOPOLOGY_KEY,
    FakeSource,
    capacity_controller,
    cluster_for,
)

from pyprovlib import testing
from pyprovlib.controller._capacity import Capacity, CapacityControllerOptions
from pyprovlib.controller._capacity.options import InvalidCapacityOptionsError
from pyprovlib.kube._clock import FakeClock
from pyprovlib.kube._resources import (
    CSI_STORAGE_CAPACITIES,
    CSINODES,
    NODES,
    STORAGE_CLASSES,
)
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.testing._cluster import TestCluster

pytestmark = pytest.mark.e2e


async def test_one_object_per_class_and_segment(kube_cluster: TestCluster) -> None:
    async with cluster_for(kube_cluster.api_client) as c:
        n1, n2 = await c.driver_node("n1"), await c.driver_node("n2")
        fast = await c.storage_class("fast", "fast")
        slow = await c.storage_class("slow", "slow")
        await c.storage_class("now", "fast", mode="Immediate")  # not for the scheduler
        await c.storage_class("other", "fast", provisioner="other.example.com")
        source = FakeSource(
            table={
                ("fast", n1): Capacity(5 * GI, 2 * GI),
                ("slow", n2): Capacity(1536 << 20, None),
            }
        )
        async with capacity_controller(c, source) as run:
            objects = await c.wait_shapes(
                [
                    c.expect(fast, n1, "5Gi", "2Gi"),
                    c.expect(fast, n2, "100Gi"),
                    c.expect(slow, n1, "100Gi"),
                    c.expect(slow, n2, "1536Mi", None),
                ],
                "an object per class and node",
            )
            for obj in objects:
                assert obj["metadata"]["name"].startswith("csisc-")
                assert "ownerReferences" not in obj["metadata"]
            # GetCapacity got the class's parameters and the segment.
            assert ({"kind": "fast"}, ((TOPOLOGY_KEY, n1),)) in source.calls
            await testing.wait_idle(run.controller)
            goal, current, obsolete = run.controller.counts()
            assert (goal, current, obsolete) == (4, 4, 0)
            registry = run.registry
            assert registry.get_sample_value("csistoragecapacities_desired_goal") == 4
            assert registry.get_sample_value("csistoragecapacities_desired_current") == 4
            assert registry.get_sample_value("csistoragecapacities_obsolete") == 0
            assert (
                registry.get_sample_value("workqueue_adds_total", {"name": "csistoragecapacity"})
                or 0
            ) >= 4


async def test_classes_nodes_and_segments_come_and_go(kube_cluster: TestCluster) -> None:
    async with cluster_for(kube_cluster.api_client) as c:
        n1 = await c.driver_node("n1")
        fast = await c.storage_class("fast", "fast")
        async with capacity_controller(c) as run:
            await c.wait_shapes([c.expect(fast, n1, "100Gi")], "the first object")
            slow = await c.storage_class("slow", "slow")
            await c.wait_shapes(
                [c.expect(fast, n1, "100Gi"), c.expect(slow, n1, "100Gi")], "a class added"
            )
            # A node whose kubelet has not labelled it yet has no segment...
            n2 = await c.node("n2", labelled=False)
            await c.csinode(n2)
            await testing.wait_idle(run.controller)
            assert len(await c.objects()) == 2
            # ...until the label comes.
            await ResourceClient(kube_cluster.api_client, NODES).patch(
                n2, {"metadata": {"labels": {TOPOLOGY_KEY: n2}}}
            )
            await c.wait_shapes(
                [
                    c.expect(fast, n1, "100Gi"),
                    c.expect(slow, n1, "100Gi"),
                    c.expect(fast, n2, "100Gi"),
                    c.expect(slow, n2, "100Gi"),
                ],
                "a node added",
            )
            await ResourceClient(kube_cluster.api_client, NODES).delete(n1)
            await c.wait_shapes(
                [c.expect(fast, n2, "100Gi"), c.expect(slow, n2, "100Gi")], "a node removed"
            )
            await ResourceClient(kube_cluster.api_client, STORAGE_CLASSES).delete(slow)
            await c.wait_shapes([c.expect(fast, n2, "100Gi")], "a class removed")
            # The driver leaves the node: its CSINode no longer lists it.
            await ResourceClient(kube_cluster.api_client, CSINODES).patch(
                n2, {"spec": {"drivers": []}}, patch_type="merge"
            )
            await c.wait_shapes([], "the driver gone from the last node")
            await testing.wait_idle(run.controller)
            assert run.controller.counts() == (0, 0, 0)


async def test_nodes_sharing_a_segment_share_its_object(kube_cluster: TestCluster) -> None:
    async with cluster_for(kube_cluster.api_client) as c:
        zone = c.name("zone")
        a, b = await c.node("a", value=zone), await c.node("b", value=zone)
        await c.csinode(a)
        await c.csinode(b)
        fast = await c.storage_class("fast", "fast")
        async with capacity_controller(c) as run:
            (obj,) = await c.wait_shapes([c.expect(fast, zone, "100Gi")], "one per segment")
            await ResourceClient(kube_cluster.api_client, NODES).delete(a)
            await testing.wait_idle(run.controller)
            (still,) = await c.objects()  # b is still in the zone
            assert still["metadata"]["uid"] == obj["metadata"]["uid"]
            await ResourceClient(kube_cluster.api_client, NODES).delete(b)
            await c.wait_shapes([], "the zone gone with its last node")


async def test_a_driver_without_topology_gets_one_object_per_class(
    kube_cluster: TestCluster,
) -> None:
    async with cluster_for(kube_cluster.api_client) as c:
        for base in ("n1", "n2"):
            await c.csinode(await c.node(base), keys=[])
        fast = await c.storage_class("fast", "fast")
        source = FakeSource()
        clock = FakeClock()
        async with capacity_controller(c, source, clock=clock) as run:
            (obj,) = await c.wait_shapes([c.expect(fast, None, "100Gi")], "one object")
            assert obj["nodeTopology"] == {}
            assert source.calls[0] == ({"kind": "fast"}, ())
            # The same object poll after poll. (The Go sidecar, v6.3, does not match its own
            # object's {} to the empty segment: it deletes and re-creates it at every poll.)
            for poll in range(1, 4):
                await clock.advance(60.0)

                def polled(n: int = poll) -> bool:
                    return len(source.calls) > n

                await testing.eventually(polled, message=f"poll {poll}")
                await testing.wait_idle(run.controller)
            (again,) = await c.objects()
            assert again["metadata"]["uid"] == obj["metadata"]["uid"]
            assert again["metadata"]["resourceVersion"] == obj["metadata"]["resourceVersion"]


async def test_immediate_classes_only_with_capacity_for_immediate_binding(
    kube_cluster: TestCluster,
) -> None:
    async with cluster_for(kube_cluster.api_client) as c:
        n1 = await c.driver_node("n1")
        now = await c.storage_class("now", mode="Immediate")
        async with capacity_controller(c, immediate_binding=True):
            await c.wait_shapes([c.expect(now, n1, "100Gi")], "the Immediate class")


async def test_capacity_changes_reach_the_objects_at_the_poll(kube_cluster: TestCluster) -> None:
    async with cluster_for(kube_cluster.api_client) as c:
        n1, n2 = await c.driver_node("n1"), await c.driver_node("n2")
        fast = await c.storage_class("fast", "fast")
        source = FakeSource()
        clock = FakeClock()
        async with capacity_controller(c, source, clock=clock, poll_interval=60.0) as run:
            await c.wait_shapes(
                [c.expect(fast, n1, "100Gi"), c.expect(fast, n2, "100Gi")], "first objects"
            )
            await testing.wait_idle(run.controller)
            source.table[("fast", n1)] = Capacity(7 * GI, None)
            source.table[("fast", n2)] = Capacity(3 * GI, 1 * GI)
            await clock.advance(59.0)
            await testing.wait_idle(run.controller)
            assert await c.shapes() == sorted(
                [c.expect(fast, n1, "100Gi"), c.expect(fast, n2, "100Gi")]
            ), "nothing changes before the poll"
            await clock.advance(1.0)
            await c.wait_shapes(
                [c.expect(fast, n1, "7Gi", None), c.expect(fast, n2, "3Gi", "1Gi")],
                "the poll refreshed both",
            )


async def test_a_volume_created_or_deleted_refreshes_its_topology_before_the_poll(
    kube_cluster: TestCluster,
) -> None:
    async with cluster_for(kube_cluster.api_client) as c:
        n1, n2 = await c.driver_node("n1"), await c.driver_node("n2")
        fast = await c.storage_class("fast", "fast")
        slow = await c.storage_class("slow", "slow")
        source = FakeSource()
        async with capacity_controller(c, source, clock=FakeClock()) as run:
            await c.wait_shapes(
                [c.expect(cls, n, "100Gi") for cls in (fast, slow) for n in (n1, n2)], "first"
            )
            await testing.wait_idle(run.controller)
            before = (source.calls_for(n1), source.calls_for(n2))
            source.default = Capacity(90 * GI, 10 * GI)
            pv: dict[str, Any] = {
                "spec": {
                    "nodeAffinity": {
                        "required": {
                            "nodeSelectorTerms": [
                                {
                                    "matchExpressions": [
                                        {"key": TOPOLOGY_KEY, "operator": "In", "values": [n1]}
                                    ]
                                }
                            ]
                        }
                    }
                }
            }
            run.controller.after_provision(fast, pv)
            await c.wait_shapes(
                [
                    c.expect(fast, n1, "90Gi"),
                    c.expect(slow, n1, "90Gi"),
                    c.expect(fast, n2, "100Gi"),
                    c.expect(slow, n2, "100Gi"),
                ],
                "n1's objects refreshed, n2's not",
            )
            await testing.wait_idle(run.controller)
            assert (source.calls_for(n1), source.calls_for(n2)) == (before[0] + 2, before[1])
            # Without topology on the volume: its class. A failed attempt that changed
            # nothing refreshes nothing; one that may have refreshes the class.
            run.controller.after_provision(slow, None, changed=False)
            await testing.wait_idle(run.controller)
            assert len(source.calls) == sum(before) + 2
            run.controller.after_provision(slow, {"spec": {}})
            await c.wait_shapes(
                [
                    c.expect(fast, n1, "90Gi"),
                    c.expect(slow, n1, "90Gi"),
                    c.expect(fast, n2, "100Gi"),
                    c.expect(slow, n2, "90Gi"),
                ],
                "slow refreshed",
            )
            source.default = Capacity(95 * GI, 10 * GI)
            run.controller.after_delete(pv)
            await c.wait_shapes(
                [
                    c.expect(fast, n1, "95Gi"),
                    c.expect(slow, n1, "95Gi"),
                    c.expect(fast, n2, "100Gi"),
                    c.expect(slow, n2, "90Gi"),
                ],
                "a deleted volume refreshes its topology",
            )


async def test_objects_of_others_are_left_alone_and_stale_ones_deleted(
    kube_cluster: TestCluster,
) -> None:
    async with cluster_for(kube_cluster.api_client) as c:
        n1 = await c.driver_node("n1")
        fast = await c.storage_class("fast", "fast")
        objects = ResourceClient(kube_cluster.api_client, CSI_STORAGE_CAPACITIES)
        ours = {
            "csi.storage.k8s.io/drivername": c.driver,
            "csi.storage.k8s.io/managed-by": "external-provisioner",
        }

        async def make(name: str, labels: dict[str, str], **fields: Any) -> dict[str, Any]:
            return await c.capacity_object(fast, n1, name=name, labels=labels, **fields)

        # Another instance's (per-node managed-by) and another driver's: never touched.
        theirs = await make(
            "theirs", {**ours, "csi.storage.k8s.io/managed-by": "external-provisioner-n1"}
        )
        other = await make("other", {**ours, "csi.storage.k8s.io/drivername": "other"})
        # Ours, for a class that is gone and for a topology nobody has: deleted.
        await make("gone-class", ours, storageClassName="gone")
        await make("gone-node", ours, nodeTopology={"matchLabels": {TOPOLOGY_KEY: "nowhere"}})
        # Ours and current, twice: the older is kept (and refreshed), the younger deleted.
        kept = await make("a-kept", ours)
        await make("b-duplicate", ours)
        async with capacity_controller(c) as run:

            async def settled() -> bool:
                names = sorted(o["metadata"]["name"] for o in await c.objects())
                return names == ["a-kept", "other", "theirs"]

            await testing.eventually(settled, message="stale and duplicate objects deleted")
            now = await objects.get("a-kept", c.namespace)
            assert now["metadata"]["uid"] == kept["metadata"]["uid"]
            await testing.eventually(
                lambda: _capacity_of(objects, "a-kept", c.namespace),
                message="the kept object refreshed",
            )
            for untouched in (theirs, other):
                again = await objects.get(untouched["metadata"]["name"], c.namespace)
                assert (
                    again["metadata"]["resourceVersion"] == untouched["metadata"]["resourceVersion"]
                )
            await testing.wait_idle(run.controller)
            assert run.controller.counts() == (1, 1, 0)


async def _capacity_of(objects: ResourceClient, name: str, namespace: str) -> bool:
    return (await objects.get(name, namespace)).get("capacity") == "100Gi"


async def test_an_object_deleted_or_taken_away_by_someone_is_made_again(
    kube_cluster: TestCluster,
) -> None:
    async with cluster_for(kube_cluster.api_client) as c:
        n1 = await c.driver_node("n1")
        fast = await c.storage_class("fast", "fast")
        objects = ResourceClient(kube_cluster.api_client, CSI_STORAGE_CAPACITIES)
        async with capacity_controller(c):
            (first,) = await c.wait_shapes([c.expect(fast, n1, "100Gi")], "made")
            await objects.delete(first["metadata"]["name"], c.namespace)

            async def remade() -> bool:
                found = await c.objects()
                return len(found) == 1 and found[0]["metadata"]["uid"] != first["metadata"]["uid"]

            await testing.eventually(remade, message="made again after a delete")
            (second,) = await c.objects()
            # Someone relabels it: no longer ours, so a new one is made and theirs is kept.
            await objects.patch(
                second["metadata"]["name"],
                {"metadata": {"labels": {"csi.storage.k8s.io/managed-by": "someone"}}},
                namespace=c.namespace,
            )

            async def replaced() -> bool:
                found = await c.objects()
                managers = sorted(
                    o["metadata"]["labels"]["csi.storage.k8s.io/managed-by"] for o in found
                )
                return managers == ["external-provisioner", "someone"]

            await testing.eventually(replaced, message="a new one beside the relabelled one")


async def test_the_owner_reference_is_set_and_added_to_adopted_objects(
    kube_cluster: TestCluster,
) -> None:
    async with cluster_for(kube_cluster.api_client) as c:
        owner = await c.owner("csi-provisioner")
        n1, n2 = await c.driver_node("n1"), await c.driver_node("n2")
        fast = await c.storage_class("fast", "fast")
        # Left by the instance of an old deployment (that still exists): adopted, and its
        # controller reference replaced (an object has one controller only).
        await c.capacity_object(
            fast,
            n2,
            owner=await c.owner("old-provisioner"),
            capacity="100Gi",
            maximumVolumeSize="10Gi",
        )
        # Left by an instance without owner (or the Go sidecar before): adopted.
        adopted = await c.capacity_object(fast, n1, capacity="100Gi", maximumVolumeSize="10Gi")
        async with capacity_controller(c, owner=owner):

            async def owned() -> list[dict[str, Any]] | None:
                found = await c.objects()
                refs = [o["metadata"].get("ownerReferences") for o in found]
                return found if len(found) == 2 and refs == [[owner], [owner]] else None

            found = await testing.eventually(owned, message="both objects owned")
            assert adopted["metadata"]["uid"] in {o["metadata"]["uid"] for o in found}
            assert len({o["metadata"]["uid"] for o in found}) == 2


async def test_a_failing_get_capacity_is_retried(kube_cluster: TestCluster) -> None:
    async with cluster_for(kube_cluster.api_client) as c:
        n1 = await c.driver_node("n1")
        fast = await c.storage_class("fast", "fast")
        source = FakeSource(fail=True)
        async with capacity_controller(c, source) as run:
            await testing.eventually(lambda: len(source.calls) >= 3, message="retried with backoff")
            assert await c.objects() == []
            assert run.controller.counts()[:2] == (1, 0)
            source.fail = False
            await c.wait_shapes([c.expect(fast, n1, "100Gi")], "made once it answers")


async def test_several_workers_and_stop_midway(kube_cluster: TestCluster) -> None:
    async with cluster_for(kube_cluster.api_client) as c:
        nodes = [await c.node(f"n{i}") for i in range(6)]
        for node in nodes:
            await c.csinode(node)
        classes = [await c.storage_class(f"sc{i}", f"k{i}") for i in range(3)]
        async with capacity_controller(c, workers=4) as run:
            await c.wait_shapes(
                [c.expect(cls, n, "100Gi") for cls in classes for n in nodes], "18 objects"
            )
            await testing.wait_idle(run.controller)
        assert not run.controller.ready()
        assert len(await c.objects()) == 18  # stopping deletes nothing


def test_options_are_checked() -> None:
    with pytest.raises(InvalidCapacityOptionsError, match="NAMESPACE"):
        CapacityControllerOptions(namespace="")
    with pytest.raises(InvalidCapacityOptionsError, match="poll_interval"):
        CapacityControllerOptions(namespace="ns", poll_interval=0)
    with pytest.raises(InvalidCapacityOptionsError, match="uid missing"):
        CapacityControllerOptions(
            namespace="ns", owner={"apiVersion": "v1", "kind": "Pod", "name": "p"}
        )
    options = CapacityControllerOptions(namespace="ns")
    assert (options.poll_interval, options.workers, options.immediate_binding) == (60.0, 1, False)
    assert options.managed_by == "external-provisioner"

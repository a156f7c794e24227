"""CSIProvisioner end to end: topology, clones, the deleted-claim leak, deletion guards."""

from __future__ import annotations

import asyncio
import pathlib

import pytest
from claim_support import attachment_body
from csi_driver import TOPOLOGY_KEY, Fault
from csi_e2e import (
    Env,
    create_claim,
    create_class,
    csi_env,
    delete_claim,
    events_of,
    get_claim,
    get_volume,
    set_finalizers,
    wait_bound,
    wait_event,
    wait_until,
    wait_volume_gone,
)

from pyprovlib.csi._proto.csi import v1
from pyprovlib.csi.provisioner import CSIProvisionerOptions
from pyprovlib.csi.provisioner._data_source import CLONE_FINALIZER
from pyprovlib.kube._objects import Obj
from pyprovlib.kube._resources import (
    CSINODES,
    EVENTS,
    NODES,
    PERSISTENT_VOLUME_CLAIMS,
    VOLUME_ATTACHMENTS,
)
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.testing._binder import ANN_SELECTED_NODE
from pyprovlib.testing._cluster import TestCluster

pytestmark = pytest.mark.e2e


async def add_node(env: Env, name: str, zone: str, *, csinode: bool = True) -> None:
    api = env.cluster.api_client
    await ResourceClient(api, NODES).create(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {TOPOLOGY_KEY: zone, "other": "x"}},
        }
    )
    env.cluster.track(NODES, name)
    if csinode:
        await ResourceClient(api, CSINODES).create(
            {
                "apiVersion": "storage.k8s.io/v1",
                "kind": "CSINode",
                "metadata": {"name": name},
                "spec": {
                    "drivers": [{"name": env.name, "nodeID": name, "topologyKeys": [TOPOLOGY_KEY]}]
                },
            }
        )
        env.cluster.track(CSINODES, name)


def segments(topologies: list[v1.Topology]) -> list[dict[str, str]]:
    return [dict(t.segments) for t in topologies]


def accessibility_requirements(env: Env) -> v1.TopologyRequirement:
    """What the one CreateVolume call so far asked for where the volume must be reachable."""
    [request] = env.driver.requests("CreateVolume")
    assert isinstance(request, v1.CreateVolumeRequest)
    requirement = request.accessibility_requirements
    assert requirement is not None
    return requirement


@pytest.mark.parametrize("shared_informers", [False, True], ids=["rest", "informers"])
async def test_selected_node_topology_reaches_the_driver_and_the_pv(
    kube_cluster: TestCluster, sock_dir: pathlib.Path, shared_informers: bool
) -> None:
    kube_cluster.require_own_cluster("creates Nodes and CSINodes for the Python driver")
    async with csi_env(
        kube_cluster, sock_dir, topology=True, shared_informers=shared_informers
    ) as env:
        await add_node(env, "node-a", "zone-a")
        await add_node(env, "node-b", "zone-b")
        class_name = await create_class(env, volumeBindingMode="WaitForFirstConsumer")
        claim = await create_claim(env, class_name)
        name = claim["metadata"]["name"]
        await kube_cluster.schedule(name, "node-b")
        bound = await wait_bound(env, name)
        requirement = accessibility_requirements(env)
        assert segments(requirement.requisite) == [
            {TOPOLOGY_KEY: "zone-a"},
            {TOPOLOGY_KEY: "zone-b"},
        ]
        assert segments(requirement.preferred)[0] == {TOPOLOGY_KEY: "zone-b"}
        pv = await get_volume(env, bound["spec"]["volumeName"])
        assert pv is not None
        assert pv["spec"]["nodeAffinity"] == {
            "required": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": TOPOLOGY_KEY, "operator": "In", "values": ["zone-b"]}
                        ]
                    }
                ]
            }
        }


async def test_allowed_topologies_with_immediate_binding(
    kube_cluster: TestCluster, sock_dir: pathlib.Path
) -> None:
    async with csi_env(kube_cluster, sock_dir, topology=True) as env:
        class_name = await create_class(
            env,
            allowedTopologies=[
                {"matchLabelExpressions": [{"key": TOPOLOGY_KEY, "values": ["zone-c", "zone-d"]}]}
            ],
        )
        claim = await create_claim(env, class_name)
        await wait_bound(env, claim["metadata"]["name"])
        requirement = accessibility_requirements(env)
        assert segments(requirement.requisite) == [
            {TOPOLOGY_KEY: "zone-c"},
            {TOPOLOGY_KEY: "zone-d"},
        ]
        assert sorted(map(str, segments(requirement.preferred))) == sorted(
            map(str, segments(requirement.requisite))
        )


async def test_selected_node_without_csinode_is_rescheduled(
    kube_cluster: TestCluster, sock_dir: pathlib.Path
) -> None:
    kube_cluster.require_own_cluster("creates Nodes for the Python driver")
    async with csi_env(kube_cluster, sock_dir, topology=True) as env:
        await add_node(env, "node-x", "zone-x", csinode=False)
        class_name = await create_class(env, volumeBindingMode="WaitForFirstConsumer")
        claim = await create_claim(env, class_name)
        name = claim["metadata"]["name"]
        await kube_cluster.schedule(name, "node-x")
        await wait_event(env, name, "ProvisioningFailed", "CSINode 'node-x'")

        async def unscheduled() -> bool:
            current = await get_claim(env, name)
            return current is not None and ANN_SELECTED_NODE not in (
                current["metadata"].get("annotations") or {}
            )

        await kube_cluster.wait_for(unscheduled, message="selected-node removed")
        assert env.driver.requests("CreateVolume") == []


async def test_clone_is_protected_while_in_progress(
    kube_cluster: TestCluster, sock_dir: pathlib.Path
) -> None:
    async with csi_env(kube_cluster, sock_dir) as env:
        class_name = await create_class(env)
        source = await create_claim(env, class_name, size="1Gi")
        source_name = source["metadata"]["name"]
        await wait_bound(env, source_name)
        source_pv = await get_volume(env, f"pvc-{source['metadata']['uid']}")
        assert source_pv is not None

        # Every CreateVolume waits until the test has seen the protection (a call timing out
        # meanwhile is retried and waits too).
        gate = asyncio.Event()
        env.driver.fail("CreateVolume", Fault(gate=gate, times=10**6))
        clone = await create_claim(
            env,
            class_name,
            size="2Gi",
            dataSource={"kind": "PersistentVolumeClaim", "name": source_name},
        )

        async def protected() -> bool:
            current = await get_claim(env, source_name)
            return current is not None and CLONE_FINALIZER in (
                current["metadata"].get("finalizers") or []
            )

        await kube_cluster.wait_for(protected, message="cloning-protection finalizer added")
        gate.set()
        await wait_bound(env, clone["metadata"]["name"])

        async def unprotected() -> bool:
            return not await protected()

        await kube_cluster.wait_for(unprotected, message="cloning-protection finalizer removed")
        request = env.driver.requests("CreateVolume")[-1]
        assert isinstance(request, v1.CreateVolumeRequest)
        assert request.volume_content_source is not None
        assert request.volume_content_source.volume is not None
        assert (
            request.volume_content_source.volume.volume_id
            == source_pv["spec"]["csi"]["volumeHandle"]
        )


async def test_clone_of_a_missing_claim_is_reported(
    kube_cluster: TestCluster, sock_dir: pathlib.Path
) -> None:
    async with csi_env(kube_cluster, sock_dir) as env:
        class_name = await create_class(env)
        clone = await create_claim(
            env, class_name, dataSource={"kind": "PersistentVolumeClaim", "name": "nope"}
        )
        await wait_event(env, clone["metadata"]["name"], "ProvisioningFailed", "clone source claim")
        assert env.driver.requests("CreateVolume") == []


async def claim_deleted_while_creating(env: Env) -> Obj:
    """A claim deleted while its CreateVolume, slower than the call timeout, is in flight."""
    class_name = await create_class(env)
    env.driver.fail("CreateVolume", Fault(delay=0.6, times=2))
    claim = await create_claim(env, class_name)
    uid = claim["metadata"]["uid"]
    await wait_until(env, lambda: uid in env.provisioner.in_flight, "CreateVolume in flight")
    await delete_claim(env, claim["metadata"]["name"])
    return claim


async def test_claim_deleted_while_volume_creates_in_background_is_not_leaked(
    kube_cluster: TestCluster, sock_dir: pathlib.Path
) -> None:
    # Upstream issues #486/#1469: CreateVolume times out, the claim is deleted, the driver
    # finishes the volume later. Here the retry finds the claim gone and deletes the volume.
    async with csi_env(kube_cluster, sock_dir, call_timeout=0.2) as env:
        claim = await claim_deleted_while_creating(env)
        uid = claim["metadata"]["uid"]
        await wait_until(env, lambda: env.driver.requests("DeleteVolume"), "volume cleaned up")
        await wait_until(env, lambda: not env.driver.volumes, "no volume left in the driver")
        await wait_until(env, lambda: uid not in env.provisioner.in_flight, "in-flight cleared")
        delete = env.driver.requests("DeleteVolume")[0]
        assert isinstance(delete, v1.DeleteVolumeRequest)
        assert delete.volume_id.startswith("vol-")
        assert await get_volume(env, f"pvc-{uid}") is None
        # No PV was ever saved for the deleted claim: the volume was cleaned up directly.
        reasons = {e["reason"] for e in await events_of(env, claim["metadata"]["name"])}
        assert "ProvisioningSucceeded" not in reasons
        await wait_until(
            env,
            lambda: uid not in env.controller.claims_in_progress(),
            "the controller stopped retrying the claim",
        )


@pytest.mark.parametrize("shared_informers", [False, True], ids=["rest", "informers"])
async def test_delete_is_refused_while_attached(
    kube_cluster: TestCluster, sock_dir: pathlib.Path, shared_informers: bool
) -> None:
    async with csi_env(kube_cluster, sock_dir, shared_informers=shared_informers) as env:
        class_name = await create_class(env)
        claim = await create_claim(env, class_name)
        bound = await wait_bound(env, claim["metadata"]["name"])
        pv_name = bound["spec"]["volumeName"]
        attachments = ResourceClient(kube_cluster.api_client, VOLUME_ATTACHMENTS)
        attachment: Obj = attachment_body(
            kube_cluster.unique_name("va"), env.name, "node-1", pv_name
        )
        await attachments.create(attachment)
        kube_cluster.track(VOLUME_ATTACHMENTS, attachment["metadata"]["name"])
        await delete_claim(env, claim["metadata"]["name"])

        async def failed_delete() -> bool:
            events = await ResourceClient(kube_cluster.api_client, EVENTS).list("default")
            return any(
                e.get("reason") == "VolumeFailedDelete" and "still attached" in e["message"]
                for e in events["items"]
            )

        await kube_cluster.wait_for(failed_delete, message="VolumeFailedDelete event")
        assert env.driver.requests("DeleteVolume") == []
        assert await get_volume(env, pv_name) is not None
        await attachments.delete(attachment["metadata"]["name"])
        await wait_volume_gone(env, pv_name)
        assert len(env.driver.requests("DeleteVolume")) == 1


async def test_without_clean_up_the_volume_goes_through_a_released_pv(
    kube_cluster: TestCluster, sock_dir: pathlib.Path
) -> None:
    # The contrast to the test above (and what it guards against): with the clean-up off, a
    # PV is saved for the deleted claim and only its Released-PV deletion removes the volume.
    options = CSIProvisionerOptions(clean_up_deleted_claims=False)
    async with csi_env(kube_cluster, sock_dir, call_timeout=0.2, options=options) as env:
        claim = await claim_deleted_while_creating(env)
        uid = claim["metadata"]["uid"]
        await wait_event(env, claim["metadata"]["name"], "ProvisioningSucceeded")
        await wait_volume_gone(env, f"pvc-{uid}")
        await wait_until(env, lambda: not env.driver.volumes, "volume deleted via the PV")


async def test_stale_cloning_protection_is_swept(
    kube_cluster: TestCluster, sock_dir: pathlib.Path
) -> None:
    # A process that stopped mid-clone leaves the finalizer; the sweep removes it unless a
    # clone of that source is still pending.
    async with csi_env(kube_cluster, sock_dir, shared_informers=True) as env:
        claims = ResourceClient(kube_cluster.api_client, PERSISTENT_VOLUME_CLAIMS)
        ns = kube_cluster.namespace
        stale = await create_claim(env, "no-such-class")
        kept = await create_claim(env, "no-such-class")
        names = [stale["metadata"]["name"], kept["metadata"]["name"]]
        await set_finalizers(claims, names, [CLONE_FINALIZER], ns)
        # A pending clone (its class does not exist, so it stays Pending) of ``kept``.
        await create_claim(
            env,
            "no-such-class",
            dataSource={"kind": "PersistentVolumeClaim", "name": kept["metadata"]["name"]},
        )

        async def swept() -> bool:
            await env.provisioner.sweep_clone_protection()
            current = await get_claim(env, stale["metadata"]["name"])
            return current is not None and CLONE_FINALIZER not in (
                current["metadata"].get("finalizers") or []
            )

        await kube_cluster.wait_for(swept, message="stale finalizer removed")
        current = await get_claim(env, kept["metadata"]["name"])
        assert current is not None
        assert CLONE_FINALIZER in current["metadata"]["finalizers"]
        await set_finalizers(claims, names, [], ns)


@pytest.mark.parametrize(
    ("flag", "modes", "read_only"),
    [
        (True, ["ReadOnlyMany"], True),
        (False, ["ReadOnlyMany"], False),
        (True, ["ReadWriteOnce"], False),
        (True, ["ReadWriteMany"], False),
        # Upstream: only a request with one capability, MULTI_NODE_READER_ONLY.
        (True, ["ReadOnlyMany", "ReadWriteMany"], False),
    ],
)
async def test_controller_publish_readonly_marks_read_only_many_volumes(
    kube_cluster: TestCluster,
    sock_dir: pathlib.Path,
    flag: bool,
    modes: list[str],
    read_only: bool,
) -> None:
    options = CSIProvisionerOptions(controller_publish_readonly=flag)
    async with csi_env(kube_cluster, sock_dir, options=options) as env:
        class_name = await create_class(env)
        claim = await create_claim(env, class_name, accessModes=modes)
        bound = await wait_bound(env, claim["metadata"]["name"])
        pv = await get_volume(env, bound["spec"]["volumeName"])
        assert pv is not None
        assert pv["spec"]["csi"].get("readOnly", False) is read_only
        assert pv["spec"]["accessModes"] == modes

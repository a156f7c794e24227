"""CSIProvisioner restoring VolumeSnapshots end to end: the API server (in memory with its PV
binder, or the real cluster of PYPROVLIB_E2E_KUBECONFIG, skipped there without the snapshot
CRDs), a ProvisionController, and the Python CSI driver on a unix socket."""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from csi_driver import Fault, Snapshot
from csi_e2e import (
    Env,
    SnapshotObjects,
    create_claim,
    create_class,
    create_snapshot,
    csi_env,
    delete_claim,
    events_of,
    get_snapshot,
    get_volume,
    require_snapshot_crds,
    set_finalizers,
    set_snapshot_status,
    snapshot_source,
    wait_bound,
    wait_event,
    wait_until,
)

from pyprovlib.csi._proto.csi import v1
from pyprovlib.csi.provisioner import CSIProvisionerOptions
from pyprovlib.csi.provisioner._data_source import ANN_ALLOW_VOLUME_MODE_CHANGE, SNAPSHOT_FINALIZER
from pyprovlib.csi.provisioner._options import build_parser
from pyprovlib.kube._objects import Obj
from pyprovlib.kube._resources import VOLUME_SNAPSHOT_CONTENTS, VOLUME_SNAPSHOTS
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.testing._cluster import TestCluster
from pyprovlib.testing._controlplane import ControlPlane

pytestmark = pytest.mark.e2e

GI = 1 << 30


async def snapshot_of_new_volume(env: Env, class_name: str, size: str = "1Gi") -> Snapshot:
    """Provision a claim and snapshot its volume in the driver."""
    claim = await create_claim(env, class_name, size=size)
    bound = await wait_bound(env, claim["metadata"]["name"])
    pv = await get_volume(env, bound["spec"]["volumeName"])
    assert pv is not None
    return env.driver.take_snapshot(pv["spec"]["csi"]["volumeHandle"])


async def class_and_snapshot(env: Env) -> tuple[str, Snapshot]:
    """A class of the driver and a snapshot (in the driver) of a volume provisioned from it;
    skips where the cluster has no snapshot CRDs."""
    await require_snapshot_crds(env)
    class_name = await create_class(env)
    return class_name, await snapshot_of_new_volume(env, class_name)


async def restore_claim(
    env: Env, class_name: str, snap: Snapshot, **snapshot: Any
) -> tuple[Obj, SnapshotObjects]:
    """A claim of ``class_name`` restoring from a VolumeSnapshot of ``snap``, made by
    ``create_snapshot(**snapshot)``."""
    objects = await create_snapshot(env, snap.snapshot_id, **snapshot)
    claim = await create_claim(env, class_name, dataSource=snapshot_source(objects.snapshot))
    return claim, objects


def restored_snapshot_id(env: Env, claim: Obj) -> str:
    """The snapshot the one CreateVolume call for ``claim`` restored from."""
    [request] = create_calls_for(env, claim)
    assert request.volume_content_source is not None
    assert request.volume_content_source.snapshot is not None
    return request.volume_content_source.snapshot.snapshot_id


def create_calls_for(env: Env, claim: Obj) -> list[v1.CreateVolumeRequest]:
    name = f"pvc-{claim['metadata']['uid']}"
    calls = [
        r for r in env.driver.requests("CreateVolume") if isinstance(r, v1.CreateVolumeRequest)
    ]
    return [r for r in calls if r.name == name]


async def test_claim_is_restored_from_a_ready_snapshot(
    kube_cluster: TestCluster, sock_dir: pathlib.Path
) -> None:
    async with csi_env(kube_cluster, sock_dir) as env:
        class_name, snap = await class_and_snapshot(env)
        objects = await create_snapshot(env, snap.snapshot_id, restore_size=snap.size)
        claim = await create_claim(
            env, class_name, size="2Gi", dataSource=snapshot_source(objects.snapshot)
        )
        bound = await wait_bound(env, claim["metadata"]["name"])
        pv = await get_volume(env, bound["spec"]["volumeName"])
        assert pv is not None
        assert pv["spec"]["capacity"]["storage"] == "2Gi"
        [request] = create_calls_for(env, claim)
        assert request.volume_content_source is not None
        assert request.volume_content_source.snapshot is not None
        assert request.volume_content_source.snapshot.snapshot_id == snap.snapshot_id
        assert request.capacity_range is not None
        assert request.capacity_range.required_bytes == 2 * GI
        restored = env.driver.volumes[request.name]
        assert restored.volume_id == pv["spec"]["csi"]["volumeHandle"]
        await wait_event(env, claim["metadata"]["name"], "ProvisioningSucceeded")

        # The same through dataSourceRef alone.
        claim = await create_claim(env, class_name, dataSourceRef=snapshot_source(objects.snapshot))
        await wait_bound(env, claim["metadata"]["name"])
        assert restored_snapshot_id(env, claim) == snap.snapshot_id
        # No restore in flight: the snapshot is not held.
        current = await get_snapshot(env, objects.snapshot)
        assert current is not None
        assert SNAPSHOT_FINALIZER not in (current["metadata"].get("finalizers") or [])


# -- every rejection: a ProvisioningFailed event naming the problem, and no CreateVolume --------


@dataclass
class Rejection:
    """Sets up a snapshot (returning the claim's extra spec) and the event text expected."""

    setup: Callable[[Env, Snapshot], Awaitable[dict[str, Any]]]
    message: str
    no_snapshot_controller: str = ""
    feature_gate: str = ""
    """An alpha feature gate the case needs: set on the in-memory server; on a real control
    plane the case gets one of its own started with ``--feature-gates=<gate>=true``."""


def _snapshot_with(**kwargs: Any) -> Callable[[Env, Snapshot], Awaitable[dict[str, Any]]]:
    """A claim's source: a VolumeSnapshot of ``snap`` made by ``create_snapshot(**kwargs)``."""

    async def setup(env: Env, snap: Snapshot) -> dict[str, Any]:
        objects = await create_snapshot(env, snap.snapshot_id, **kwargs)
        return {"dataSource": snapshot_source(objects.snapshot)}

    return setup


async def _missing(env: Env, snap: Snapshot) -> dict[str, Any]:
    return {"dataSource": snapshot_source("no-such-snapshot")}


async def _content_of_another_snapshot(env: Env, snap: Snapshot) -> dict[str, Any]:
    first = await create_snapshot(env, snap.snapshot_id)
    second = await create_snapshot(env, snap.snapshot_id, bound=False)
    # The second snapshot claims the first one's content, which does not point back at it.
    await ResourceClient(env.cluster.api_client, VOLUME_SNAPSHOTS).patch(
        second.snapshot,
        {"status": {"boundVolumeSnapshotContentName": first.content, "readyToUse": True}},
        namespace=env.cluster.namespace,
        subresource="status",
    )
    return {"dataSource": snapshot_source(second.snapshot)}


async def _no_handle(env: Env, snap: Snapshot) -> dict[str, Any]:
    objects = await create_snapshot(env, snap.snapshot_id)
    content = await ResourceClient(env.cluster.api_client, VOLUME_SNAPSHOT_CONTENTS).get(
        objects.content
    )
    content["status"] = {"readyToUse": True}
    await ResourceClient(env.cluster.api_client, VOLUME_SNAPSHOT_CONTENTS).replace_status(content)
    return {"dataSource": snapshot_source(objects.snapshot)}


async def _being_deleted(env: Env, snap: Snapshot) -> dict[str, Any]:
    objects = await create_snapshot(env, snap.snapshot_id)
    snapshots = ResourceClient(env.cluster.api_client, VOLUME_SNAPSHOTS)
    ns = env.cluster.namespace
    await snapshots.patch(objects.snapshot, {"metadata": {"finalizers": [HOLD]}}, namespace=ns)
    await snapshots.delete(objects.snapshot, ns)
    return {"dataSource": snapshot_source(objects.snapshot)}


async def _wrong_group(env: Env, snap: Snapshot) -> dict[str, Any]:
    # Through dataSourceRef: kube-apiserver drops such a spec.dataSource given alone (neither
    # a claim nor a snapshot.storage.k8s.io VolumeSnapshot; KEP 1495), so only a
    # dataSourceRef (mirrored into dataSource) brings it to the provisioner.
    return {"dataSourceRef": {"apiGroup": "example.com", "kind": "VolumeSnapshot", "name": "x"}}


async def _other_namespace(env: Env, snap: Snapshot) -> dict[str, Any]:
    return {"dataSourceRef": {**snapshot_source("snap"), "namespace": "elsewhere"}}


HOLD = "pyprovlib.io/test-hold"

REJECTIONS = {
    "missing": Rejection(_missing, "VolumeSnapshot {ns}/no-such-snapshot not found"),
    "not-ready": Rejection(_snapshot_with(ready=False), "is not ready to use yet"),
    "unbound": Rejection(
        _snapshot_with(bound=False), "is not bound to a VolumeSnapshotContent yet"
    ),
    "other-driver": Rejection(
        _snapshot_with(driver="other.csi.example.com"),
        "was taken by CSI driver 'other.csi.example.com'",
    ),
    "content-of-another-snapshot": Rejection(
        _content_of_another_snapshot,
        "points at another snapshot",
        no_snapshot_controller="it would rebind the snapshot",
    ),
    "no-handle": Rejection(_no_handle, "has no status.snapshotHandle"),
    "restore-size": Rejection(  # the claim asks for 1Gi
        _snapshot_with(restore_size=2 * GI),
        f"requested volume size {GI} is less than the size {2 * GI}",
    ),
    "being-deleted": Rejection(_being_deleted, "is being deleted: restore claim"),
    # A Block snapshot for the Filesystem claim, its content allowing that or not.
    "volume-mode": Rejection(
        _snapshot_with(source_volume_mode="Block"),
        f"annotation {ANN_ALLOW_VOLUME_MODE_CHANGE} is not present",
    ),
    "volume-mode-false": Rejection(
        _snapshot_with(
            source_volume_mode="Block",
            content_annotations={ANN_ALLOW_VOLUME_MODE_CHANGE: "false"},
        ),
        f"{ANN_ALLOW_VOLUME_MODE_CHANGE} is set to false",
    ),
    "volume-mode-garbled": Rejection(
        _snapshot_with(
            source_volume_mode="Block",
            content_annotations={ANN_ALLOW_VOLUME_MODE_CHANGE: "maybe"},
        ),
        "is 'maybe', not a boolean",
    ),
    "wrong-api-group": Rejection(_wrong_group, "must have apiGroup snapshot.storage.k8s.io"),
    # Without the alpha gate (kube-apiserver's default) the cross-namespace dataSourceRef is
    # dropped on create and the claim is an ordinary one.
    "other-namespace": Rejection(
        _other_namespace,
        "cross-namespace data sources",
        feature_gate="CrossNamespaceVolumeDataSource",
    ),
}


@contextlib.asynccontextmanager
async def _cluster_with_gate(cluster: TestCluster, gate: str) -> AsyncIterator[TestCluster]:
    """``cluster``, with the alpha feature ``gate`` on. The in-memory server turns it on in
    place; a real control plane of ours is not shared with a gate on: a second one is started
    for the test (kube-apiserver, kube-controller-manager and kube-scheduler alike)."""
    if cluster.server is not None:
        cluster.server.feature_gates.add(gate)
        yield cluster
        return
    plane = cluster.control_plane
    if plane is None:
        pytest.skip(
            f"needs the alpha {gate} feature gate, which a cluster given by kubeconfig may not "
            "have on; run on PYPROVLIB_KUBE_ASSETS instead"
        )
    gates = f"--feature-gates={gate}=true"
    async with (
        ControlPlane.start(plane.assets, apiserver_args=[gates], nodes=1) as gated,
        TestCluster(control_plane=gated) as gated_cluster,
    ):
        yield gated_cluster


@pytest.mark.parametrize("case", list(REJECTIONS))
async def test_rejected_snapshot_source_is_reported_and_not_created(
    kube_cluster: TestCluster, sock_dir: pathlib.Path, case: str
) -> None:
    rejection = REJECTIONS[case]
    if rejection.no_snapshot_controller:
        kube_cluster.require_no_snapshot_controller(rejection.no_snapshot_controller)
    if rejection.feature_gate:
        async with _cluster_with_gate(kube_cluster, rejection.feature_gate) as cluster:
            await _check_rejection(cluster, sock_dir, case, rejection)
    else:
        await _check_rejection(kube_cluster, sock_dir, case, rejection)


async def _check_rejection(
    kube_cluster: TestCluster, sock_dir: pathlib.Path, case: str, rejection: Rejection
) -> None:
    async with csi_env(kube_cluster, sock_dir) as env:
        class_name, snap = await class_and_snapshot(env)
        extra = await rejection.setup(env, snap)
        claim = await create_claim(env, class_name, size="1Gi", **extra)
        name = claim["metadata"]["name"]
        try:
            event = await wait_event(
                env,
                name,
                "ProvisioningFailed",
                rejection.message.format(ns=kube_cluster.namespace),
            )
            assert class_name in event["message"]
            assert create_calls_for(env, claim) == []
            current = await get_volume(env, f"pvc-{claim['metadata']['uid']}")
            assert current is None
        finally:
            if case == "being-deleted":
                source = extra["dataSource"]["name"]
                await ResourceClient(kube_cluster.api_client, VOLUME_SNAPSHOTS).patch(
                    source,
                    {"metadata": {"finalizers": None}},
                    namespace=kube_cluster.namespace,
                )


async def test_populator_data_source_is_left_to_the_populator(
    kube_cluster: TestCluster, sock_dir: pathlib.Path
) -> None:
    """Upstream: a dataSourceRef of any other kind belongs to a volume populator — a Normal
    ``Provisioning`` event, no CreateVolume, no ProvisioningFailed, nothing retried."""
    async with csi_env(kube_cluster, sock_dir) as env:
        class_name = await create_class(env)
        source = {"apiGroup": "hello.example.com", "kind": "Hello", "name": "greeting"}
        claim = await create_claim(env, class_name, size="1Gi", dataSourceRef=source)
        name = claim["metadata"]["name"]
        event = await wait_event(
            env, name, "Provisioning", "Assuming an external populator will provision the volume"
        )
        assert event["type"] == "Normal"
        # A plain claim created afterwards is provisioned: the populator's claim was done with.
        plain = await create_claim(env, class_name, size="1Gi")
        await wait_bound(env, plain["metadata"]["name"])
        assert create_calls_for(env, claim) == []
        assert await get_volume(env, f"pvc-{claim['metadata']['uid']}") is None
        events = await events_of(env, name)
        assert not [e for e in events if e.get("reason") == "ProvisioningFailed"], events
        assert claim["metadata"]["uid"] not in env.controller.claims_in_progress()


async def test_volume_mode_change_allowed_by_annotation_or_option(
    kube_cluster: TestCluster, sock_dir: pathlib.Path
) -> None:
    async with csi_env(kube_cluster, sock_dir) as env:
        class_name, snap = await class_and_snapshot(env)
        claim, objects = await restore_claim(env, class_name, snap, source_volume_mode="Block")
        await wait_event(env, claim["metadata"]["name"], "ProvisioningFailed", "volume mode")
        # The owner of the snapshot allows the conversion: the retry restores it.
        await ResourceClient(kube_cluster.api_client, VOLUME_SNAPSHOT_CONTENTS).patch(
            objects.content,
            {"metadata": {"annotations": {ANN_ALLOW_VOLUME_MODE_CHANGE: "true"}}},
        )
        await wait_bound(env, claim["metadata"]["name"])

    options = CSIProvisionerOptions(prevent_volume_mode_conversion=False)
    async with csi_env(kube_cluster, sock_dir, options=options) as env:
        # A new driver (with a name of its own): a new class and a new snapshot.
        class_name = await create_class(env)
        snap = await snapshot_of_new_volume(env, class_name)
        claim, _ = await restore_claim(env, class_name, snap, source_volume_mode="Block")
        await wait_bound(env, claim["metadata"]["name"])


def test_prevent_volume_mode_conversion_flag() -> None:
    assert CSIProvisionerOptions().prevent_volume_mode_conversion is True
    assert build_parser().parse_args([]).prevent_volume_mode_conversion is True
    args = build_parser().parse_args(["--prevent-volume-mode-conversion=false"])
    assert args.prevent_volume_mode_conversion is False


async def test_driver_without_snapshot_capability(
    kube_cluster: TestCluster, sock_dir: pathlib.Path
) -> None:
    async with csi_env(kube_cluster, sock_dir, snapshots=False) as env:
        await require_snapshot_crds(env)
        class_name = await create_class(env)
        claim = await create_claim(env, class_name)
        bound = await wait_bound(env, claim["metadata"]["name"])
        pv = await get_volume(env, bound["spec"]["volumeName"])
        assert pv is not None
        snap = env.driver.take_snapshot(pv["spec"]["csi"]["volumeHandle"])
        objects = await create_snapshot(env, snap.snapshot_id)
        restore = await create_claim(env, class_name, dataSource=snapshot_source(objects.snapshot))
        await wait_event(
            env,
            restore["metadata"]["name"],
            "ProvisioningFailed",
            "does not support snapshot restore: controller CREATE_DELETE_SNAPSHOT capability "
            "is not reported",
        )
        assert create_calls_for(env, restore) == []


async def test_snapshot_that_becomes_ready_later_is_restored(
    kube_cluster: TestCluster, sock_dir: pathlib.Path
) -> None:
    async with csi_env(kube_cluster, sock_dir) as env:
        class_name, snap = await class_and_snapshot(env)
        claim, objects = await restore_claim(env, class_name, snap, ready=False)
        name = claim["metadata"]["name"]
        await wait_event(env, name, "ProvisioningFailed", "is not ready to use yet")
        assert create_calls_for(env, claim) == []
        await set_snapshot_status(
            env, objects, handle=snap.snapshot_id, ready=True, restore_size=snap.size
        )
        await wait_bound(env, name)
        assert restored_snapshot_id(env, claim) == snap.snapshot_id


async def test_driver_ignoring_the_snapshot_gets_its_volume_deleted(
    kube_cluster: TestCluster, sock_dir: pathlib.Path
) -> None:
    async with csi_env(kube_cluster, sock_dir) as env:
        class_name, snap = await class_and_snapshot(env)
        env.driver.drop_content_source = True
        claim, _ = await restore_claim(env, class_name, snap)
        name = claim["metadata"]["name"]
        await wait_event(env, name, "ProvisioningFailed", "volume content source missing")
        volume_name = f"pvc-{claim['metadata']['uid']}"
        await wait_until(
            env,
            lambda: volume_name not in env.driver.volumes and env.driver.requests("DeleteVolume"),
            "the volume without content deleted",
        )
        assert await get_volume(env, volume_name) is None
        env.driver.drop_content_source = False
        await wait_bound(env, name)


async def test_snapshot_is_protected_while_restoring_even_when_deleted(
    kube_cluster: TestCluster, sock_dir: pathlib.Path
) -> None:
    # CreateVolume outlives its timeout, so the restore stays in flight; the snapshot is
    # deleted meanwhile. The protection finalizer keeps it until the restore finished, and a
    # restore that started before the deletion is carried through (upstream's rule).
    async with csi_env(kube_cluster, sock_dir, call_timeout=0.3) as env:
        class_name, snap = await class_and_snapshot(env)
        # Every CreateVolume outlives the call timeout until the test opens the gate, once the
        # snapshot was deleted while protected (a fixed delay is a window the test may miss).
        gate = asyncio.Event()
        env.driver.fail("CreateVolume", Fault(gate=gate, times=10**6))
        claim, objects = await restore_claim(env, class_name, snap)
        uid = claim["metadata"]["uid"]
        await wait_until(env, lambda: uid in env.provisioner.in_flight, "restore in flight")

        async def protected() -> bool:
            current = await get_snapshot(env, objects.snapshot)
            return current is not None and SNAPSHOT_FINALIZER in (
                current["metadata"].get("finalizers") or []
            )

        await kube_cluster.wait_for(protected, message="snapshot-source finalizer added")
        await ResourceClient(kube_cluster.api_client, VOLUME_SNAPSHOTS).delete(
            objects.snapshot, kube_cluster.namespace
        )
        held = await get_snapshot(env, objects.snapshot)
        assert held is not None, "a snapshot being restored from went at once"
        assert held["metadata"].get("deletionTimestamp")
        gate.set()
        await wait_bound(env, claim["metadata"]["name"])

        async def gone() -> bool:
            return await get_snapshot(env, objects.snapshot) is None

        await kube_cluster.wait_for(gone, message="the deleted snapshot released and removed")


async def test_stale_snapshot_protection_is_swept(
    kube_cluster: TestCluster, sock_dir: pathlib.Path
) -> None:
    # A process that stopped mid-restore leaves the finalizer; the sweep removes it unless a
    # claim restoring from that snapshot is still pending.
    async with csi_env(kube_cluster, sock_dir, shared_informers=True) as env:
        await require_snapshot_crds(env)
        snapshots = ResourceClient(kube_cluster.api_client, VOLUME_SNAPSHOTS)
        ns = kube_cluster.namespace
        stale = await create_snapshot(env, "snap-x")
        kept = await create_snapshot(env, "snap-y")
        names = [stale.snapshot, kept.snapshot]
        await set_finalizers(snapshots, names, [SNAPSHOT_FINALIZER], ns)
        # A pending restore (its class does not exist, so it stays Pending) of ``kept``.
        await create_claim(env, "no-such-class", dataSource=snapshot_source(kept.snapshot))

        async def finalizers(objects: SnapshotObjects) -> list[str]:
            current = await get_snapshot(env, objects.snapshot)
            assert current is not None
            return list(current["metadata"].get("finalizers") or [])

        async def swept() -> bool:
            await env.provisioner.sweep_snapshot_protection()
            return SNAPSHOT_FINALIZER not in await finalizers(stale)

        await kube_cluster.wait_for(swept, message="stale finalizer removed")
        assert SNAPSHOT_FINALIZER in await finalizers(kept)
        await set_finalizers(snapshots, names, None, ns)


async def test_deleting_a_restored_claim_deletes_its_volume(
    kube_cluster: TestCluster, sock_dir: pathlib.Path
) -> None:
    async with csi_env(kube_cluster, sock_dir) as env:
        class_name, snap = await class_and_snapshot(env)
        claim, _ = await restore_claim(env, class_name, snap)
        bound = await wait_bound(env, claim["metadata"]["name"])
        handle = (await get_volume(env, bound["spec"]["volumeName"]) or {})["spec"]["csi"][
            "volumeHandle"
        ]
        await delete_claim(env, claim["metadata"]["name"])
        await wait_until(
            env,
            lambda: all(v.volume_id != handle for v in env.driver.volumes.values()),
            "restored volume deleted",
        )
        assert snap.snapshot_id in env.driver.snapshots  # the snapshot itself stays

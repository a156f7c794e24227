"""The PV binder (pyprovlib.testing._binder) against the in-memory API server, over HTTP with the
real kubernetes-asyncio client: provisioning annotations, WaitForFirstConsumer, binding,
Released/Lost, recovery from dropped watches, compaction and restarts, and odd objects."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from decimal import Decimal
from typing import Any, TypeVar

import pytest
import pytest_asyncio
from kubernetes_asyncio.client import ApiClient, CoreV1Api, StorageV1Api
from kubernetes_asyncio.client.exceptions import ApiException

from pyprovlib import testing
from pyprovlib.kube._clock import FakeClock
from pyprovlib.testing._binder import (
    ANN_BETA_STORAGE_PROVISIONER,
    ANN_BIND_COMPLETED,
    ANN_BOUND_BY_CONTROLLER,
    ANN_SELECTED_NODE,
    ANN_STORAGE_PROVISIONER,
    PVBinder,
    set_selected_node,
    storage_quantity,
)
from pyprovlib.testing._server import ApiServer

T = TypeVar("T")
NS = "binder-test"
PROVISIONER = "example.com/test-provisioner"
EXTERNAL_PROVISIONING = (
    f"Waiting for a volume to be created either by the external provisioner '{PROVISIONER}' or "
    "manually by the system administrator. If volume creation is delayed, please verify that "
    "the provisioner is running and correctly registered."
)


async def eventually(predicate: Callable[[], Awaitable[T]], what: str, timeout: float = 10.0) -> T:
    return await testing.eventually(predicate, timeout=timeout, message=what)


class Kube:
    """Thin typed-client helpers for these tests (raw dicts in, models out)."""

    def __init__(self, client: ApiClient) -> None:
        self.core = CoreV1Api(client)
        self.storage = StorageV1Api(client)

    async def namespace(self, name: str = NS) -> None:
        await self.core.create_namespace({"metadata": {"name": name}})

    async def storage_class(self, name: str, *, mode: str | None = None, **extra: Any) -> None:
        body: dict[str, Any] = {"metadata": {"name": name}, "provisioner": PROVISIONER, **extra}
        if mode:
            body["volumeBindingMode"] = mode
        await self.storage.create_storage_class(body)

    async def claim(
        self,
        name: str,
        cls: str | None,
        *,
        size: str = "1Gi",
        modes: tuple[str, ...] = ("ReadWriteOnce",),
        ns: str = NS,
        **spec: Any,
    ) -> Any:
        body: dict[str, Any] = {
            "metadata": {"name": name},
            "spec": {
                "accessModes": list(modes),
                "resources": {"requests": {"storage": size}},
                **spec,
            },
        }
        if cls is not None:
            body["spec"]["storageClassName"] = cls
        return await self.core.create_namespaced_persistent_volume_claim(ns, body)

    async def volume(
        self,
        name: str,
        *,
        cls: str = "fast",
        size: str = "1Gi",
        claim: Any = None,
        claim_uid: bool = True,
        policy: str = "Delete",
        modes: tuple[str, ...] = ("ReadWriteOnce",),
        annotations: dict[str, str] | None = None,
        labels: dict[str, str] | None = None,
    ) -> Any:
        spec: dict[str, Any] = {
            "storageClassName": cls,
            "capacity": {"storage": size},
            "accessModes": list(modes),
            "persistentVolumeReclaimPolicy": policy,
            "hostPath": {"path": f"/tmp/{name}"},
        }
        if claim is not None:
            ref = {
                "kind": "PersistentVolumeClaim",
                "apiVersion": "v1",
                "namespace": claim.metadata.namespace,
                "name": claim.metadata.name,
            }
            if claim_uid:
                ref["uid"] = claim.metadata.uid
            spec["claimRef"] = ref
        meta: dict[str, Any] = {"name": name, "annotations": annotations or {}}
        if labels:
            meta["labels"] = labels
        return await self.core.create_persistent_volume({"metadata": meta, "spec": spec})

    async def get_claim(self, name: str, ns: str = NS) -> Any:
        return await self.core.read_namespaced_persistent_volume_claim(name, ns)

    async def get_volume(self, name: str) -> Any:
        return await self.core.read_persistent_volume(name)

    async def events_for(self, name: str, ns: str = NS) -> list[Any]:
        events = await self.core.list_namespaced_event(ns)
        return [e for e in events.items if e.involved_object.name == name]

    async def claim_phase(self, name: str, phase: str, ns: str = NS) -> Any:
        claim = await self.get_claim(name, ns)
        return claim if claim.status.phase == phase else None

    async def volume_phase(self, name: str, phase: str) -> Any:
        volume = await self.get_volume(name)
        return volume if volume.status.phase == phase else None

    async def annotated(self, name: str, ns: str = NS) -> Any:
        claim = await self.get_claim(name, ns)
        ann = claim.metadata.annotations or {}
        return claim if ANN_STORAGE_PROVISIONER in ann else None

    async def event(self, name: str, reason: str, ns: str = NS) -> Any:
        for e in await self.events_for(name, ns):
            if e.reason == reason:
                return e
        return None


@pytest_asyncio.fixture
async def kube(apiserver_with_binder: ApiServer) -> AsyncIterator[Kube]:
    async with apiserver_with_binder.api_client() as client:
        k = Kube(client)
        await k.namespace()
        yield k


async def test_immediate_class_gets_provisioner_annotations_and_event(kube: Kube) -> None:
    await kube.storage_class("fast")
    await kube.claim("c1", "fast")

    claim = await eventually(lambda: kube.annotated("c1"), "provisioner annotations")
    ann = claim.metadata.annotations
    assert ann[ANN_STORAGE_PROVISIONER] == PROVISIONER
    assert ann[ANN_BETA_STORAGE_PROVISIONER] == PROVISIONER
    assert claim.status.phase == "Pending"
    assert claim.spec.volume_name is None

    event = await eventually(lambda: kube.event("c1", "ExternalProvisioning"), "event")
    assert event.type == "Normal"
    assert event.message == EXTERNAL_PROVISIONING
    assert event.source.component == "persistentvolume-controller"
    assert event.involved_object.kind == "PersistentVolumeClaim"
    assert event.involved_object.uid == claim.metadata.uid


async def test_legacy_class_annotation_is_honoured(kube: Kube) -> None:
    await kube.storage_class("legacy")
    await kube.core.create_namespaced_persistent_volume_claim(
        NS,
        {
            "metadata": {
                "name": "old",
                "annotations": {"volume.beta.kubernetes.io/storage-class": "legacy"},
            },
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
    )
    claim = await eventually(lambda: kube.annotated("old"), "annotations via beta class")
    assert claim.metadata.annotations[ANN_STORAGE_PROVISIONER] == PROVISIONER


async def test_wait_for_first_consumer_waits_for_selected_node(
    kube: Kube, apiserver_with_binder: ApiServer
) -> None:
    await kube.storage_class("late", mode="WaitForFirstConsumer")
    await kube.claim("c1", "late")

    event = await eventually(lambda: kube.event("c1", "WaitForFirstConsumer"), "WFFC event")
    assert event.message == "waiting for first consumer to be created before binding"
    assert event.type == "Normal"
    claim = await kube.get_claim("c1")
    assert ANN_STORAGE_PROVISIONER not in (claim.metadata.annotations or {})
    assert await kube.event("c1", "ExternalProvisioning") is None

    async with apiserver_with_binder.api_client() as client:
        patched = await set_selected_node(client, NS, "c1", "node-a")
    assert patched["metadata"]["annotations"][ANN_SELECTED_NODE] == "node-a"

    claim = await eventually(lambda: kube.annotated("c1"), "annotations after selected-node")
    assert claim.metadata.annotations[ANN_SELECTED_NODE] == "node-a"
    assert claim.metadata.annotations[ANN_BETA_STORAGE_PROVISIONER] == PROVISIONER
    await eventually(lambda: kube.event("c1", "ExternalProvisioning"), "ExternalProvisioning")


async def test_missing_class_reports_and_recovers_when_class_appears(kube: Kube) -> None:
    await kube.claim("c1", "nonexistent")
    event = await eventually(lambda: kube.event("c1", "ProvisioningFailed"), "failure event")
    assert event.type == "Warning"
    assert event.message == 'storageclass.storage.k8s.io "nonexistent" not found'
    claim = await kube.get_claim("c1")
    assert claim.status.phase == "Pending"
    assert ANN_STORAGE_PROVISIONER not in (claim.metadata.annotations or {})

    # The periodic resync picks the claim up once the class exists.
    await kube.storage_class("nonexistent")
    await eventually(lambda: kube.annotated("c1"), "annotations once the class exists")


async def test_claim_without_class_gets_failed_binding_event(kube: Kube) -> None:
    await kube.claim("c1", "")
    event = await eventually(lambda: kube.event("c1", "FailedBinding"), "FailedBinding")
    assert event.message == (
        "no persistent volumes available for this claim and no storage class is set"
    )
    claim = await kube.get_claim("c1")
    assert claim.status.phase == "Pending"
    assert ANN_STORAGE_PROVISIONER not in (claim.metadata.annotations or {})


async def test_default_class_is_assigned_to_claims_without_one(kube: Kube) -> None:
    await kube.storage_class(
        "standard",
        metadata={
            "name": "standard",
            "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
        },
    )
    await kube.claim("c1", None)
    claim = await eventually(lambda: kube.annotated("c1"), "default class provisioning")
    assert claim.spec.storage_class_name == "standard"
    assert claim.metadata.annotations[ANN_STORAGE_PROVISIONER] == PROVISIONER


async def test_pv_with_claim_ref_binds_both(kube: Kube) -> None:
    await kube.storage_class("fast")
    claim = await kube.claim("c1", "fast", size="1Gi", modes=("ReadWriteOnce", "ReadOnlyMany"))
    await eventually(lambda: kube.annotated("c1"), "annotations")
    await kube.volume(
        "pv-c1",
        size="2Gi",
        claim=claim,
        modes=("ReadWriteOnce", "ReadOnlyMany"),
        annotations={"pv.kubernetes.io/provisioned-by": PROVISIONER},
    )

    bound = await eventually(lambda: kube.claim_phase("c1", "Bound"), "claim Bound")
    assert bound.spec.volume_name == "pv-c1"
    assert bound.status.capacity == {"storage": "2Gi"}
    assert bound.status.access_modes == ["ReadWriteOnce", "ReadOnlyMany"]
    assert bound.metadata.annotations[ANN_BIND_COMPLETED] == "yes"
    assert bound.metadata.annotations[ANN_BOUND_BY_CONTROLLER] == "yes"

    volume = await eventually(lambda: kube.volume_phase("pv-c1", "Bound"), "PV Bound")
    # The provisioner bound the PV itself: the controller did not.
    assert ANN_BOUND_BY_CONTROLLER not in (volume.metadata.annotations or {})
    assert volume.spec.claim_ref.uid == claim.metadata.uid


async def test_prebound_pv_without_uid_is_completed(kube: Kube) -> None:
    claim = await kube.claim("c1", "")
    await kube.volume("pv-pre", cls="", claim=claim, claim_uid=False, policy="Retain")
    bound = await eventually(lambda: kube.claim_phase("c1", "Bound"), "claim Bound")
    assert bound.spec.volume_name == "pv-pre"
    volume = await eventually(lambda: kube.volume_phase("pv-pre", "Bound"), "PV Bound")
    assert volume.spec.claim_ref.uid == claim.metadata.uid


async def test_too_small_prebound_pv_is_not_bound(kube: Kube) -> None:
    claim = await kube.claim("c1", "")
    await kube.volume("pv-small", cls="", size="100Mi", claim=claim, claim_uid=False)
    volume = await eventually(lambda: kube.volume_phase("pv-small", "Available"), "Available")
    assert volume.spec.claim_ref.uid is None
    await eventually(lambda: kube.event("c1", "FailedBinding"), "FailedBinding on the claim")
    claim = await kube.get_claim("c1")
    assert claim.status.phase == "Pending"
    assert claim.spec.volume_name is None


async def test_claim_naming_an_available_pv_binds_it(kube: Kube) -> None:
    await kube.volume("pv-wanted", cls="manual", size="5Gi", policy="Retain")
    await eventually(lambda: kube.volume_phase("pv-wanted", "Available"), "PV Available")
    claim = await kube.claim("c1", "manual", volumeName="pv-wanted")

    bound = await eventually(lambda: kube.claim_phase("c1", "Bound"), "claim Bound")
    assert bound.status.capacity == {"storage": "5Gi"}
    # The user chose the volume: only the volume side is marked as the controller's doing.
    assert ANN_BOUND_BY_CONTROLLER not in bound.metadata.annotations
    assert bound.metadata.annotations[ANN_BIND_COMPLETED] == "yes"
    volume = await eventually(lambda: kube.volume_phase("pv-wanted", "Bound"), "PV Bound")
    assert volume.spec.claim_ref.uid == claim.metadata.uid
    assert volume.metadata.annotations[ANN_BOUND_BY_CONTROLLER] == "yes"


async def test_claim_naming_a_mismatched_pv_reports_it(kube: Kube) -> None:
    await kube.volume("pv-other-class", cls="other", size="5Gi", policy="Retain")
    await eventually(lambda: kube.volume_phase("pv-other-class", "Available"), "Available")
    await kube.claim("c1", "manual", volumeName="pv-other-class")
    event = await eventually(lambda: kube.event("c1", "VolumeMismatch"), "VolumeMismatch")
    assert event.type == "Warning"
    assert event.message == (
        'Cannot bind to requested volume "pv-other-class": storageClassName does not match'
    )
    assert (await kube.get_claim("c1")).status.phase == "Pending"
    assert (await kube.get_volume("pv-other-class")).spec.claim_ref is None


async def test_available_pv_is_bound_statically(kube: Kube) -> None:
    await kube.volume("pv-big", cls="manual", size="10Gi", policy="Retain")
    await kube.volume("pv-fit", cls="manual", size="2Gi", policy="Retain")
    await kube.volume("pv-other", cls="other", size="1Gi", policy="Retain")
    await eventually(lambda: kube.volume_phase("pv-fit", "Available"), "PV Available")
    await kube.claim("c1", "manual", size="1500Mi")

    bound = await eventually(lambda: kube.claim_phase("c1", "Bound"), "claim Bound")
    assert bound.spec.volume_name == "pv-fit"  # the smallest that fits, of the right class
    volume = await eventually(lambda: kube.volume_phase("pv-fit", "Bound"), "PV Bound")
    assert volume.metadata.annotations[ANN_BOUND_BY_CONTROLLER] == "yes"
    assert (await kube.get_volume("pv-big")).status.phase == "Available"


async def test_claim_deleted_releases_pv(kube: Kube) -> None:
    await kube.storage_class("fast")
    claim = await kube.claim("c1", "fast")
    await kube.volume("pv-c1", claim=claim, policy="Retain")
    await eventually(lambda: kube.volume_phase("pv-c1", "Bound"), "PV Bound")
    await kube.core.delete_namespaced_persistent_volume_claim("c1", NS)

    volume = await eventually(lambda: kube.volume_phase("pv-c1", "Released"), "PV Released")
    assert volume.spec.claim_ref.name == "c1"

    # A new claim with the same name is a different claim: the PV stays Released.
    await kube.claim("c1", "fast")
    await eventually(lambda: kube.annotated("c1"), "new claim annotated")
    assert (await kube.get_volume("pv-c1")).status.phase == "Released"
    assert (await kube.get_claim("c1")).spec.volume_name is None


async def test_pv_deleted_makes_claim_lost(kube: Kube) -> None:
    await kube.storage_class("fast")
    claim = await kube.claim("c1", "fast")
    await kube.volume("pv-c1", claim=claim)
    await eventually(lambda: kube.claim_phase("c1", "Bound"), "claim Bound")
    await kube.core.delete_persistent_volume("pv-c1")

    lost = await eventually(lambda: kube.claim_phase("c1", "Lost"), "claim Lost")
    assert lost.status.capacity is None
    assert lost.spec.volume_name == "pv-c1"
    event = await eventually(lambda: kube.event("c1", "ClaimLost"), "ClaimLost event")
    assert event.type == "Warning"
    assert event.message == "Bound claim has lost its PersistentVolume. Data on the volume is lost!"


async def test_delete_policy_without_external_provisioner_fails_volume(kube: Kube) -> None:
    claim = await kube.claim("c1", "")
    await kube.volume("pv-x", cls="", claim=claim, policy="Delete")
    await eventually(lambda: kube.volume_phase("pv-x", "Bound"), "PV Bound")
    await kube.core.delete_namespaced_persistent_volume_claim("c1", NS)
    volume = await eventually(lambda: kube.volume_phase("pv-x", "Failed"), "PV Failed")
    assert "no deletable volume plugin matched" in volume.status.message
    event = await eventually(lambda: kube.event("pv-x", "VolumeFailedDelete", "default"), "event")
    assert event.involved_object.kind == "PersistentVolume"


async def test_recovers_after_dropped_watches(kube: Kube, apiserver_with_binder: ApiServer) -> None:
    await kube.storage_class("fast")
    await kube.claim("before", "fast")
    await eventually(lambda: kube.annotated("before"), "first claim")
    for _ in range(3):
        apiserver_with_binder.drop_watches()
    await kube.claim("after", "fast")
    await eventually(lambda: kube.annotated("after"), "claim created after dropped watches")
    # The binder resumed its watches rather than giving up on them.
    await eventually(
        lambda: _async(apiserver_with_binder.requests.count(verb="watch") > 3), "re-watches"
    )


async def test_recovers_after_compaction(kube: Kube, apiserver_with_binder: ApiServer) -> None:
    server = apiserver_with_binder
    await kube.storage_class("fast")
    await kube.claim("c0", "fast")
    await eventually(lambda: kube.annotated("c0"), "c0 annotated")
    lists = server.requests.count(verb="list", resource="persistentvolumeclaims")
    watches = server.requests.count(verb="watch", resource="persistentvolumeclaims")
    # Hold the binder's next claim watch while history moves on and is compacted, so that it
    # resumes from a resourceVersion the server no longer keeps.
    server.faults.latency(0.5, verb="watch", resource="persistentvolumeclaims", count=1)
    server.drop_watches()
    await eventually(
        lambda: _async(
            server.requests.count(verb="watch", resource="persistentvolumeclaims") > watches
        ),
        "the binder re-watching",
    )
    await kube.claim("c1", "fast")
    server.compact()
    await eventually(lambda: kube.annotated("c1"), "c1 annotated after 410 Expired")
    assert server.requests.count(verb="list", resource="persistentvolumeclaims") > lists
    await kube.claim("c2", "fast")
    await eventually(lambda: kube.annotated("c2"), "c2 annotated on the new watch")


async def test_recovers_after_server_restart(kube: Kube, apiserver_with_binder: ApiServer) -> None:
    await kube.storage_class("fast")
    await kube.claim("before", "fast")
    await eventually(lambda: kube.annotated("before"), "first claim")
    await apiserver_with_binder.restart()
    await kube.claim("after", "fast")
    await eventually(lambda: kube.annotated("after"), "claim after restart", timeout=15)


async def test_conflicts_and_server_errors_are_retried(
    kube: Kube, apiserver_with_binder: ApiServer
) -> None:
    await kube.storage_class("fast")
    apiserver_with_binder.faults.fail(
        409, verb="update", resource="persistentvolumeclaims", count=2
    )
    apiserver_with_binder.faults.fail(
        500, verb="update", resource="persistentvolumeclaims/status", count=2
    )
    claim = await kube.claim("c1", "fast")
    await eventually(lambda: kube.annotated("c1"), "annotations despite 409s")
    await kube.volume("pv-c1", claim=claim)
    await eventually(lambda: kube.claim_phase("c1", "Bound"), "Bound despite 500s")


async def test_odd_objects_do_not_stop_the_binder(kube: Kube) -> None:
    await kube.storage_class("fast")
    await kube.storage_class("intree", provisioner="kubernetes.io/no-provisioner")
    # A claim in a class with an in-tree provisioner this binder has no plugin for.
    await kube.claim("intree", "intree")
    # A PV pointing at a claim in a namespace that does not exist.
    await kube.core.create_persistent_volume(
        {
            "metadata": {"name": "pv-orphan"},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "hostPath": {"path": "/tmp/o"},
                "claimRef": {"namespace": "nowhere", "name": "ghost", "uid": "1234"},
                "persistentVolumeReclaimPolicy": "Retain",
            },
        }
    )
    # A claim pre-bound to a volume that does not exist, and one with a label selector.
    await kube.claim("wants-missing", "", volumeName="no-such-pv")
    await kube.claim(
        "selective",
        "fast",
        selector={"matchExpressions": [{"key": "tier", "operator": "In", "values": ["gold"]}]},
    )

    event = await eventually(lambda: kube.event("intree", "ProvisioningFailed"), "in-tree fail")
    assert event.message == "no volume plugin matched name: kubernetes.io/no-provisioner"
    await eventually(lambda: kube.volume_phase("pv-orphan", "Released"), "orphan Released")
    # And ordinary work still gets done.
    claim = await kube.claim("normal", "fast")
    await eventually(lambda: kube.annotated("normal"), "normal claim annotated")
    await kube.volume("pv-normal", claim=claim)
    await eventually(lambda: kube.claim_phase("normal", "Bound"), "normal claim Bound")
    assert (await kube.get_claim("wants-missing")).status.phase == "Pending"


async def _async(value: T) -> T:
    return value


# --- a binder of our own, on a fake clock: resync and event repetition are deterministic ---


@pytest_asyncio.fixture
async def own(apiserver: ApiServer) -> AsyncIterator[tuple[Kube, PVBinder, FakeClock]]:
    clock = FakeClock()
    async with apiserver.api_client() as client, apiserver.api_client() as binder_client:
        k = Kube(client)
        await k.namespace()
        binder = PVBinder(binder_client, resync_period=2.0, event_interval=15.0, clock=clock)
        await binder.start()
        try:
            await asyncio.wait_for(binder.wait_for_sync(), 10)
            yield k, binder, clock
        finally:
            await binder.stop()


async def test_external_provisioning_event_is_repeated_at_a_bounded_rate(
    own: tuple[Kube, PVBinder, FakeClock],
) -> None:
    kube, binder, clock = own
    await kube.storage_class("fast")
    await kube.claim("c1", "fast")
    first = await eventually(lambda: kube.event("c1", "ExternalProvisioning"), "first event")
    assert first.count == 1

    # Several resyncs inside the interval: no new event, no new count.
    before = binder.resyncs
    for _ in range(5):
        await clock.advance(2.0)
    await eventually(lambda: _async(binder.resyncs >= before + 5), "five resyncs")
    await testing.wait_idle(binder)
    events = [e for e in await kube.events_for("c1") if e.reason == "ExternalProvisioning"]
    assert len(events) == 1
    assert events[0].count == 1

    # Past the interval the same event is counted again, not duplicated.
    for _ in range(3):
        await clock.advance(2.0)

    async def counted() -> Any:
        evs = [e for e in await kube.events_for("c1") if e.reason == "ExternalProvisioning"]
        return evs if len(evs) == 1 and evs[0].count == 2 else None

    await eventually(counted, "event count 2 on the same event")


async def test_a_server_exposes_its_binder_while_it_runs() -> None:
    server = ApiServer(binder=True)
    assert server.binder is None
    async with server:
        binder = server.binder
        assert isinstance(binder, PVBinder)
        await asyncio.wait_for(binder.wait_for_sync(), 10)
        await testing.wait_idle(binder)
    assert server.binder is None
    async with ApiServer() as plain:
        assert plain.binder is None


async def test_resyncs_count_the_periodic_passes(own: tuple[Kube, PVBinder, FakeClock]) -> None:
    _, binder, clock = own
    before = binder.resyncs
    await clock.advance(1.0)
    assert binder.resyncs == before  # not a period yet
    await clock.advance(1.0)
    await eventually(lambda: _async(binder.resyncs == before + 1), "one resync")


async def test_stop_cancels_everything(apiserver: ApiServer) -> None:
    async with apiserver.api_client() as client:
        binder = PVBinder(client)
        await binder.start()
        await asyncio.wait_for(binder.wait_for_sync(), 10)
        tasks = list(binder._tasks)
        assert tasks
        assert not any(t.done() for t in tasks)
        await binder.stop()
        assert all(t.done() for t in tasks)
        with pytest.raises(ApiException):
            # The server is still there; only the binder stopped.
            await CoreV1Api(client).read_namespace("nope")


async def test_many_claims_bind_with_a_bounded_number_of_requests(
    own: tuple[Kube, PVBinder, FakeClock], apiserver: ApiServer
) -> None:
    kube, binder, _ = own
    await kube.storage_class("fast")
    n = 150
    claims = [await kube.claim(f"c{i}", "fast") for i in range(n)]

    async def all_annotated() -> bool:
        return (
            all(
                ANN_STORAGE_PROVISIONER
                in (binder.claims.cache[f"{NS}/c{i}"]["metadata"].get("annotations") or {})
                for i in range(n)
                if f"{NS}/c{i}" in binder.claims.cache
            )
            and len(binder.claims.cache) == n
        )

    await eventually(all_annotated, "all claims annotated", timeout=30)
    for i, claim in enumerate(claims):
        await kube.volume(f"pv-{i}", claim=claim)

    async def all_bound() -> bool:
        listed = await kube.core.list_namespaced_persistent_volume_claim(NS)
        return sum(c.status.phase == "Bound" for c in listed.items) == n

    await eventually(all_bound, "all claims Bound", timeout=60)
    # Per claim: annotate (update), event, PV status, claim bind (update), claim status.
    writes = apiserver.requests.count(verb="update") + apiserver.requests.count(
        verb="create", resource="events"
    )
    assert writes <= 6 * n, apiserver.requests.snapshot()
    # No per-claim reads: everything comes from the watch caches.
    assert apiserver.requests.count(verb="get", resource="persistentvolumeclaims") == 0


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1Gi", 2**30),
        ("500M", 500_000_000),
        ("1e3", 1000),
        ("1E", 10**18),
        ("100m", Decimal("0.1")),
        ("2", 2),
        (3, 3),
        ("1.5Ki", 1536),
        ("bogus", None),
        ("", None),
        (None, None),
        (True, None),
    ],
)
def test_storage_quantity(text: Any, value: int | Decimal | None) -> None:
    # The binder reads sizes with pyprovlib.kube._quantity; what is not a quantity reads as absent.
    parsed = storage_quantity({"storage": text})
    if value is None:
        assert parsed is None
    else:
        assert parsed is not None
        assert Decimal(parsed.nanos) / 10**9 == value

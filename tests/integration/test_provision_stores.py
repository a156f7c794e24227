"""The volume stores that save provisioned PVs (upstream's volume_store.go), driven through the
in-memory API server's fault injection.

Upstream scenarios covered: "try to provision for claim-1 but fail to save the pv object"
(backoff store: the asset is deleted again, ProvisioningFailed, then a later retry succeeds),
cleanup failing too (ProvisioningCleanupFailed), AlreadyExists counting as saved, "PV save
backoff: provision a PV and fail to save it -> it's in the queue" and "... fail to save it two
times -> it's removed from the queue" (queue store), plus the queue store's last attempt on a
graceful stop.
"""

from __future__ import annotations

import asyncio

import pytest
from claim_support import create_claim, get_volume, volume_body
from kubernetes_asyncio.client import V1PersistentVolume
from prometheus_client import CollectorRegistry
from provision_support import MemoryProvisioner, controller_for, fast_options

from pyprovlib.controller._options import Backoff, ProvisionControllerOptions
from pyprovlib.controller._volume_store import BackoffStore, QueueStore, VolumeSaveError
from pyprovlib.kube._clock import FakeClock
from pyprovlib.kube._events import EventRecorder
from pyprovlib.kube._objects import Obj
from pyprovlib.kube._resources import EVENTS, PERSISTENT_VOLUME_CLAIMS, PERSISTENT_VOLUMES
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.kube._store import Indexer
from pyprovlib.kube._workqueue import ItemExponentialFailureRateLimiter
from pyprovlib.testing import running, wait_bound, wait_event, wait_idle
from pyprovlib.testing._cluster import TestCluster
from pyprovlib.testing._server import ApiServer


async def test_backoff_store_deletes_the_asset_when_the_pv_cannot_be_saved(
    kube_cluster: TestCluster,
) -> None:
    kube_cluster.require_in_memory("injects API failures")
    server = kube_cluster.server
    assert server is not None
    provisioner = MemoryProvisioner()
    # Give up after two attempts, so the asset count can be checked at rest.
    options = fast_options(failed_provision_threshold=1)
    controller, class_name = await controller_for(kube_cluster, provisioner, options)
    server.faults.fail(500, verb="create", resource="persistentvolumes", count=None)
    async with running(controller):
        claim = await create_claim(kube_cluster, class_name)
        claim_name = claim["metadata"]["name"]
        pv_name = f"pvc-{claim['metadata']['uid']}"
        event = await wait_event(
            kube_cluster, claim_name, "ProvisioningFailed", "Error creating provisioned PV object"
        )
        assert event["message"].endswith("Deleting the volume.")
        assert f"{kube_cluster.namespace}/{claim_name}" in event["message"]

        async def given_up() -> bool:
            return len(provisioner.deleted) == 2

        await kube_cluster.wait_for(given_up, message="two attempts, each cleaned up")
        # Given up: no retry waits out a delay either.
        await wait_idle(controller, claim, count_delayed=True)
        assert len(provisioner.calls) == 2
        assert provisioner.assets == {}
        # 3 save attempts per provisioning attempt (create_provisioned_pv_retry_count).
        assert server.requests.count("create", "persistentvolumes") == 6

        server.faults.clear()
        # A change of the claim brings it back.
        await ResourceClient(kube_cluster.api_client, PERSISTENT_VOLUME_CLAIMS).patch(
            claim_name, {"metadata": {"labels": {"retry": "1"}}}, namespace=kube_cluster.namespace
        )
        await wait_bound(kube_cluster, claim_name)
        assert list(provisioner.assets) == [pv_name]


async def test_backoff_store_reports_a_failed_cleanup(kube_cluster: TestCluster) -> None:
    kube_cluster.require_in_memory("injects API failures")
    server = kube_cluster.server
    assert server is not None

    class Undeletable(MemoryProvisioner):
        async def delete(self, volume: V1PersistentVolume) -> None:
            raise RuntimeError("backend unreachable")

    provisioner = Undeletable()
    controller, class_name = await controller_for(
        kube_cluster, provisioner, fast_options(failed_provision_threshold=1)
    )
    server.faults.fail(503, verb="create", resource="persistentvolumes", count=None)
    async with running(controller):
        claim = await create_claim(kube_cluster, class_name)
        event = await wait_event(
            kube_cluster,
            claim["metadata"]["name"],
            "ProvisioningCleanupFailed",
            "backend unreachable",
        )
        assert event["message"].endswith("Please delete manually.")


async def test_backoff_store_counts_already_exists_as_saved(apiserver: ApiServer) -> None:
    async with apiserver.api_client() as api:
        recorder = EventRecorder(api, "test-store")
        store = BackoffStore(api, recorder, Backoff(duration=0.01, steps=2), MemoryProvisioner())
        claim: Obj = {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "c", "namespace": "default", "uid": "u-1"},
        }
        volume = volume_body("pvc-u-1")
        async with asyncio.TaskGroup() as tg:
            writer = tg.create_task(recorder.run())
            await store.store_volume(claim, volume)
            await store.store_volume(claim, volume)  # AlreadyExists: success again
            assert apiserver.requests.count("create", "persistentvolumes") == 2
            assert await recorder.flush(5)
            writer.cancel()
        events = await ResourceClient(api, EVENTS).list("default")
        succeeded = [e for e in events["items"] if e["reason"] == "ProvisioningSucceeded"]
        assert succeeded
        assert sum(e.get("count", 1) for e in succeeded) == 2

        # An invalid PV is not retried: the request can never succeed.
        apiserver.requests.reset()
        bad = {**volume, "metadata": {"name": "Not A Valid Name"}}
        with pytest.raises(VolumeSaveError, match="Not A Valid Name"):
            await store.store_volume(claim, bad)
        assert apiserver.requests.count("create", "persistentvolumes") == 1


async def _store_once(
    apiserver: ApiServer, provisioner: MemoryProvisioner
) -> tuple[VolumeSaveError | None, list[Obj]]:
    """One ``store_volume`` of ``pvc-u-1`` through a BackoffStore of two attempts: what it
    raised, and the events it wrote."""
    async with apiserver.api_client() as api:
        recorder = EventRecorder(api, "test-store")
        store = BackoffStore(api, recorder, Backoff(duration=0.01, steps=2), provisioner)
        claim: Obj = {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "c", "namespace": "default", "uid": "u-1"},
        }
        raised: VolumeSaveError | None = None
        async with asyncio.TaskGroup() as tg:
            writer = tg.create_task(recorder.run())
            try:
                await store.store_volume(claim, volume_body("pvc-u-1"))
            except VolumeSaveError as err:
                raised = err
            apiserver.faults.clear()
            assert await recorder.flush(5)
            writer.cancel()
        events = await ResourceClient(api, EVENTS).list("default")
        return raised, list(events["items"])


async def test_backoff_store_keeps_a_pv_whose_create_was_answered_with_an_error(
    apiserver: ApiServer,
) -> None:
    """A create the server carried out but answered with a 504 (or whose answer was lost),
    then failures until the attempts run out: the PV is there, so its asset must stay."""
    provisioner = MemoryProvisioner({"pvc-u-1": {"size": "1Gi"}})
    apiserver.faults.fail(504, applied=True, verb="create", resource="persistentvolumes")
    apiserver.faults.fail(500, verb="create", resource="persistentvolumes", count=None)
    raised, events = await _store_once(apiserver, provisioner)
    assert raised is None
    assert apiserver.requests.count("create", "persistentvolumes") == 2
    assert provisioner.deleted == []
    assert list(provisioner.assets) == ["pvc-u-1"]
    assert apiserver.storage.get("persistentvolumes", None, "pvc-u-1") is not None
    assert [e["reason"] for e in events] == ["ProvisioningSucceeded"]


async def test_backoff_store_keeps_the_asset_when_it_cannot_tell_whether_the_pv_was_saved(
    apiserver: ApiServer,
) -> None:
    """Every create fails and the read-back gets no good answer either: deleting the asset
    could delete the data of a PV that was written, so the volume is kept and said so."""
    provisioner = MemoryProvisioner({"pvc-u-1": {"size": "1Gi"}})
    apiserver.faults.fail(503, verb="create", resource="persistentvolumes", count=None)
    apiserver.faults.fail(503, verb="get", resource="persistentvolumes", count=None)
    raised, events = await _store_once(apiserver, provisioner)
    assert raised is not None
    assert "volume is kept" in str(raised)
    assert provisioner.deleted == []
    assert list(provisioner.assets) == ["pvc-u-1"]
    [event] = events
    assert event["reason"] == "ProvisioningFailed"
    assert "the volume is kept and provisioning will be retried" in event["message"]


async def test_backoff_store_does_not_delete_the_asset_of_another_claims_pv(
    apiserver: ApiServer,
) -> None:
    """A PV of the same name that belongs to another claim: saving ours failed, but the asset
    of that name is the other PV's data and stays."""
    provisioner = MemoryProvisioner({"pvc-u-1": {"size": "1Gi"}})
    other = volume_body("pvc-u-1")
    other["spec"]["claimRef"] = {"namespace": "default", "name": "other", "uid": "u-2"}
    async with apiserver.api_client() as api:
        await ResourceClient(api, PERSISTENT_VOLUMES).create(other)
    apiserver.faults.fail(500, verb="create", resource="persistentvolumes", count=None)
    raised, events = await _store_once(apiserver, provisioner)
    assert raised is not None
    assert "volume is kept" in str(raised)
    assert provisioner.deleted == []
    [event] = events
    assert "exists for another claim (default/other)" in event["message"]


def queue_store_options(limiter: ItemExponentialFailureRateLimiter) -> ProvisionControllerOptions:
    """Options that save PVs through the QueueStore (no blocking retries), retried by
    ``limiter``."""
    return fast_options(
        create_provisioned_pv_retry_count=None,
        create_provisioned_pv_interval=None,
        create_provisioned_pv_limiter=limiter,
    )


async def test_queue_store_keeps_retrying_in_the_background(kube_cluster: TestCluster) -> None:
    kube_cluster.require_in_memory("injects API failures")
    server = kube_cluster.server
    assert server is not None
    provisioner = MemoryProvisioner()
    options = queue_store_options(ItemExponentialFailureRateLimiter(0.01, 0.05))
    controller, class_name = await controller_for(kube_cluster, provisioner, options)
    assert isinstance(controller.volume_store, QueueStore)
    server.faults.fail(500, verb="create", resource="persistentvolumes", count=3)
    async with running(controller):
        claim = await create_claim(kube_cluster, class_name)
        claim_name = claim["metadata"]["name"]
        await wait_bound(kube_cluster, claim_name)
        await wait_event(kube_cluster, claim_name, "ProvisioningSucceeded")
        assert controller.volume_store.pending == {}
        assert provisioner.deleted == []
        assert server.requests.count("create", "persistentvolumes") >= 4


async def test_queue_store_makes_a_last_attempt_on_graceful_stop(
    kube_cluster: TestCluster,
) -> None:
    kube_cluster.require_in_memory("injects API failures")
    server = kube_cluster.server
    assert server is not None
    provisioner = MemoryProvisioner()
    # Retries far in the future: only the stop's last attempt can save the PV in time.
    options = queue_store_options(ItemExponentialFailureRateLimiter(600.0, 600.0))
    controller, class_name = await controller_for(kube_cluster, provisioner, options)
    store = controller.volume_store
    assert isinstance(store, QueueStore)
    server.faults.fail(500, verb="create", resource="persistentvolumes", count=None)
    task = asyncio.create_task(controller.run())
    try:
        claim = await create_claim(kube_cluster, class_name)
        pv_name = f"pvc-{claim['metadata']['uid']}"

        async def queued() -> bool:
            return pv_name in store.pending

        await kube_cluster.wait_for(queued, message="PV waiting in the queue store")
        server.faults.clear()
    finally:
        controller.stop()
        async with asyncio.timeout(20):
            await task
    assert store.pending == {}
    assert await get_volume(kube_cluster.api_client, pv_name) is not None


async def test_queue_store_success_event_needs_the_claim_in_the_cache(
    apiserver: ApiServer,
) -> None:
    async with apiserver.api_client() as api:
        recorder = EventRecorder(api, "test-store", registry=CollectorRegistry())
        store = QueueStore(api, ItemExponentialFailureRateLimiter(0.01, 0.1), Indexer(), recorder)
        volume = volume_body(
            "pvc-orphan", claimRef={"namespace": "default", "name": "c", "uid": "not-cached"}
        )
        await store.store_volume({}, volume)
        assert await ResourceClient(api, PERSISTENT_VOLUMES).get("pvc-orphan")
        # No claim with that UID in the cache: nothing to attach an event to.
        assert recorder.pending == 0


async def test_backoff_store_follows_the_default_schedule_on_a_fake_clock(
    apiserver: ApiServer,
) -> None:
    """Upstream's default: 5 attempts 10 s apart, then the asset is deleted (also retried on
    that schedule) — checked on a FakeClock, so no real time passes."""
    clock = FakeClock()
    provisioner = MemoryProvisioner({"pvc-u-2": {}})
    apiserver.faults.fail(500, verb="create", resource="persistentvolumes", count=None)
    async with apiserver.api_client() as api:
        recorder = EventRecorder(api, "test-store", registry=CollectorRegistry(), clock=clock)
        store = BackoffStore(
            api, recorder, ProvisionControllerOptions().pv_backoff, provisioner, clock=clock
        )
        volume: Obj = {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": "pvc-u-2"},
            "spec": {"capacity": {"storage": "1Gi"}, "hostPath": {"path": "/tmp/y"}},
        }
        claim: Obj = {"metadata": {"name": "c", "namespace": "default", "uid": "u-2"}}
        task = asyncio.create_task(store.store_volume(claim, volume))

        async def attempts(n: int) -> None:
            async with asyncio.timeout(10):
                while apiserver.requests.count("create", "persistentvolumes") < n:
                    await asyncio.sleep(0.005)

        for n in range(1, 6):
            await attempts(n)
            assert apiserver.requests.count("create", "persistentvolumes") == n
            if n < 5:
                assert not task.done()
                # The server counts the request before the store sees the 500 and goes to
                # sleep; advancing before that sleep is registered would skip it.
                async with asyncio.timeout(10):
                    while clock.next_deadline() is None:
                        await asyncio.sleep(0.005)
                await clock.advance(10.0)
        # the API error as its Status message, as upstream's err.Error() reads (issue 29)
        with pytest.raises(VolumeSaveError, match="Internal error occurred: injected fault"):
            async with asyncio.timeout(10):
                await task
        assert clock.monotonic() == 40.0
        assert provisioner.deleted == ["pvc-u-2"]
        assert provisioner.assets == {}
        # One event queued: ProvisioningFailed (no ProvisioningCleanupFailed).
        assert recorder.pending == 1

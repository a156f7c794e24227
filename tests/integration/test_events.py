"""EventRecorder against the in-memory API server: what lands in the API, correlation by
PATCH, aggregation, spam filtering, and failure handling that never reaches the caller."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from event_support import dropped, recorder_running
from kubernetes_asyncio.client import ApiClient, V1ObjectMeta, V1PersistentVolumeClaim
from prometheus_client import CollectorRegistry

from pyprovlib.kube._clock import FakeClock
from pyprovlib.kube._events import EventRecorder
from pyprovlib.testing import eventually
from pyprovlib.testing._server import ApiServer

PVC: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "PersistentVolumeClaim",
    "metadata": {"name": "claim-1", "namespace": "ns1", "uid": "uid-1", "resourceVersion": "3"},
}


async def _wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    await eventually(predicate, timeout=timeout, interval=0.005)


def _recorder(
    client: ApiClient, clock: FakeClock, registry: CollectorRegistry, **kw: Any
) -> EventRecorder:
    return EventRecorder(client, "test-provisioner", clock=clock, registry=registry, **kw)


async def test_event_written_with_client_go_shape(
    apiserver: ApiServer, kube_client: ApiClient
) -> None:
    clock, registry = FakeClock(), CollectorRegistry()
    rec = _recorder(kube_client, clock, registry, host="node-a")
    async with recorder_running(kube_client, rec, "ns1", "ns2"):
        rec.event(PVC, "Normal", "Provisioning", "External provisioner is provisioning")
        assert await rec.flush(30)
    (ev,) = apiserver.storage.list("events", "ns1")
    assert ev["involvedObject"] == {
        "kind": "PersistentVolumeClaim",
        "apiVersion": "v1",
        "name": "claim-1",
        "namespace": "ns1",
        "uid": "uid-1",
        "resourceVersion": "3",
    }
    assert ev["reason"] == "Provisioning"
    assert ev["type"] == "Normal"
    assert ev["message"] == "External provisioner is provisioning"
    assert ev["source"] == {"component": "test-provisioner", "host": "node-a"}
    assert ev["reportingComponent"] == "test-provisioner"
    assert ev["reportingInstance"] == "node-a"
    assert ev["count"] == 1
    assert ev["firstTimestamp"] == ev["lastTimestamp"] == "2026-01-01T00:00:00Z"
    assert ev["metadata"]["name"].startswith("claim-1.")


async def test_identical_events_are_counted_by_patch(
    apiserver: ApiServer, kube_client: ApiClient
) -> None:
    clock, registry = FakeClock(), CollectorRegistry()
    rec = _recorder(kube_client, clock, registry)
    async with recorder_running(kube_client, rec, "ns1", "ns2"):
        rec.event(PVC, "Warning", "ProvisioningFailed", "backend unavailable")
        assert await rec.flush(30)
        await clock.advance(65)
        rec.event(PVC, "Warning", "ProvisioningFailed", "backend unavailable")
        assert await rec.flush(30)
    (ev,) = apiserver.storage.list("events", "ns1")
    assert ev["count"] == 2
    assert ev["firstTimestamp"] == "2026-01-01T00:00:00Z"
    assert ev["lastTimestamp"] == "2026-01-01T00:01:05Z"
    assert apiserver.requests.count("create", "events") == 1
    assert apiserver.requests.count("patch", "events") == 1


async def test_patch_of_deleted_event_creates_it_again(
    apiserver: ApiServer, kube_client: ApiClient
) -> None:
    clock, registry = FakeClock(), CollectorRegistry()
    rec = _recorder(kube_client, clock, registry)
    async with recorder_running(kube_client, rec, "ns1", "ns2"):
        rec.event(PVC, "Normal", "R", "m")
        assert await rec.flush(30)
        (ev,) = apiserver.storage.list("events", "ns1")
        await kube_client.call_api(
            f"/api/v1/namespaces/ns1/events/{ev['metadata']['name']}",
            "DELETE",
            auth_settings=["BearerToken"],
            response_types_map={},
        )
        assert apiserver.storage.list("events", "ns1") == []
        rec.event(PVC, "Normal", "R", "m")
        assert await rec.flush(30)
    (again,) = apiserver.storage.list("events", "ns1")
    assert again["count"] == 2
    assert apiserver.requests.count("patch", "events") == 1
    assert apiserver.requests.count("create", "events") == 2


async def test_similar_events_are_aggregated(apiserver: ApiServer, kube_client: ApiClient) -> None:
    clock, registry = FakeClock(), CollectorRegistry()
    rec = _recorder(kube_client, clock, registry)
    async with recorder_running(kube_client, rec, "ns1", "ns2"):
        for i in range(12):
            rec.event(PVC, "Warning", "ProvisioningFailed", f"attempt {i} failed")
        assert await rec.flush(30)
    events = apiserver.storage.list("events", "ns1")
    combined = [e for e in events if e["message"].startswith("(combined from similar events)")]
    assert len(events) == 10
    assert len(combined) == 1
    assert combined[0]["count"] == 3
    assert combined[0]["message"] == "(combined from similar events): attempt 11 failed"


async def test_spam_filter_drops_and_counts(apiserver: ApiServer, kube_client: ApiClient) -> None:
    clock, registry = FakeClock(), CollectorRegistry()
    rec = _recorder(kube_client, clock, registry)
    async with recorder_running(kube_client, rec, "ns1", "ns2"):
        for i in range(30):
            rec.event(PVC, "Normal", f"Reason{i}", "m")
        assert await rec.flush(30)
    assert len(apiserver.storage.list("events", "ns1")) == 25
    assert dropped(registry, "spam") == 5


async def test_cluster_scoped_object_and_model_input(
    apiserver: ApiServer, kube_client: ApiClient
) -> None:
    clock, registry = FakeClock(), CollectorRegistry()
    pv = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pv-1", "uid": "u"}}
    model = V1PersistentVolumeClaim(
        metadata=V1ObjectMeta(name="claim-m", namespace="ns2", uid="uid-m")
    )
    rec = _recorder(kube_client, clock, registry)
    async with recorder_running(kube_client, rec, "ns1", "ns2"):
        rec.event(pv, "Normal", "VolumeDeleted", "gone")
        rec.event(model, "Normal", "Provisioning", "from a model")
        assert await rec.flush(30)
    (pv_event,) = apiserver.storage.list("events", "default")
    assert pv_event["involvedObject"]["kind"] == "PersistentVolume"
    assert "namespace" not in pv_event["involvedObject"]
    (model_event,) = apiserver.storage.list("events", "ns2")
    assert model_event["involvedObject"]["kind"] == "PersistentVolumeClaim"
    assert model_event["involvedObject"]["apiVersion"] == "v1"
    assert model_event["involvedObject"]["uid"] == "uid-m"


async def test_api_down_retries_then_drops_and_recovers(
    apiserver: ApiServer, kube_client: ApiClient
) -> None:
    clock, registry = FakeClock(), CollectorRegistry()
    apiserver.faults.fail(500, verb="create", resource="events", count=None)
    rec = _recorder(kube_client, clock, registry, max_tries=4, retry_sleep=10.0)
    async with recorder_running(kube_client, rec, "ns1", "ns2"):
        rec.event(PVC, "Warning", "ProvisioningFailed", "x")
        for attempt in range(1, 4):

            def tried(a: int = attempt) -> bool:
                return apiserver.requests.count("create", "events") == a

            await _wait_for(tried)
            await _wait_for(lambda: clock.waiters > 0)
            await clock.advance(10)
        await _wait_for(lambda: dropped(registry, "retries") == 1)
        assert apiserver.requests.count("create", "events") == 4
        assert apiserver.storage.list("events", "ns1") == []

        apiserver.faults.clear()
        rec.event(PVC, "Normal", "Provisioned", "ok")
        assert await rec.flush(30)
    (ev,) = apiserver.storage.list("events", "ns1")
    assert ev["reason"] == "Provisioned"


async def test_rejected_event_is_not_retried(apiserver: ApiServer, kube_client: ApiClient) -> None:
    clock, registry = FakeClock(), CollectorRegistry()
    apiserver.faults.fail(403, verb="create", resource="events", count=1)
    rec = _recorder(kube_client, clock, registry)
    async with recorder_running(kube_client, rec, "ns1", "ns2"):
        rec.event(PVC, "Normal", "R", "m")
        assert await rec.flush(30)
    assert apiserver.requests.count("create", "events") == 1
    assert dropped(registry, "rejected") == 1


async def test_full_buffer_drops_without_blocking(
    apiserver: ApiServer, kube_client: ApiClient
) -> None:
    clock, registry = FakeClock(), CollectorRegistry()
    rec = _recorder(kube_client, clock, registry, max_buffer=5)
    # Not running yet: the buffer fills and event() returns at once each time.
    for i in range(8):
        rec.event(PVC, "Normal", f"R{i}", "m")
    assert dropped(registry, "buffer_full") == 3
    async with recorder_running(kube_client, rec, "ns1", "ns2"):
        assert await rec.flush(30)
    assert len(apiserver.storage.list("events", "ns1")) == 5


async def test_cancel_counts_unwritten_events(apiserver: ApiServer, kube_client: ApiClient) -> None:
    clock, registry = FakeClock(), CollectorRegistry()
    apiserver.faults.fail(503, verb="create", resource="events", count=None)
    rec = _recorder(kube_client, clock, registry)
    async with recorder_running(kube_client, rec, "ns1", "ns2"):
        for i in range(3):
            rec.event(PVC, "Normal", f"R{i}", "m")
        await _wait_for(lambda: apiserver.requests.count("create", "events") == 1)
    # The one being retried and the two behind it are all accounted for.
    assert dropped(registry, "shutdown") == 3
    assert rec.pending == 0

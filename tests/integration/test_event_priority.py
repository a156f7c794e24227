"""EventRecorder's writers yield to the owning controller's work (``busy``): held back while it
holds (but for ``busy_writers``), released when it clears, forced above ``hold_limit``, and
never losing an event to it: flush and a stop still write or account for every one. Then the
wiring: the ProvisionController's predicate, and a burst of claims whose events are all
written (the ResizeController's: tests/resize/test_event_priority_resize.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from claim_support import create_claim
from event_support import busy_while_queued, dropped, held_recorder, recorder_running
from kubernetes_asyncio.client import ApiClient
from prometheus_client import CollectorRegistry
from provision_support import MemoryProvisioner, create_class, fast_options

from pyprovlib.controller._provision import ProvisionController
from pyprovlib.kube._config import request_json
from pyprovlib.kube._events import CONTROLLER_WRITERS, EventRecorder
from pyprovlib.kube._objects import Obj
from pyprovlib.testing import eventually, running, wait_bound
from pyprovlib.testing._cluster import TestCluster
from pyprovlib.testing._server import ApiServer

NS = "prio"


def claim(i: int) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": f"claim-{i}", "namespace": NS, "uid": f"uid-{i}"},
    }


class CountingRecorder(EventRecorder):
    """Counts the writes in flight at once and remembers the order of the writes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.in_flight = 0
        self.max_in_flight = 0
        self.order: list[tuple[str, str]] = []

    async def _write(self, event: Obj, patch: Obj | None) -> str:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self.order.append((str(event["involvedObject"]["uid"]), str(event["reason"])))
        try:
            return await super()._write(event, patch)
        finally:
            self.in_flight -= 1


def written(apiserver: ApiServer) -> int:
    return len(apiserver.storage.list("events", NS))


async def all_parked(rec: EventRecorder) -> None:
    """Every writer waits for an event to take: none is writing, none about to."""
    await eventually(lambda: rec.parked_writers == rec.writers, message="every writer parked")


async def test_writes_are_held_while_busy_and_resume_when_it_clears(
    apiserver: ApiServer, kube_client: ApiClient
) -> None:
    registry = CollectorRegistry()
    busy, rec = held_recorder(kube_client, EventRecorder, registry=registry)
    async with recorder_running(kube_client, rec, NS):
        for i in range(6):
            rec.event(claim(i), "Normal", "Provisioning", f"provisioning {i}")
        await all_parked(rec)
        assert written(apiserver) == 0
        assert rec.pending == 6

        # Cleared, but nobody said so: the writers do not poll, so they stay parked...
        busy.value = False
        await all_parked(rec)
        assert rec.pending == 6
        # ...until told (the controller's workers call wake after each item).
        rec.wake()
        await eventually(lambda: written(apiserver) == 6, message="6 events written")

        # Recording re-evaluates the predicate too: busy again holds, clear again releases.
        busy.value = True
        rec.event(claim(10), "Normal", "Provisioning", "provisioning 10")
        await all_parked(rec)
        assert written(apiserver) == 6
        busy.value = False
        rec.event(claim(11), "Normal", "Provisioning", "provisioning 11")
        await eventually(lambda: written(apiserver) == 8, message="8 events written")
    assert dropped(registry, "shutdown") == 0


async def test_waking_wakes_the_writers_after_each_item_even_a_failed_one(
    apiserver: ApiServer, kube_client: ApiClient
) -> None:
    busy, rec = held_recorder(kube_client, EventRecorder)
    processed: list[str] = []

    async def process(key: str) -> None:
        processed.append(key)
        busy.value = False  # the worker took the last key: nothing waits any more
        if key == "bad":
            raise RuntimeError("the item failed")

    wrapped = rec.waking(process)
    async with recorder_running(kube_client, rec, NS):
        rec.event(claim(0), "Normal", "Provisioning", "provisioning 0")
        await all_parked(rec)
        with pytest.raises(RuntimeError, match="the item failed"):
            await wrapped("bad")
        await eventually(lambda: written(apiserver) == 1, message="1 event written")
        busy.value = True
        rec.event(claim(1), "Normal", "Provisioning", "provisioning 1")
        await all_parked(rec)
        await wrapped("good")
        await eventually(lambda: written(apiserver) == 2, message="2 events written")
    assert processed == ["bad", "good"]


async def test_busy_writers_write_one_at_a_time_while_busy(
    apiserver: ApiServer, kube_client: ApiClient
) -> None:
    busy, rec = held_recorder(kube_client, CountingRecorder, writers=8, busy_writers=1)
    async with recorder_running(kube_client, rec, NS):
        for i in range(12):
            rec.event(claim(i), "Normal", "Provisioning", f"provisioning {i}")
        # One writer keeps writing while busy: everything goes out, one write at a time.
        await eventually(lambda: written(apiserver) == 12, message="12 events written")
        assert rec.max_in_flight == 1
        # Parked writers are woken only when they may write: a write that frees the one
        # slot wakes one writer, not all of them to find the slot taken (busy is asked
        # each time a writer looks).
        assert busy.calls <= 3 * 12  # 19 here; waking all 8 writers each time asked 62 times
        busy.value = False
        for i in range(12, 40):
            rec.event(claim(i), "Normal", "Provisioning", f"provisioning {i}")
        await eventually(lambda: written(apiserver) == 40, message="40 events written")
    assert rec.max_in_flight > 1  # full speed once the controller's queue is empty


async def test_the_hold_limit_forces_writes_and_nothing_isdropped(
    apiserver: ApiServer, kube_client: ApiClient
) -> None:
    registry = CollectorRegistry()
    rec = EventRecorder(
        kube_client,
        "test",
        registry=registry,
        busy=lambda: True,  # a controller that never runs out of work
        busy_writers=0,
        max_buffer=20,
        hold_limit=5,
    )
    async with recorder_running(kube_client, rec, NS):
        for i in range(18):
            rec.event(claim(i), "Normal", "Provisioning", f"provisioning {i}")
        # Written down to the limit, then held again.
        await eventually(lambda: written(apiserver) == 13, message="13 events written")
        await all_parked(rec)
        assert rec.pending == 5
        assert written(apiserver) == 13
        # A flush writes the rest, busy or not.
        assert await rec.flush(30)
        assert written(apiserver) == 18
    assert dropped(registry, "buffer_full") == 0
    assert rec.high_water == 18


async def test_flush_writes_held_events_and_cancel_accounts_for_them(
    apiserver: ApiServer, kube_client: ApiClient
) -> None:
    registry = CollectorRegistry()
    rec = EventRecorder(kube_client, "test", registry=registry, busy=lambda: True, busy_writers=0)
    async with recorder_running(kube_client, rec, NS) as task:
        for i in range(4):
            rec.event(claim(i), "Normal", "Provisioning", f"provisioning {i}")
        assert await rec.flush(30)
        assert written(apiserver) == 4
        # Held when the recorder is cancelled: counted as dropped at shutdown, as without busy.
        for i in range(4, 7):
            rec.event(claim(i), "Normal", "Provisioning", f"provisioning {i}")
        await all_parked(rec)
        task.cancel()
    assert written(apiserver) == 4
    assert dropped(registry, "shutdown") == 3
    assert rec.pending == 0
    assert await rec.flush(1)  # nothing left unaccounted for


async def test_a_failing_predicate_does_not_hold_events(
    apiserver: ApiServer, kube_client: ApiClient
) -> None:
    def broken() -> bool:
        raise RuntimeError("bug in the owner's predicate")

    rec = EventRecorder(
        kube_client, "test", registry=CollectorRegistry(), busy=broken, busy_writers=0
    )
    async with recorder_running(kube_client, rec, NS):
        for i in range(3):
            rec.event(claim(i), "Normal", "Provisioning", f"provisioning {i}")
        await eventually(lambda: written(apiserver) == 3, message="3 events written")


async def test_each_objects_events_keep_their_order_across_a_hold(
    apiserver: ApiServer, kube_client: ApiClient
) -> None:
    busy, rec = held_recorder(kube_client, CountingRecorder)
    async with recorder_running(kube_client, rec, NS):
        for reason in ("First", "Second", "Third"):
            for i in range(4):
                rec.event(claim(i), "Normal", reason, f"{reason} {i}")
        rec.event(claim(0), "Normal", "First", "First 0")  # a repeat: counted, not created
        await all_parked(rec)
        assert rec.order == []
        busy.value = False
        rec.wake()
        assert await rec.flush(30)
    assert rec.max_in_flight > 1
    for i in range(4):
        mine = [reason for uid, reason in rec.order if uid == f"uid-{i}"]
        assert mine == ["First", "Second", "Third"] + (["First"] if i == 0 else [])
    events = apiserver.storage.list("events", NS)
    assert len(events) == 12
    (repeated,) = [e for e in events if e["message"] == "First 0"]
    assert repeated["count"] == 2


def test_hold_limit_must_leave_room_in_the_buffer(kube_client: ApiClient) -> None:
    with pytest.raises(ValueError, match="hold_limit"):
        EventRecorder(
            kube_client, "test", registry=CollectorRegistry(), max_buffer=10, hold_limit=10
        )
    with pytest.raises(ValueError, match="busy_writers"):
        EventRecorder(kube_client, "test", registry=CollectorRegistry(), busy_writers=-1)
    rec = EventRecorder(kube_client, "test", registry=CollectorRegistry(), max_buffer=10)
    assert rec.hold_limit == 3  # a third: the rest is room for what the writers cannot keep up with
    assert rec.busy is None


async def test_the_provision_controllers_events_yield_to_its_queues(
    kube_client: ApiClient,
) -> None:
    controller = ProvisionController(
        kube_client, "example.com/prio", MemoryProvisioner(), fast_options()
    )
    rec = controller.recorder
    # Held-back events come on top of the room a burst needs without holding back.
    assert rec.max_buffer - rec.hold_limit >= 2000
    # Few writers: each one writing holds a connection (and its TLS buffers) of its own.
    assert rec.writers == CONTROLLER_WRITERS
    volumes, claims = controller.volume_queue, controller.claim_queue
    assert await busy_while_queued(rec, volumes, "pv-1", taken=False) == [False, True, False]
    assert await busy_while_queued(rec, claims, "ns/claim-1", taken=True) == [False, True, False]


@pytest.mark.e2e
async def test_every_event_of_a_burst_is_written(kube_cluster: TestCluster) -> None:
    provisioner = "example.com/prio-burst"
    controller = ProvisionController(
        kube_cluster.api_client,
        provisioner,
        MemoryProvisioner(),
        fast_options(workers=4),
    )
    class_name = await create_class(kube_cluster, provisioner, reclaimPolicy="Delete")
    async with running(controller, ready=True):
        claims = await asyncio.gather(*(create_claim(kube_cluster, class_name) for _ in range(40)))
        for c in claims:
            await wait_bound(kube_cluster, c["metadata"]["name"])
        names = {c["metadata"]["name"] for c in claims}

        async def both_events_of_every_claim() -> bool:
            listed = await request_json(
                kube_cluster.api_client,
                "GET",
                f"/api/v1/namespaces/{kube_cluster.namespace}/events",
            )
            seen = {
                (e["involvedObject"]["name"], e["reason"])
                for e in listed["items"]
                if e["involvedObject"]["name"] in names
            }
            return seen >= {
                (n, r) for n in names for r in ("Provisioning", "ProvisioningSucceeded")
            }

        await eventually(both_events_of_every_claim, message="both events of all 40 claims")

"""EventRecorder's buffer and writers without an API server (writes are scripted by
overriding ``_write``): one object's backlog never holds a writer back from other objects'
events, the buffer bound counts waiting events only, and a 1,000-claim burst of two events
per claim fits (the CSI bench dropped ~20 % of them when writers parked behind busy
objects)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from claim_support import claim_body
from kubernetes_asyncio.client import ApiClient
from prometheus_client import CollectorRegistry

from pyprovlib.kube._clock import FakeClock
from pyprovlib.kube._events import EventRecorder
from pyprovlib.kube._objects import Obj


def claim(i: int) -> Obj:
    return claim_body(f"claim-{i}", namespace="ns", uid=f"uid-{i}")


class GatedRecorder(EventRecorder):
    """Writes nothing: each write of a gated object waits for its gate; every write is
    logged with the number of writes in flight when it started."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gates: dict[str, asyncio.Event] = {}
        self.started: list[str] = []
        self.written: list[tuple[str, str]] = []
        self.in_flight = 0
        self.max_in_flight = 0

    async def _write(self, event: Obj, patch: Obj | None) -> str:
        name = str(event["involvedObject"]["name"])
        self.started.append(f"{name}/{event['reason']}")
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            gate = self.gates.get(name)
            if gate is not None:
                await gate.wait()
            else:
                await asyncio.sleep(0)
            self.written.append((name, str(event["reason"])))
            return "ok"
        finally:
            self.in_flight -= 1


def recorder(api: ApiClient, **kwargs: Any) -> GatedRecorder:
    return GatedRecorder(api, "test", clock=FakeClock(), registry=CollectorRegistry(), **kwargs)


def dropped(rec: EventRecorder, reason: str) -> float:
    return rec._dropped.labels(reason)._value.get()


@pytest.fixture
async def api() -> AsyncIterator[ApiClient]:
    async with ApiClient() as client:  # never used to send: _write is scripted
        yield client


async def _until(predicate: Any) -> None:
    async with asyncio.timeout(5):
        while not predicate():
            await asyncio.sleep(0)


async def test_a_busy_object_does_not_hold_writers_back_from_other_objects(
    api: ApiClient,
) -> None:
    rec = recorder(api, writers=2)
    rec.gates["claim-0"] = asyncio.Event()
    # claim-0's three events come first; with writers taking events in buffer order and
    # then waiting for their object, both writers would sit on claim-0 while claim-1 waits.
    for reason in ("A", "B", "C"):
        rec.event(claim(0), "Normal", reason, "m")
    rec.event(claim(1), "Normal", "A", "m")
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(rec.run())
        await _until(lambda: ("claim-1", "A") in rec.written)
        assert rec.started == ["claim-0/A", "claim-1/A"]  # claim-0's B and C still wait
        assert rec.pending == 2
        rec.gates["claim-0"].set()
        assert await rec.flush(5)
        task.cancel()
    assert [r for n, r in rec.written if n == "claim-0"] == ["A", "B", "C"]


async def test_the_buffer_bound_counts_waiting_events_not_those_being_written(
    api: ApiClient,
) -> None:
    rec = recorder(api, writers=1, max_buffer=2)
    rec.gates["claim-0"] = asyncio.Event()
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(rec.run())
        rec.event(claim(0), "Normal", "Writing", "m")
        await _until(lambda: rec.in_flight == 1)
        rec.event(claim(1), "Normal", "Waits1", "m")
        rec.event(claim(2), "Normal", "Waits2", "m")
        rec.event(claim(3), "Normal", "Dropped", "m")  # the buffer holds 2 waiting events
        assert rec.pending == 2
        rec.gates["claim-0"].set()
        assert await rec.flush(5)
        task.cancel()
    assert [r for _, r in rec.written] == ["Writing", "Waits1", "Waits2"]
    assert dropped(rec, "buffer_full") == 1


async def test_a_1000_claim_burst_fits_the_default_buffer_and_is_written_whole(
    api: ApiClient,
) -> None:
    # What a provisioner records for a 1,000-claim burst: Provisioning, then
    # ProvisioningSucceeded, interleaved across claims; all buffered before any is written.
    rec = recorder(api)
    for i in range(1000):
        rec.event(claim(i), "Normal", "Provisioning", "m")
        rec.event(claim(i), "Normal", "ProvisioningSucceeded", "m")
    assert rec.pending == 2000
    assert dropped(rec, "buffer_full") == 0
    rec.event(claim(1000), "Normal", "Provisioning", "m")  # still bounded
    assert dropped(rec, "buffer_full") == 1
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(rec.run())
        assert await rec.flush(5)
        task.cancel()
    assert len(rec.written) == 2000
    assert rec.max_in_flight == rec.writers  # every writer busy, none parked
    assert rec.high_water == 2000
    for i in (0, 500, 999):
        assert [r for n, r in rec.written if n == f"claim-{i}"] == [
            "Provisioning",
            "ProvisioningSucceeded",
        ]

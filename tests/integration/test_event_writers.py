"""EventRecorder's concurrent writers: events of different objects are written concurrently,
those of one object one at a time and in the order they were recorded; a repeated event is
still correlated into one Event with a count."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from claim_support import claim_body
from kubernetes_asyncio.client import ApiClient
from prometheus_client import CollectorRegistry

from pyprovlib.kube._config import request_json
from pyprovlib.kube._events import EventRecorder
from pyprovlib.kube._objects import Obj
from pyprovlib.testing._server import ApiServer


def claim(i: int) -> Obj:
    return claim_body(f"claim-{i}", namespace="ns1", uid=f"uid-{i}")


class WatchedRecorder(EventRecorder):
    """Records writes in flight; every write yields first so overlaps would show."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.in_flight: list[str] = []
        self.max_in_flight = 0
        self.same_object_overlaps = 0
        self.written: list[tuple[str, str]] = []

    async def _write(self, event: Obj, patch: Obj | None) -> str:
        uid = str(event["involvedObject"]["uid"])
        if uid in self.in_flight:
            self.same_object_overlaps += 1
        self.in_flight.append(uid)
        self.max_in_flight = max(self.max_in_flight, len(self.in_flight))
        try:
            await asyncio.sleep(0.01)
            outcome = await super()._write(event, patch)
            self.written.append((uid, str(event["reason"])))
            return outcome
        finally:
            self.in_flight.remove(uid)


async def test_writers_overlap_across_objects_and_keep_each_objects_order(
    apiserver: ApiServer, kube_client: ApiClient
) -> None:
    await request_json(
        kube_client, "POST", "/api/v1/namespaces", body={"metadata": {"name": "ns1"}}
    )
    rec = WatchedRecorder(kube_client, "test", registry=CollectorRegistry(), writers=4)
    reasons = ["First", "Second", "Third", "Fourth"]
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(rec.run())
        # Object after object: without per-object ordering, the writers would pick up one
        # object's events together.
        for i in range(8):
            for reason in reasons:
                rec.event(claim(i), "Normal", reason, f"{reason} for claim {i}")
        # A repeat of an already recorded event: correlated into a count.
        rec.event(claim(0), "Normal", "First", "First for claim 0")
        assert await rec.flush(30)
        task.cancel()
    assert rec.same_object_overlaps == 0
    assert rec.max_in_flight > 1
    for i in range(8):
        order = [reason for uid, reason in rec.written if uid == f"uid-{i}"]
        expected = reasons + (["First"] if i == 0 else [])
        assert order == expected
    events = apiserver.storage.list("events", "ns1")
    assert len(events) == 32
    (repeated,) = [
        e for e in events if e["involvedObject"]["uid"] == "uid-0" and e["reason"] == "First"
    ]
    assert repeated["count"] == 2


def test_writers_must_be_positive(kube_client: ApiClient) -> None:
    with pytest.raises(ValueError, match="writers"):
        EventRecorder(kube_client, "test", registry=CollectorRegistry(), writers=0)

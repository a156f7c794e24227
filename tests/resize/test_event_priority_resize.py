"""The ResizeController's event writers yield to its claim queue (EventRecorder's ``busy``;
the recorder's behaviour itself: tests/integration/test_event_priority.py)."""

from __future__ import annotations

from event_support import busy_while_queued
from resize_support import MemoryResizer, fast_options

from pyprovlib.controller._resize import ResizeController
from pyprovlib.kube._events import CONTROLLER_WRITERS
from pyprovlib.testing._cluster import TestCluster


async def test_the_resizers_events_yield_to_its_claim_queue(kube_cluster: TestCluster) -> None:
    resizer = ResizeController(
        kube_cluster.api_client, MemoryResizer("example.com/prio"), fast_options()
    )
    rec, claims = resizer.recorder, resizer.claim_queue
    assert rec.max_buffer - rec.hold_limit >= 2000
    assert rec.writers == CONTROLLER_WRITERS
    assert await busy_while_queued(rec, claims, "ns/claim-1", taken=True) == [False, True, False]
    assert await busy_while_queued(rec, claims, "ns/claim-2", taken=False) == [False, True, False]

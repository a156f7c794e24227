"""The ResizeController's event writers yield to its claim queue (EventRecorder's ``busy``;
the recorder's behaviour itself: tests/integration/test_event_priority.py)."""

from __future__ import annotations

from resize_support import MemoryResizer, fast_options

from pyprovlib.controller._resize import ResizeController
from pyprovlib.kube._events import CONTROLLER_WRITERS
from pyprovlib.testing._cluster import TestCluster


async def test_the_resizers_events_yield_to_its_claim_queue(kube_cluster: TestCluster) -> None:
    resizer = ResizeController(
        kube_cluster.api_client, MemoryResizer("example.com/prio"), fast_options()
    )
    busy = resizer.recorder.busy
    assert busy is not None
    assert resizer.recorder.max_buffer - resizer.recorder.hold_limit >= 2000
    assert resizer.recorder.writers == CONTROLLER_WRITERS
    assert not busy()
    resizer.claim_queue.add("ns/claim-1")
    assert busy()
    await resizer.claim_queue.get()  # a worker took it: nothing waits for one
    assert not busy()
    resizer.claim_queue.add("ns/claim-2")
    assert busy()
    resizer.claim_queue.shut_down()  # what is left after a stop does not hold events
    assert not busy()

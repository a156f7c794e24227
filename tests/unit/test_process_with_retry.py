"""``process_with_retry``, the one key of a worker that the attach, resize and modify controllers
share: a success forgets the key's failures, a ``DelayRetryError`` puts it back after its own
delay (not the backoff), any other error puts it back with the backoff and is logged as the
caller's failure."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from pyprovlib.controller._errors import DelayRetryError
from pyprovlib.controller._lifecycle import process_with_retry
from pyprovlib.controller._resize.options import ResizeControllerOptions
from pyprovlib.controller._sidecar_options import retry_queue
from pyprovlib.kube._clock import FakeClock
from pyprovlib.kube._workqueue import RateLimitingQueue


class RecordingLog:
    """Keeps what was logged, as (level, event, fields)."""

    def __init__(self) -> None:
        self.records: list[tuple[str, str, dict[str, Any]]] = []

    def debug(self, event: str, **fields: Any) -> None:
        self.records.append(("debug", event, fields))

    def info(self, event: str, **fields: Any) -> None:
        self.records.append(("info", event, fields))


def make_queue(clock: FakeClock) -> RateLimitingQueue[str]:
    options = ResizeControllerOptions(
        retry_interval_start=2.0, retry_interval_max=60.0, registry=CollectorRegistry()
    )
    return retry_queue("test-pvc", options, clock)


async def test_a_failure_is_retried_with_backoff_and_logged_as_the_callers_failure() -> None:
    clock = FakeClock()
    log = RecordingLog()
    async with make_queue(clock) as queue:

        async def fail(key: str) -> None:
            raise RuntimeError(f"backend refused {key}")

        await process_with_retry(
            queue,
            "ns/a",
            fail,
            log=log,
            failure="error syncing claim",
            describe=lambda err: f"described: {err}",
            claim="ns/a",
        )
        assert queue.num_requeues("ns/a") == 1
        assert queue.waiting() == 1  # behind the first backoff step
        assert log.records == [
            (
                "info",
                "error syncing claim",
                {"error": "described: backend refused ns/a", "claim": "ns/a"},
            )
        ]
        await clock.advance(2.0)
        assert await queue.get() == "ns/a"
        queue.done("ns/a")


async def test_a_success_forgets_the_failures() -> None:
    clock = FakeClock()
    async with make_queue(clock) as queue:
        calls: list[str] = []

        async def flaky(key: str) -> None:
            calls.append(key)
            if len(calls) == 1:
                raise RuntimeError("once")

        for _ in range(2):
            await process_with_retry(queue, "ns/b", flaky, log=RecordingLog(), failure="f")
        assert calls == ["ns/b", "ns/b"]
        assert queue.num_requeues("ns/b") == 0


async def test_a_delay_retry_error_waits_its_own_delay_not_the_backoff() -> None:
    clock = FakeClock()
    log = RecordingLog()
    async with make_queue(clock) as queue:

        async def later(key: str) -> None:
            raise DelayRetryError(f"{key} waits out an infeasible error", 30.0)

        await process_with_retry(queue, "ns/c", later, log=log, failure="f", claim="ns/c")
        assert queue.num_requeues("ns/c") == 0  # no backoff step taken
        assert queue.waiting() == 1
        assert log.records == [
            ("debug", "ns/c waits out an infeasible error", {"delay": 30.0, "claim": "ns/c"})
        ]
        await clock.advance(29.0)
        assert len(queue) == 0
        await clock.advance(1.0)
        assert await queue.get() == "ns/c"
        queue.done("ns/c")

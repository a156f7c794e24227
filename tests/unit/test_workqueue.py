"""Work queues: client-go's add/get/done semantics, shutdown and drain, delayed and
rate-limited adds on a fake clock, task ownership, and the exported metrics."""

from __future__ import annotations

import asyncio
import gc

import pytest
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest

from pyprovlib.kube._clock import FakeClock
from pyprovlib.kube._metrics import WORKQUEUE_BUCKETS, workqueue_metrics
from pyprovlib.kube._workqueue import (
    DelayingQueue,
    ItemExponentialFailureRateLimiter,
    MaxOfRateLimiter,
    RateLimitingQueue,
    ShutDownError,
    WorkQueue,
)


async def settle(rounds: int = 10) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0)


def workqueue_tasks() -> list[asyncio.Task[object]]:
    return [
        t for t in asyncio.all_tasks() if t.get_name().startswith("workqueue-") and not t.done()
    ]


# --------------------------------------------------------------------------------------------
# WorkQueue
# --------------------------------------------------------------------------------------------


async def test_items_come_out_in_fifo_order() -> None:
    q: WorkQueue[str] = WorkQueue()
    for item in ("a", "b", "c"):
        q.add(item)
    assert len(q) == 3
    got = [await q.get() for _ in range(3)]
    assert got == ["a", "b", "c"]
    assert len(q) == 0


async def test_an_item_added_twice_before_get_is_handed_out_once() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    q.add("b")
    q.add("a")
    assert len(q) == 2
    assert await q.get() == "a"
    assert await q.get() == "b"
    q.done("a")
    q.done("b")
    assert len(q) == 0


async def test_an_item_re_added_while_processing_returns_only_after_done() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    item = await q.get()
    q.add("a")
    q.add("a")
    # Not in the FIFO while a worker holds it: no second worker can get it.
    assert len(q) == 0
    second = asyncio.create_task(q.get())
    await settle()
    assert not second.done()
    q.done(item)
    assert await asyncio.wait_for(second, 1) == "a"
    q.done("a")
    assert len(q) == 0


async def test_get_waits_for_an_add() -> None:
    q: WorkQueue[str] = WorkQueue()
    getter = asyncio.create_task(q.get())
    await settle()
    assert not getter.done()
    q.add("a")
    assert await asyncio.wait_for(getter, 1) == "a"


async def test_waiting_workers_are_served_in_arrival_order() -> None:
    q: WorkQueue[int] = WorkQueue()
    getters = []
    for _ in range(3):
        getters.append(asyncio.create_task(q.get()))
        await settle(2)
    for item in (1, 2, 3):
        q.add(item)
    assert [await asyncio.wait_for(g, 1) for g in getters] == [1, 2, 3]


async def test_a_cancelled_waiter_passes_its_wake_up_on() -> None:
    q: WorkQueue[str] = WorkQueue()
    first = asyncio.create_task(q.get())
    second = asyncio.create_task(q.get())
    await settle()
    q.add("a")  # wakes `first` ...
    first.cancel()  # ... which is cancelled before it runs
    assert await asyncio.wait_for(second, 1) == "a"
    with pytest.raises(asyncio.CancelledError):
        await first


async def test_a_cancelled_waiter_leaves_no_trace() -> None:
    q: WorkQueue[str] = WorkQueue()
    getter = asyncio.create_task(q.get())
    await settle()
    getter.cancel()
    await asyncio.wait([getter])
    q.add("a")
    assert await q.get() == "a"


def test_an_empty_queue_is_still_truthy() -> None:
    q: WorkQueue[str] = WorkQueue()
    assert len(q) == 0
    assert (q or None) is q


async def test_done_for_an_item_not_processing_is_ignored() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    q.done("a")  # queued, not handed out: must not be queued a second time
    q.done("zzz")
    assert len(q) == 1
    assert await q.get() == "a"
    q.done("a")
    q.done("a")
    assert len(q) == 0


async def test_shut_down_ignores_adds_hands_out_what_is_queued_then_raises() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    q.add("b")
    q.shut_down()
    assert q.shutting_down
    q.add("c")
    assert len(q) == 2
    assert await q.get() == "a"
    assert await q.get() == "b"
    with pytest.raises(ShutDownError):
        await q.get()


async def test_shut_down_releases_waiting_workers() -> None:
    q: WorkQueue[str] = WorkQueue()
    getters = [asyncio.create_task(q.get()) for _ in range(3)]
    await settle()
    q.shut_down()
    results = await asyncio.gather(*getters, return_exceptions=True)
    assert all(isinstance(r, ShutDownError) for r in results)


async def test_shut_down_does_not_wait_for_items_in_flight() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    await q.get()
    q.shut_down()  # synchronous; nothing to wait for
    with pytest.raises(ShutDownError):
        await q.get()
    q.done("a")


async def test_an_item_dirty_at_shut_down_is_still_processed_after_done() -> None:
    # client-go's TestQueueDrainageUsingShutDownWithDrainWithDirtyItem, on plain shut_down.
    q: WorkQueue[str] = WorkQueue()
    q.add("foo")
    item = await q.get()
    q.add("foo")
    q.shut_down()
    q.done(item)
    assert await q.get() == "foo"
    q.done("foo")
    with pytest.raises(ShutDownError):
        await q.get()


async def test_drain_waits_for_every_handed_out_item() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("foo")
    q.add("bar")
    first = await q.get()
    second = await q.get()
    drain = asyncio.create_task(q.shut_down_with_drain())
    await settle()
    assert not drain.done()
    assert q.shutting_down
    q.add("late")
    with pytest.raises(ShutDownError):
        await q.get()
    q.done(first)
    await settle()
    assert not drain.done()
    q.done(second)
    await asyncio.wait_for(drain, 1)


async def test_drain_processes_a_dirty_item_before_returning() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("foo")
    item = await q.get()
    q.add("foo")
    drain = asyncio.create_task(q.shut_down_with_drain())
    await settle()
    q.done(item)
    await settle()
    # "foo" went back into the FIFO: the drain is not over until it is handed out and done.
    assert not drain.done()
    again = await q.get()
    assert again == "foo"
    q.done(again)
    await asyncio.wait_for(drain, 1)
    with pytest.raises(ShutDownError):
        await q.get()


async def test_drain_waits_for_queued_items_to_be_worked_off() -> None:
    q: WorkQueue[int] = WorkQueue()
    for i in range(5):
        q.add(i)
    handled: list[int] = []

    async def worker() -> None:
        while True:
            try:
                item = await q.get()
            except ShutDownError:
                return
            await asyncio.sleep(0)
            handled.append(item)
            q.done(item)

    async with asyncio.TaskGroup() as tg:
        tg.create_task(worker())
        tg.create_task(worker())
        await q.shut_down_with_drain()
        assert sorted(handled) == [0, 1, 2, 3, 4]
        assert len(q) == 0


async def test_drain_of_an_idle_queue_returns_at_once() -> None:
    q: WorkQueue[str] = WorkQueue()
    await asyncio.wait_for(q.shut_down_with_drain(), 1)
    with pytest.raises(ShutDownError):
        await q.get()


async def test_shut_down_ends_a_drain_early() -> None:
    # client-go's TestForceQueueShutdownUsingShutDown.
    q: WorkQueue[str] = WorkQueue()
    q.add("foo")
    await q.get()
    drain = asyncio.create_task(q.shut_down_with_drain())
    await settle()
    assert not drain.done()
    q.shut_down()
    await asyncio.wait_for(drain, 1)


async def test_a_cancelled_drain_can_be_retried() -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("foo")
    await q.get()
    first = asyncio.create_task(q.shut_down_with_drain())
    await settle()
    first.cancel()
    await asyncio.wait([first])
    assert first.cancelled()
    drain = asyncio.create_task(q.shut_down_with_drain())
    await settle()
    q.done("foo")
    await asyncio.wait_for(drain, 1)


async def test_work_queue_as_context_manager_shuts_down() -> None:
    async with WorkQueue[str]() as q:
        q.add("a")
    assert q.shutting_down
    q.add("b")
    assert len(q) == 1


# --------------------------------------------------------------------------------------------
# DelayingQueue
# --------------------------------------------------------------------------------------------


async def test_add_after_adds_when_the_delay_has_passed() -> None:
    clock = FakeClock()
    async with DelayingQueue[str](clock=clock) as q:
        q.add_after("a", 5.0)
        await clock.advance(4.9)
        assert len(q) == 0
        await clock.advance(0.1)
        assert len(q) == 1
        assert await q.get() == "a"
        q.done("a")


async def test_add_after_with_no_delay_adds_at_once() -> None:
    clock = FakeClock()
    async with DelayingQueue[str](clock=clock) as q:
        q.add_after("a", 0)
        q.add_after("b", -1.0)
        assert len(q) == 2
        assert clock.waiters == 0


async def test_add_after_on_the_real_clock() -> None:
    async with DelayingQueue[str]() as q:
        q.add_after("a", 0.002)
        assert len(q) == 0
        assert await asyncio.wait_for(q.get(), 1) == "a"


async def test_delayed_items_fire_in_deadline_order() -> None:
    clock = FakeClock()
    async with DelayingQueue[str](clock=clock) as q:
        q.add_after("late", 3.0)
        q.add_after("early", 1.0)
        q.add_after("middle", 2.0)
        await clock.advance(1.0)
        assert [await q.get()] == ["early"]
        await clock.advance(10.0)
        assert [await q.get(), await q.get()] == ["middle", "late"]


async def test_a_waiting_item_fires_once_at_its_earliest_deadline() -> None:
    clock = FakeClock()
    async with DelayingQueue[str](clock=clock) as q:
        q.add_after("a", 10.0)
        await settle()
        q.add_after("a", 5.0)  # earlier: the deadline moves
        q.add_after("a", 7.0)  # later: ignored
        await clock.advance(5.0)
        assert len(q) == 1
        item = await q.get()
        q.done(item)
        await clock.advance(10.0)
        assert len(q) == 0
        assert clock.waiters == 0


async def test_an_earlier_add_after_wakes_a_loop_sleeping_on_a_later_one() -> None:
    clock = FakeClock()
    async with DelayingQueue[str](clock=clock) as q:
        q.add_after("late", 100.0)
        await settle()
        assert clock.next_deadline() == 100.0
        q.add_after("soon", 1.0)
        await settle()
        assert clock.next_deadline() == 1.0
        await clock.advance(1.0)
        assert await q.get() == "soon"


async def test_add_after_of_a_queued_item_is_deduplicated_when_it_fires() -> None:
    clock = FakeClock()
    async with DelayingQueue[str](clock=clock) as q:
        q.add("a")
        q.add_after("a", 1.0)
        await clock.advance(1.0)
        assert len(q) == 1


async def test_add_after_of_an_item_being_processed_requeues_it_after_done() -> None:
    clock = FakeClock()
    async with DelayingQueue[str](clock=clock) as q:
        q.add("a")
        item = await q.get()
        q.add_after(item, 1.0)
        await clock.advance(1.0)
        assert len(q) == 0
        q.done(item)
        assert await q.get() == "a"


async def test_shut_down_stops_the_delay_task_and_drops_waiting_items() -> None:
    clock = FakeClock()
    q: DelayingQueue[str] = DelayingQueue(clock=clock)
    q.add_after("a", 1.0)
    await settle()
    assert len(workqueue_tasks()) == 1
    q.shut_down()
    await q.aclose()
    assert workqueue_tasks() == []
    assert clock.waiters == 0
    q.add_after("b", 1.0)
    await clock.advance(5.0)
    assert len(q) == 0
    with pytest.raises(ShutDownError):
        await q.get()


async def test_drain_stops_the_delay_task() -> None:
    clock = FakeClock()
    q: DelayingQueue[str] = DelayingQueue(clock=clock)
    q.add_after("a", 1.0)
    q.add("b")
    item = await q.get()
    drain = asyncio.create_task(q.shut_down_with_drain())
    await settle()
    q.done(item)
    await asyncio.wait_for(drain, 1)
    assert workqueue_tasks() == []
    await clock.advance(5.0)
    with pytest.raises(ShutDownError):
        await q.get()


async def test_the_delay_task_starts_lazily_and_leaving_the_context_awaits_it() -> None:
    clock = FakeClock()
    async with DelayingQueue[str](clock=clock) as q:
        assert len(workqueue_tasks()) == 1
        q.add_after("a", 1.0)
    assert q.shutting_down
    assert workqueue_tasks() == []
    q2: DelayingQueue[str] = DelayingQueue(clock=clock)
    assert workqueue_tasks() == []  # nothing until first use
    q2.add("plain")
    assert workqueue_tasks() == []  # a plain add needs no delay task
    q2.add_after("a", 1.0)
    assert len(workqueue_tasks()) == 1
    await q2.aclose()
    assert workqueue_tasks() == []


class BrokenClock(FakeClock):
    async def sleep(self, seconds: float) -> None:
        raise RuntimeError("clock broke")


async def test_a_failed_delay_task_is_reported_by_aclose_not_hidden() -> None:
    q: DelayingQueue[str] = DelayingQueue(clock=BrokenClock())
    q.add_after("a", 1.0)
    await settle()
    with pytest.raises(RuntimeError, match="clock broke"):
        await q.aclose()


def test_add_after_outside_a_loop_fires_once_the_queue_is_used_in_one() -> None:
    clock = FakeClock()
    q: DelayingQueue[str] = DelayingQueue(clock=clock)
    q.add_after("a", 1.0)  # no running loop yet: the entry waits in the heap

    async def use() -> str:
        getter = asyncio.create_task(q.get())
        await clock.advance(1.0)
        try:
            return await asyncio.wait_for(getter, 1)
        finally:
            await q.aclose()

    assert asyncio.run(use()) == "a"


# --------------------------------------------------------------------------------------------
# RateLimitingQueue
# --------------------------------------------------------------------------------------------


async def test_add_rate_limited_waits_as_the_limiter_says() -> None:
    clock = FakeClock()
    limiter = ItemExponentialFailureRateLimiter(1.0, 100.0)
    async with RateLimitingQueue[str](rate_limiter=limiter, clock=clock) as q:
        q.add_rate_limited("a")
        assert q.num_requeues("a") == 1
        await clock.advance(0.99)
        assert len(q) == 0
        await clock.advance(0.01)
        item = await q.get()
        q.add_rate_limited(item)  # second failure: 2 s
        q.done(item)
        await clock.advance(1.99)
        assert len(q) == 0
        await clock.advance(0.01)
        assert await q.get() == "a"
        assert q.num_requeues("a") == 2
        q.forget("a")
        assert q.num_requeues("a") == 0
        q.done("a")


async def test_rate_limiting_queue_uses_the_default_controller_limiter() -> None:
    clock = FakeClock()
    async with RateLimitingQueue[str](clock=clock) as q:
        assert isinstance(q.rate_limiter, MaxOfRateLimiter)
        q.add_rate_limited("a")
        await clock.advance(0.004)
        assert len(q) == 0
        await clock.advance(0.001)
        assert len(q) == 1


async def test_add_rate_limited_after_shut_down_still_counts_but_adds_nothing() -> None:
    # client-go asks the limiter before AddAfter sees the shutdown.
    clock = FakeClock()
    limiter = ItemExponentialFailureRateLimiter(1.0, 100.0)
    q: RateLimitingQueue[str] = RateLimitingQueue(rate_limiter=limiter, clock=clock)
    q.shut_down()
    q.add_rate_limited("a")
    assert q.num_requeues("a") == 1
    await clock.advance(10.0)
    assert len(q) == 0


# --------------------------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------------------------


def sample(registry: CollectorRegistry, metric: str, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(metric, {"name": name, **labels})


async def test_named_queue_counts_depth_adds_and_retries() -> None:
    registry = CollectorRegistry()
    clock = FakeClock()
    async with RateLimitingQueue[str](
        "claims", ItemExponentialFailureRateLimiter(1.0, 10.0), clock=clock, registry=registry
    ) as q:
        q.add("a")
        q.add("a")  # duplicate: no add counted
        q.add("b")
        assert sample(registry, "workqueue_adds_total", "claims") == 2
        assert sample(registry, "workqueue_depth", "claims") == 2
        item = await q.get()
        assert sample(registry, "workqueue_depth", "claims") == 1
        q.add(item)  # dirty while processing counts as depth, like client-go
        assert sample(registry, "workqueue_depth", "claims") == 2
        assert sample(registry, "workqueue_adds_total", "claims") == 3
        q.add_rate_limited("c")
        q.add_after("d", 0)
        assert sample(registry, "workqueue_retries_total", "claims") == 2
        await clock.advance(1.0)
        assert sample(registry, "workqueue_adds_total", "claims") == 5
        assert sample(registry, "workqueue_depth", "claims") == 4


async def test_latency_and_work_duration_histograms_use_the_queue_clock() -> None:
    registry = CollectorRegistry()
    clock = FakeClock()
    q: WorkQueue[str] = WorkQueue("vols", clock=clock, registry=registry)
    q.add("a")
    await clock.advance(2.0)
    q.add("a")  # a second add does not restart the latency clock
    await clock.advance(1.0)
    item = await q.get()
    await clock.advance(0.5)
    q.done(item)
    assert sample(registry, "workqueue_queue_duration_seconds_sum", "vols") == 3.0
    assert sample(registry, "workqueue_queue_duration_seconds_count", "vols") == 1
    assert sample(registry, "workqueue_queue_duration_seconds_bucket", "vols", le="1.0") == 0
    assert sample(registry, "workqueue_queue_duration_seconds_bucket", "vols", le="10.0") == 1
    assert sample(registry, "workqueue_work_duration_seconds_sum", "vols") == 0.5
    assert sample(registry, "workqueue_work_duration_seconds_bucket", "vols", le="1.0") == 1
    assert sample(registry, "workqueue_work_duration_seconds_bucket", "vols", le="0.1") == 0


def test_histogram_buckets_are_component_bases() -> None:
    # Go's ExponentialBuckets(10e-9, 10, 10) multiplies step by step: the same floats.
    assert WORKQUEUE_BUCKETS == (
        1e-08,
        1e-07,
        1e-06,
        9.999999999999999e-06,
        9.999999999999999e-05,
        0.001,
        0.01,
        0.1,
        1.0,
        10.0,
    )
    registry = CollectorRegistry()
    WorkQueue[str]("q", registry=registry)
    for metric in ("workqueue_queue_duration_seconds", "workqueue_work_duration_seconds"):
        for le in ("1e-08", "9.999999999999999e-06", "0.001", "1.0", "10.0", "+Inf"):
            assert sample(registry, f"{metric}_bucket", "q", le=le) == 0


async def test_histogram_bucket_edges_count_values_equal_to_the_bound() -> None:
    registry = CollectorRegistry()
    clock = FakeClock()
    q: WorkQueue[str] = WorkQueue("edges", clock=clock, registry=registry)
    for item, wait in (("a", 0.1), ("b", 10.0), ("c", 11.0)):
        q.add(item)
        await clock.advance(wait)
        await q.get()

    def bucket(le: str) -> float | None:
        return sample(registry, "workqueue_queue_duration_seconds_bucket", "edges", le=le)

    # Each item waited from its add to its get: a 0.1 s, b 10 s, c 11 s.
    assert bucket("0.1") == 1  # "a" waited exactly 0.1 s: le is inclusive
    assert bucket("1.0") == 1
    assert bucket("10.0") == 2
    assert bucket("+Inf") == 3
    assert sample(registry, "workqueue_queue_duration_seconds_count", "edges") == 3
    assert sample(registry, "workqueue_queue_duration_seconds_sum", "edges") == 21.1


def test_exposition_uses_client_go_names() -> None:
    registry = CollectorRegistry()
    q: WorkQueue[str] = WorkQueue("claims", registry=registry)
    q.add("ns/a")
    text = generate_latest(registry).decode()
    assert 'workqueue_adds_total{name="claims"} 1.0' in text
    assert 'workqueue_depth{name="claims"} 1.0' in text
    assert "# TYPE workqueue_queue_duration_seconds histogram" in text
    assert "# TYPE workqueue_work_duration_seconds histogram" in text
    assert "# TYPE workqueue_retries_total counter" in text
    assert 'workqueue_unfinished_work_seconds{name="claims"} 0.0' in text
    assert 'workqueue_longest_running_processor_seconds{name="claims"} 0.0' in text


def test_default_registry_is_prometheus_clients_global_one() -> None:
    name = f"default-registry-{id(object())}"
    q: WorkQueue[str] = WorkQueue(name)
    q.add("a")
    assert REGISTRY.get_sample_value("workqueue_adds_total", {"name": name}) == 1
    assert workqueue_metrics() is workqueue_metrics(REGISTRY)


async def test_unfinished_work_and_longest_running_are_computed_at_scrape_time() -> None:
    registry = CollectorRegistry()
    clock = FakeClock()
    q: WorkQueue[str] = WorkQueue("attach", clock=clock, registry=registry)
    assert sample(registry, "workqueue_unfinished_work_seconds", "attach") == 0
    assert sample(registry, "workqueue_longest_running_processor_seconds", "attach") == 0
    q.add("a")
    q.add("b")
    await q.get()
    await clock.advance(3.0)
    await q.get()
    await clock.advance(1.0)
    assert sample(registry, "workqueue_unfinished_work_seconds", "attach") == 5.0
    assert sample(registry, "workqueue_longest_running_processor_seconds", "attach") == 4.0
    q.done("a")
    assert sample(registry, "workqueue_unfinished_work_seconds", "attach") == 1.0
    assert sample(registry, "workqueue_longest_running_processor_seconds", "attach") == 1.0


def test_unnamed_queues_export_nothing() -> None:
    registry = CollectorRegistry()
    q: WorkQueue[str] = WorkQueue(registry=registry)
    q.add("a")
    assert list(registry.collect()) == []


async def test_queues_sharing_a_name_share_the_series() -> None:
    registry = CollectorRegistry()
    clock = FakeClock()
    one: WorkQueue[str] = WorkQueue("same", clock=clock, registry=registry)
    two: WorkQueue[str] = WorkQueue("same", clock=clock, registry=registry)
    other: WorkQueue[str] = WorkQueue("other", clock=clock, registry=registry)
    one.add("a")
    two.add("a")
    other.add("z")
    assert sample(registry, "workqueue_adds_total", "same") == 2
    assert sample(registry, "workqueue_depth", "other") == 1
    await one.get()
    await clock.advance(2.0)
    await two.get()
    await clock.advance(1.0)
    assert sample(registry, "workqueue_unfinished_work_seconds", "same") == 4.0
    assert sample(registry, "workqueue_longest_running_processor_seconds", "same") == 3.0
    assert sample(registry, "workqueue_unfinished_work_seconds", "other") == 0.0
    assert workqueue_metrics(registry) is workqueue_metrics(registry)


async def test_a_dropped_queue_stops_reporting_in_flight_work() -> None:
    registry = CollectorRegistry()
    clock = FakeClock()
    q: WorkQueue[str] = WorkQueue("gone", clock=clock, registry=registry)
    q.add("a")
    await q.get()
    await clock.advance(1.0)
    assert sample(registry, "workqueue_unfinished_work_seconds", "gone") == 1.0
    del q
    gc.collect()
    assert sample(registry, "workqueue_unfinished_work_seconds", "gone") is None
    # The counters stay, as Prometheus counters must.
    assert sample(registry, "workqueue_adds_total", "gone") == 1


def test_metric_help_strings_are_component_bases() -> None:
    registry = CollectorRegistry()
    WorkQueue[str]("q", registry=registry)
    helps = {m.name: m.documentation for m in registry.collect()}
    assert helps["workqueue_depth"] == "Current depth of workqueue"
    assert helps["workqueue_adds"] == "Total number of adds handled by workqueue"
    assert helps["workqueue_retries"] == "Total number of retries handled by workqueue"
    assert helps["workqueue_queue_duration_seconds"] == (
        "How long in seconds an item stays in workqueue before being requested."
    )
    assert helps["workqueue_work_duration_seconds"] == (
        "How long in seconds processing an item from workqueue takes."
    )
    assert helps["workqueue_longest_running_processor_seconds"] == (
        "How many seconds has the longest running processor for workqueue been running."
    )
    assert helps["workqueue_unfinished_work_seconds"].startswith(
        "How many seconds of work has done that is in progress"
    )


async def test_idle_until_nothing_is_queued_or_processing_and_waiting_is_counted() -> None:
    clock = FakeClock()
    q: RateLimitingQueue[str] = RateLimitingQueue(
        rate_limiter=ItemExponentialFailureRateLimiter(1.0, 10.0), clock=clock
    )
    async with q:
        assert q.idle()
        q.add("a")
        assert not q.idle()
        item = await q.get()
        assert not q.idle()  # being processed
        q.add_rate_limited(item)
        q.done(item)
        assert q.idle()  # only waiting out its delay
        assert q.waiting() == 1
        await clock.advance(1.0)
        assert await q.get() == "a"
        q.done("a")
        assert q.idle()
        assert q.waiting() == 0


def test_a_queue_name_that_is_not_a_string_is_refused() -> None:
    # A rate limiter passed positionally as the name once broke the metrics registry's collect().
    with pytest.raises(TypeError, match="queue name must be a str"):
        RateLimitingQueue(ItemExponentialFailureRateLimiter(1.0, 10.0))  # type: ignore[arg-type]

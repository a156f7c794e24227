"""Property tests of the rate-limiting work queue: random interleavings of add / add_after /
add_rate_limited / forget / get / done / clock advances / shut_down / shut_down_with_drain, run
on a fake clock and replayed against a reference model of client-go's queue.

Every add and every hand-out is logged at the moment it happens (adds through a subclass hook,
hand-outs by the worker right after ``get()`` returns, with no suspension in between), so the
model sees the real order of events even when delayed adds fire while workers are waiting.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from pyprovlib.kube._clock import FakeClock
from pyprovlib.kube._workqueue import (
    BucketRateLimiter,
    ItemExponentialFailureRateLimiter,
    MaxOfRateLimiter,
    RateLimitingQueue,
    ShutDownError,
)

ITEMS = ("a", "b", "c", "d")
WORKERS = 3
NAME = "props"

item_st = st.sampled_from(ITEMS)
worker_st = st.integers(0, WORKERS - 1)
work_op_st = st.one_of(
    st.tuples(st.just("add"), item_st),
    st.tuples(st.just("add_after"), item_st, st.sampled_from([-1.0, 0.0, 0.5, 1.0, 2.0, 5.0])),
    st.tuples(st.just("add_rate_limited"), item_st),
    st.tuples(st.just("forget"), item_st),
    st.tuples(st.just("get"), worker_st),
    st.tuples(st.just("get"), worker_st),
    st.tuples(st.just("done"), worker_st),
    st.tuples(st.just("done"), worker_st),
    st.tuples(st.just("advance"), st.sampled_from([0.1, 0.5, 1.0, 3.0])),
)
# Shutdown ends most of what is interesting, so it comes once (or twice: a drain forced by a
# later shut_down) at a drawn point rather than as a frequent random op.
stops_st = st.sampled_from(
    [[], [("shut_down",)], [("drain",)], [("drain",), ("shut_down",)], [("shut_down",), ("drain",)]]
)


@st.composite
def op_lists(draw: st.DrawFn) -> list[tuple[object, ...]]:
    ops: list[tuple[Any, ...]] = draw(st.lists(work_op_st, max_size=60))
    for stop in draw(stops_st):
        ops.insert(draw(st.integers(0, len(ops))), stop)
    return ops


def make_limiter(clock: FakeClock) -> MaxOfRateLimiter:
    return MaxOfRateLimiter(
        ItemExponentialFailureRateLimiter(0.25, 4.0), BucketRateLimiter(2.0, 2, clock=clock)
    )


class LoggedQueue(RateLimitingQueue[str]):
    """Logs every add as it happens, tagged with whether a test operation is running (a direct
    add) or not (a delayed add fired by the queue's own task)."""

    def __init__(self, log: list[tuple[str, ...]], clock: FakeClock, registry: CollectorRegistry):
        super().__init__(NAME, make_limiter(clock), clock=clock, registry=registry)
        self.log = log
        self.in_op = False

    def add(self, item: str) -> None:
        self.log.append(("add", item, "op" if self.in_op else "timer"))
        super().add(item)


@dataclass
class Model:
    """client-go's queue, plus the delayed adds still waiting."""

    now: float = 0.0
    queue: deque[str] = field(default_factory=deque)
    dirty: set[str] = field(default_factory=set)
    processing: set[str] = field(default_factory=set)
    shutting_down: bool = False
    waiting: dict[str, float] = field(default_factory=dict)
    adds: int = 0
    gets: int = 0
    retries: int = 0

    def add(self, item: str) -> None:
        if self.shutting_down or item in self.dirty:
            return
        self.adds += 1
        self.dirty.add(item)
        if item not in self.processing:
            self.queue.append(item)

    def get(self, item: str) -> None:
        assert item not in self.processing, f"{item} handed to a second worker"
        assert self.queue, f"{item} handed out while nothing was queued"
        assert self.queue[0] == item, f"handed out {item}, FIFO head is {self.queue[0]}"
        self.queue.popleft()
        self.gets += 1
        self.processing.add(item)
        self.dirty.discard(item)

    def done(self, item: str) -> None:
        self.processing.discard(item)
        if item in self.dirty:
            self.queue.append(item)

    def add_after(self, item: str, delay: float) -> None:
        if self.shutting_down:
            return
        self.retries += 1
        if delay <= 0:
            return  # the queue's immediate add is logged and replayed as an "op" add
        self.waiting[item] = min(self.waiting.get(item, math.inf), self.now + delay)

    def shut_down(self) -> None:
        self.shutting_down = True
        self.waiting.clear()


@dataclass
class Worker:
    task: asyncio.Task[None] | None = None
    holding: str | None = None
    finished: bool = False


async def settle(rounds: int = 12) -> None:
    for _ in range(rounds):
        await asyncio.sleep(0)


class Harness:
    def __init__(self) -> None:
        self.clock = FakeClock()
        self.registry = CollectorRegistry()
        self.log: list[tuple[str, ...]] = []
        self.q = LoggedQueue(self.log, self.clock, self.registry)
        self.shadow = make_limiter(self.clock)  # fed the same calls: predicts the delays
        self.model = Model()
        self.workers = [Worker() for _ in range(WORKERS)]
        self.replayed = 0
        self.drain: asyncio.Task[None] | None = None
        self.drain_forced = False
        self.drained = False

    async def worker_get(self, index: int) -> None:
        worker = self.workers[index]
        try:
            item = await self.q.get()
        except ShutDownError:
            worker.finished = True
            self.log.append(("shutdown", str(index)))
            return
        # No await between get() returning and this line: the log order is the real order.
        worker.holding = item
        self.log.append(("get", item, str(index)))

    def replay(self) -> None:
        """Feed the events logged since the last replay to the model, checking each."""
        for event in self.log[self.replayed :]:
            kind = event[0]
            if kind == "add":
                item, source = event[1], event[2]
                if source == "timer":
                    deadline = self.model.waiting.pop(item, None)
                    assert deadline is not None, f"{item} fired with no delayed add waiting"
                    assert deadline <= self.clock.monotonic(), f"{item} fired early"
                    assert not any(d < deadline for d in self.model.waiting.values()), (
                        f"{item} fired before an earlier deadline"
                    )
                self.model.add(item)
            elif kind == "get":
                assert not self.drained, f"{event[1]} handed out after the drain completed"
                held = [w.holding for i, w in enumerate(self.workers) if i != int(event[2])]
                assert event[1] not in held, f"{event[1]} held by two workers"
                self.model.get(event[1])
            elif kind == "shutdown":
                assert self.model.shutting_down
                assert not self.model.queue, "ShutDownError while items were queued"
        self.replayed = len(self.log)

    def check(self) -> None:
        self.replay()
        model = self.model
        now = self.clock.monotonic()
        assert not [i for i, d in model.waiting.items() if d <= now], "a due delayed add is stuck"
        assert len(self.q) == len(model.queue)
        assert self.q.shutting_down == model.shutting_down
        waiting_workers = [w for w in self.workers if w.task is not None and not w.task.done()]
        if model.queue:
            assert not waiting_workers, "a worker waits while items are queued"
        if model.shutting_down:
            assert not waiting_workers, "a worker still waits after shutdown"
        if self.drain is not None and self.drain.done() and not self.drain_forced:
            # A drain ended by shut_down() promises nothing about what is still queued.
            assert not model.queue
            assert not model.processing
            self.drained = True
        work_left = bool(model.queue or model.processing)
        if self.drain is not None and not self.drain_forced and not work_left:
            assert self.drain.done(), "the drain did not return once all work was done"
        sample = self.registry.get_sample_value
        assert sample("workqueue_adds_total", {"name": NAME}) == model.adds
        assert sample("workqueue_depth", {"name": NAME}) == model.adds - model.gets
        assert sample("workqueue_retries_total", {"name": NAME}) == model.retries

    async def apply(self, op: tuple[Any, ...]) -> None:
        kind = op[0]
        q = self.q
        q.in_op = True
        try:
            if kind == "add":
                q.add(str(op[1]))
            elif kind == "add_after":
                item, delay = str(op[1]), float(op[2])
                self.model.add_after(item, delay)
                q.add_after(item, delay)
            elif kind == "add_rate_limited":
                item = str(op[1])
                self.model.add_after(item, self.shadow.when(item))
                q.add_rate_limited(item)
            elif kind == "forget":
                self.shadow.forget(str(op[1]))
                q.forget(str(op[1]))
                assert q.num_requeues(str(op[1])) == 0
            elif kind == "get":
                self.start_get(int(op[1]))
            elif kind == "done":
                self.finish(int(op[1]))
            elif kind == "shut_down":
                self.model.shut_down()
                if self.drain is not None and not self.drain.done():
                    self.drain_forced = True
                q.shut_down()
            elif kind == "drain" and self.drain is None:
                self.model.shut_down()
                self.drain = asyncio.create_task(q.shut_down_with_drain())
        finally:
            q.in_op = False
        await settle()
        if kind == "advance":
            await self.clock.advance(float(op[1]))
            self.model.now = self.clock.monotonic()
            await settle()
        self.check()

    def start_get(self, index: int) -> None:
        worker = self.workers[index]
        busy = worker.task is not None and not worker.task.done()
        if busy or worker.holding is not None or worker.finished:
            return
        worker.task = asyncio.create_task(self.worker_get(index))

    def finish(self, index: int) -> None:
        worker = self.workers[index]
        if worker.holding is None:
            return
        item, worker.holding = worker.holding, None
        self.model.done(item)
        self.q.done(item)

    async def wind_down(self) -> None:
        """Stop intake if nothing else did, then let every worker work the queue off."""
        if not self.model.shutting_down:
            await self.apply(("shut_down",))
        for _ in range(len(ITEMS) * 4 + 10):
            if all(w.finished for w in self.workers):
                break
            for index in range(WORKERS):
                await self.apply(("done", index))
                await self.apply(("get", index))
        assert all(w.finished for w in self.workers), "workers never saw ShutDownError"
        # No add lost: everything added before shutdown was handed out after its last add.
        assert not self.model.dirty
        assert not self.model.queue
        assert not self.model.processing
        assert len(self.q) == 0
        if self.drain is not None:
            assert self.drain.done()
        await self.q.aclose()
        assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("workqueue-")]


async def run(ops: list[tuple[object, ...]]) -> None:
    harness = Harness()
    try:
        for op in ops:
            await harness.apply(op)
        await harness.wind_down()
    finally:
        await harness.q.aclose()
        pending = [w.task for w in harness.workers if w.task is not None]
        if harness.drain is not None:
            pending.append(harness.drain)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)


@given(op_lists())
def test_random_interleavings_keep_client_go_semantics(ops: list[tuple[object, ...]]) -> None:
    asyncio.run(run(ops))


@given(st.lists(st.tuples(st.just("add"), item_st), min_size=1, max_size=8), st.data())
def test_drain_while_workers_hold_items(
    adds: list[tuple[object, ...]], data: st.DataObject
) -> None:
    """Drain starts with work in flight and queued; every op afterwards is a worker step."""
    steps = data.draw(
        st.lists(
            st.one_of(
                st.tuples(st.just("get"), worker_st),
                st.tuples(st.just("done"), worker_st),
                st.tuples(st.just("add"), item_st),
            ),
            max_size=30,
        )
    )
    ops: list[tuple[object, ...]] = [*adds, ("get", 0), ("get", 1), ("drain",), *steps]
    asyncio.run(run(ops))


@given(
    st.lists(
        st.one_of(
            st.tuples(
                st.just("add_after"),
                st.sampled_from(["a", "b"]),
                st.sampled_from([0.5, 1.0, 2.0, 5.0]),
            ),
            st.tuples(st.just("advance"), st.sampled_from([0.5, 1.0, 3.0])),
            st.tuples(st.just("get"), worker_st),
            st.tuples(st.just("done"), worker_st),
        ),
        max_size=40,
    )
)
def test_delayed_adds_fire_at_their_earliest_deadline(ops: list[tuple[object, ...]]) -> None:
    """Few items and many delays: the same item often waits with several deadlines."""
    asyncio.run(run(ops))

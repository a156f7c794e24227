"""client-go's work queues in asyncio: a deduplicating FIFO that never hands one item to two
workers, a delaying queue for ``add_after``, a rate-limiting queue for retries with backoff, and
the rate limiters that compute those delays.

Semantics follow k8s.io/client-go/util/workqueue: a dirty set, a processing set and a FIFO. An
item added twice before a worker takes it is processed once; an item re-added while a worker holds
it goes back into the FIFO only when that worker calls :meth:`WorkQueue.done`. After
:meth:`WorkQueue.shut_down` adds are ignored and :meth:`WorkQueue.get` keeps handing out what is
still queued, then raises :class:`ShutDownError`.

One deliberate difference: :meth:`WorkQueue.shut_down_with_drain` returns once nothing is being
processed *and* nothing is left queued. client-go only waits for the processing set, which with
goroutines racing back into ``Get`` amounts to the same thing while workers run, but would let an
item still queued be handed out after the drain returned; here nothing is handed out after it.
Workers must therefore keep calling ``get()`` until it raises; ``shut_down()`` (or cancelling the
drain) ends a drain early, as in client-go.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import heapq
import itertools
import math
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, Protocol, Self, TypeVar, runtime_checkable

from prometheus_client import CollectorRegistry

from pyprovlib._errors import PyprovlibError
from pyprovlib.kube._clock import Clock, RealClock
from pyprovlib.kube._metrics import QueueMetrics, workqueue_metrics
from pyprovlib.kube._ratelimit import TokenBucket

__all__ = [
    "BucketRateLimiter",
    "DelayingQueue",
    "ItemExponentialFailureRateLimiter",
    "ItemFastSlowRateLimiter",
    "MaxOfRateLimiter",
    "RateLimiter",
    "RateLimitingQueue",
    "ShutDownError",
    "WorkQueue",
    "default_controller_rate_limiter",
    "run_worker",
]

T = TypeVar("T", bound=Hashable)

# Go's time.Duration tops out at MaxInt64 nanoseconds; client-go falls back to maxDelay beyond it.
_MAX_GO_DURATION = (2**63 - 1) / 1e9


def _resolve(waiter: asyncio.Future[None], _: object = None) -> None:
    if not waiter.done():
        waiter.set_result(None)


class ShutDownError(PyprovlibError):
    """Raised by :meth:`WorkQueue.get` once the queue is shut down and holds nothing more to hand
    out: the worker should return."""


# --------------------------------------------------------------------------------------------
# Rate limiters
# --------------------------------------------------------------------------------------------


@runtime_checkable
class RateLimiter(Protocol):
    """Decides how long an item waits before it is re-queued (client-go's ``RateLimiter``)."""

    def when(self, item: Hashable) -> float:
        """Record a retry of ``item`` and return the seconds it should wait before it is added."""
        ...

    def forget(self, item: Hashable) -> None:
        """Stop tracking ``item`` (it succeeded, or its retries were given up)."""
        ...

    def num_requeues(self, item: Hashable) -> int:
        """How many times ``item`` has been through :meth:`when` since it was last forgotten."""
        ...


class ItemExponentialFailureRateLimiter:
    """Per-item exponential backoff: ``base_delay * 2**failures``, capped at ``max_delay``."""

    def __init__(self, base_delay: float, max_delay: float) -> None:
        self.base_delay = base_delay
        self.max_delay = max_delay
        self._failures: dict[Hashable, int] = {}

    def when(self, item: Hashable) -> float:
        """The delay for this failure of ``item``; counts the failure."""
        exponent = self._failures.get(item, 0)
        self._failures[item] = exponent + 1
        try:
            # ldexp keeps huge failure counts exact until the float range ends, then raises.
            backoff = math.ldexp(self.base_delay, exponent)
        except OverflowError:
            return self.max_delay
        if backoff > _MAX_GO_DURATION:
            return self.max_delay
        return min(backoff, self.max_delay)

    def forget(self, item: Hashable) -> None:
        """Reset ``item``'s failure count."""
        self._failures.pop(item, None)

    def num_requeues(self, item: Hashable) -> int:
        """Failures counted for ``item``."""
        return self._failures.get(item, 0)


class ItemFastSlowRateLimiter:
    """``fast_delay`` for the first ``max_fast_attempts`` retries of an item, ``slow_delay``
    after that."""

    def __init__(self, fast_delay: float, slow_delay: float, max_fast_attempts: int) -> None:
        self.fast_delay = fast_delay
        self.slow_delay = slow_delay
        self.max_fast_attempts = max_fast_attempts
        self._failures: dict[Hashable, int] = {}

    def when(self, item: Hashable) -> float:
        """The delay for this retry of ``item``; counts the retry."""
        attempts = self._failures.get(item, 0) + 1
        self._failures[item] = attempts
        return self.fast_delay if attempts <= self.max_fast_attempts else self.slow_delay

    def forget(self, item: Hashable) -> None:
        """Reset ``item``'s retry count."""
        self._failures.pop(item, None)

    def num_requeues(self, item: Hashable) -> int:
        """Retries counted for ``item``."""
        return self._failures.get(item, 0)


class BucketRateLimiter:
    """An overall (not per-item) limit: every retry takes a token from a ``qps``/``burst``
    bucket and waits for it, like client-go's ``BucketRateLimiter`` over ``rate.Limiter``."""

    def __init__(self, qps: float, burst: int, *, clock: Clock | None = None) -> None:
        self.bucket = TokenBucket(qps, burst, clock=clock)

    def when(self, item: Hashable) -> float:
        """Reserve a token; the wait before it may be used."""
        return self.bucket.reserve()

    def forget(self, item: Hashable) -> None:
        """Nothing to forget: the bucket keeps no per-item state."""

    def num_requeues(self, item: Hashable) -> int:
        """Always 0: the bucket keeps no per-item state."""
        return 0


class MaxOfRateLimiter:
    """Asks every limiter and waits for the longest answer.

    Every limiter's ``when`` is called each time, so each one counts the retry. With a token
    bucket among them, the burst can appear exceeded when particular items were separately
    delayed longer, as upstream notes.
    """

    def __init__(self, *limiters: RateLimiter) -> None:
        if not limiters:
            raise ValueError("MaxOfRateLimiter needs at least one rate limiter")
        self.limiters: tuple[RateLimiter, ...] = limiters

    def when(self, item: Hashable) -> float:
        """The largest delay any limiter asks for."""
        return max(limiter.when(item) for limiter in self.limiters)

    def forget(self, item: Hashable) -> None:
        """Forget ``item`` in every limiter."""
        for limiter in self.limiters:
            limiter.forget(item)

    def num_requeues(self, item: Hashable) -> int:
        """The largest count any limiter holds for ``item``."""
        return max(limiter.num_requeues(item) for limiter in self.limiters)


def default_controller_rate_limiter(
    *,
    base_delay: float = 0.005,
    max_delay: float = 1000.0,
    qps: float = 10.0,
    burst: int = 100,
    clock: Clock | None = None,
) -> MaxOfRateLimiter:
    """client-go's ``DefaultControllerRateLimiter``: per-item exponential backoff from 5 ms to
    1000 s, combined with an overall 10 qps / 100 burst bucket; each figure can be changed."""
    return MaxOfRateLimiter(
        ItemExponentialFailureRateLimiter(base_delay, max_delay),
        BucketRateLimiter(qps, burst, clock=clock),
    )


# --------------------------------------------------------------------------------------------
# Queues
# --------------------------------------------------------------------------------------------


class WorkQueue(Generic[T]):
    """A FIFO of distinct items handed to async workers, with client-go's guarantees.

    Workers loop ``item = await q.get()`` ... ``q.done(item)`` until ``get()`` raises
    :class:`ShutDownError`. A named queue exports the ``workqueue_*`` metrics into ``registry``
    (prometheus_client's default registry unless given); an unnamed one exports nothing.
    """

    def __init__(
        self,
        name: str = "",
        *,
        clock: Clock | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        if not isinstance(name, str):
            raise TypeError(
                f"the queue name must be a str, not {type(name).__name__}; pass a rate limiter "
                "as rate_limiter=…"
            )
        self.name = name
        self._clock: Clock = clock or RealClock()
        self._queue: deque[T] = deque()
        self._dirty: set[T] = set()
        self._processing: set[T] = set()
        self._shutting_down = False
        self._drain = False
        self._getters: deque[asyncio.Future[None]] = deque()
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._metrics: QueueMetrics | None = (
            workqueue_metrics(registry).for_queue(name, self._clock) if name else None
        )

    def add(self, item: T) -> None:
        """Mark ``item`` as needing processing. Ignored after shut down and while the item is
        already waiting; an item being processed is queued again when its worker calls done."""
        if self._shutting_down or item in self._dirty:
            return
        if self._metrics is not None:
            self._metrics.add(item)
        self._dirty.add(item)
        if item in self._processing:
            return
        self._queue.append(item)
        self._wake_getter()

    def idle(self) -> bool:
        """Nothing queued and nothing being processed (items waiting out a delay in a
        :class:`DelayingQueue` are not counted: see :meth:`DelayingQueue.waiting`)."""
        return not self._queue and not self._processing

    def __len__(self) -> int:
        """Items waiting in the FIFO (not those being processed); informational only."""
        return len(self._queue)

    def __bool__(self) -> bool:
        """Always true, empty or not, so ``queue or make_default()`` keeps an empty queue."""
        return True

    async def get(self) -> T:
        """Wait for the next item and mark it as being processed; the caller must call
        :meth:`done` with it. Raises :class:`ShutDownError` once shut down and empty.

        Like ``asyncio.Queue.get``, it returns without suspending when an item is ready, so a
        worker whose handling never awaits should yield (``await asyncio.sleep(0)``) now and
        then to let other tasks run.
        """
        while not self._queue:
            if self._shutting_down:
                raise ShutDownError(f"work queue {self.name!r} is shut down")
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._getters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    # We were handed a wake-up we will not use: pass it on so no item
                    # is left sitting while another worker waits.
                    self._wake_getter()
                else:
                    with contextlib.suppress(ValueError):
                        self._getters.remove(waiter)
                raise
        item = self._queue.popleft()
        if self._metrics is not None:
            self._metrics.get(item)
        self._processing.add(item)
        self._dirty.discard(item)
        return item

    def done(self, item: T) -> None:
        """Mark ``item`` as finished; if it was added again meanwhile, queue it again.

        ``done`` for an item that is not being processed is ignored (client-go would queue a
        dirty item a second time).
        """
        if item not in self._processing:
            return
        if self._metrics is not None:
            self._metrics.done(item)
        self._processing.discard(item)
        if item in self._dirty:
            self._queue.append(item)
            self._wake_getter()
        elif self._drain_waiters:
            self._check_drained()

    def shut_down(self) -> None:
        """Ignore further adds and make ``get()`` raise once the queue is empty. Workers waiting
        in ``get()`` on an empty queue are released at once; a drain in progress returns."""
        self._drain = False
        self._begin_shutdown()

    async def shut_down_with_drain(self) -> None:
        """Ignore further adds and wait until every queued item has been handed out and every
        handed-out item is done. Calling :meth:`shut_down` meanwhile ends the wait early."""
        self._drain = True
        self._begin_shutdown()
        while self._drain and (self._processing or self._queue):
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._drain_waiters.append(waiter)
            try:
                await waiter
            finally:
                with contextlib.suppress(ValueError):
                    self._drain_waiters.remove(waiter)

    @property
    def shutting_down(self) -> bool:
        """True once :meth:`shut_down` or :meth:`shut_down_with_drain` was called."""
        return self._shutting_down

    async def aclose(self) -> None:
        """Shut down (without drain) and wait for any background task the queue owns."""
        self.shut_down()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def _begin_shutdown(self) -> None:
        self._shutting_down = True
        # Every getter re-checks: those finding the FIFO empty raise ShutDownError.
        while self._getters:
            _resolve(self._getters.popleft())
        self._check_drained()

    def _wake_getter(self) -> None:
        while self._getters:
            waiter = self._getters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _check_drained(self) -> None:
        if self._drain and (self._processing or self._queue):
            return
        for waiter in self._drain_waiters:
            _resolve(waiter)


class _Waiting(Generic[T]):
    """A pending delayed add; ``live`` is cleared when an earlier deadline supersedes it."""

    __slots__ = ("item", "live", "ready_at")

    def __init__(self, ready_at: float, item: T) -> None:
        self.ready_at = ready_at
        self.item = item
        self.live = True


class DelayingQueue(WorkQueue[T]):
    """A :class:`WorkQueue` that can also add an item after a delay.

    The delays are served by one background task owned by the queue: started by
    ``async with`` or lazily by the first ``add_after``/``get`` inside a running loop, and
    cancelled by ``shut_down()`` (``aclose()`` / leaving the ``async with`` also awaits it).
    An item waiting with several deadlines is added at the earliest one.
    """

    def __init__(
        self,
        name: str = "",
        *,
        clock: Clock | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        super().__init__(name, clock=clock, registry=registry)
        self._heap: list[tuple[float, int, _Waiting[T]]] = []
        self._waiting: dict[T, _Waiting[T]] = {}
        self._seq = itertools.count()
        self._loop_task: asyncio.Task[None] | None = None
        self._wakeup: asyncio.Future[None] | None = None
        # The deadline the loop is currently sleeping towards, inf while it waits for entries.
        self._sleeping_until = math.inf

    def waiting(self) -> int:
        """How many items wait for their delay to pass before they are queued."""
        return len(self._waiting)

    def add_after(self, item: T, delay: float) -> None:
        """Add ``item`` once ``delay`` seconds have passed on the queue's clock (at once if
        ``delay <= 0``). Ignored after shut down."""
        if self._shutting_down:
            return
        if self._metrics is not None:
            self._metrics.retry()
        if delay <= 0:
            self.add(item)
            return
        ready_at = self._clock.monotonic() + delay
        existing = self._waiting.get(item)
        if existing is not None:
            if existing.ready_at <= ready_at:
                return
            # heapq has no decrease-key: retire the old entry and push a new one.
            existing.live = False
        entry = _Waiting(ready_at, item)
        self._waiting[item] = entry
        heapq.heappush(self._heap, (ready_at, next(self._seq), entry))
        self._ensure_loop()
        if ready_at < self._sleeping_until and self._wakeup is not None:
            _resolve(self._wakeup)

    async def get(self) -> T:
        """As :meth:`WorkQueue.get`; also starts the delay task if entries are waiting."""
        if self._heap:
            self._ensure_loop()
        return await super().get()

    def shut_down(self) -> None:
        """As :meth:`WorkQueue.shut_down`; also stops the delay task and drops waiting items."""
        super().shut_down()
        self._stop_loop()

    async def shut_down_with_drain(self) -> None:
        """As :meth:`WorkQueue.shut_down_with_drain`; items still waiting for their delay are
        dropped at once (adds are ignored from now on anyway)."""
        self._stop_loop()
        await super().shut_down_with_drain()
        await self._join_loop()

    async def aclose(self) -> None:
        """Shut down and wait until the delay task has finished."""
        self.shut_down()
        await self._join_loop()

    async def _join_loop(self) -> None:
        task = self._loop_task
        if task is None:
            return
        if not task.done():
            # asyncio.wait never raises the task's own outcome, only our cancellation.
            await asyncio.wait([task])
        if not task.cancelled() and (error := task.exception()) is not None:
            # The loop only ends by cancellation; anything else is a bug to surface, not hide.
            raise error

    async def __aenter__(self) -> Self:
        self._ensure_loop()
        return self

    def _ensure_loop(self) -> None:
        if self._loop_task is not None or self._shutting_down:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            # No loop yet: the entries wait in the heap until the first use inside one.
            return
        self._loop_task = loop.create_task(
            self._waiting_loop(), name=f"workqueue-delay:{self.name or id(self)}"
        )

    def _stop_loop(self) -> None:
        self._heap.clear()
        self._waiting.clear()
        if self._loop_task is not None and not self._loop_task.done():
            self._loop_task.cancel()

    def _pop_ready(self, now: float) -> None:
        while self._heap and self._heap[0][0] <= now:
            _, _, entry = heapq.heappop(self._heap)
            if not entry.live:
                continue
            del self._waiting[entry.item]
            self.add(entry.item)

    async def _waiting_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._shutting_down:
            self._pop_ready(self._clock.monotonic())
            while self._heap and not self._heap[0][2].live:
                heapq.heappop(self._heap)
            self._wakeup = loop.create_future()
            if not self._heap:
                self._sleeping_until = math.inf
                await self._wakeup
                continue
            self._sleeping_until = self._heap[0][0]
            sleeper = loop.create_task(
                self._clock.sleep(self._sleeping_until - self._clock.monotonic())
            )
            sleeper.add_done_callback(functools.partial(_resolve, self._wakeup))
            try:
                await self._wakeup
            finally:
                if not sleeper.done():
                    sleeper.cancel()
                    await asyncio.wait([sleeper])
            if not sleeper.cancelled() and (error := sleeper.exception()) is not None:
                # A clock that cannot sleep would make this loop spin: stop and let aclose()
                # report it.
                raise error


class RateLimitingQueue(DelayingQueue[T]):
    """A :class:`DelayingQueue` whose retries wait as long as ``rate_limiter`` says
    (:func:`default_controller_rate_limiter` unless given). Call :meth:`forget` when an item
    succeeds or is given up, or its failures are tracked forever."""

    def __init__(
        self,
        name: str = "",
        rate_limiter: RateLimiter | None = None,
        *,
        clock: Clock | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        super().__init__(name, clock=clock, registry=registry)
        self.rate_limiter: RateLimiter = (
            rate_limiter
            if rate_limiter is not None
            else default_controller_rate_limiter(clock=self._clock)
        )

    def add_rate_limited(self, item: T) -> None:
        """Add ``item`` after the delay the rate limiter gives for it (counting a retry)."""
        self.add_after(item, self.rate_limiter.when(item))

    def forget(self, item: T) -> None:
        """Stop tracking ``item``'s retries; :meth:`done` must still be called."""
        self.rate_limiter.forget(item)

    def num_requeues(self, item: T) -> int:
        """How many rate-limited adds ``item`` had since it was last forgotten."""
        return self.rate_limiter.num_requeues(item)


async def run_worker(
    queue: WorkQueue[T],
    process: Callable[[T], Awaitable[None]],
    *,
    stop: asyncio.Event | None = None,
) -> None:
    """One worker of ``queue`` (a client-go controller's ``for processNextWorkItem() {}``):
    take an item, await ``process(item)``, mark it done — also when ``process`` raises, which
    then ends the worker — until ``get`` raises :class:`ShutDownError`. Once ``stop`` is set,
    no further item is taken."""
    while stop is None or not stop.is_set():
        try:
            item = await queue.get()
        except ShutDownError:
            return
        try:
            await process(item)
        finally:
            queue.done(item)

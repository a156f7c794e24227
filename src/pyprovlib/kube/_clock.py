"""Injectable time: a real clock for production and a fake one so tests of backoff,
leases and resync never sleep."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Awaitable
from datetime import UTC, datetime, timedelta
from typing import Protocol, TypeVar, runtime_checkable

__all__ = ["Clock", "FakeClock", "RealClock", "run_within"]

T = TypeVar("T")


@runtime_checkable
class Clock(Protocol):
    """What the machinery needs to know about time.

    ``monotonic()`` orders events and measures durations (leases, backoff, queue latency);
    ``now()`` is wall time for the timestamps written into API objects.
    """

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards."""
        ...

    def now(self) -> datetime:
        """The current wall time, timezone-aware (UTC)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Suspend the caller for ``seconds`` of this clock's time."""
        ...


class RealClock:
    """The process's clocks: ``time.monotonic``, ``datetime.now(UTC)`` and ``asyncio.sleep``."""

    def monotonic(self) -> float:
        return time.monotonic()

    def now(self) -> datetime:
        return datetime.now(UTC)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


class FakeClock:
    """A clock that only moves when a test calls :meth:`advance` (or :meth:`step`).

    Sleepers are woken in deadline order as time passes. ``now()`` is a fixed epoch plus the
    monotonic offset, so wall and monotonic time move together.
    """

    def __init__(self, start: float = 0.0, epoch: datetime | None = None) -> None:
        self._now = start
        self._epoch = epoch or datetime(2026, 1, 1, tzinfo=UTC)
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def monotonic(self) -> float:
        return self._now

    def now(self) -> datetime:
        return self._epoch + timedelta(seconds=self._now)

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + seconds, next(self._seq), fut))
        await fut

    @property
    def waiters(self) -> int:
        """How many sleepers are pending (cancelled ones excluded)."""
        return sum(1 for _, _, f in self._sleepers if not f.done())

    def next_deadline(self) -> float | None:
        """The earliest pending sleeper's deadline, if any."""
        self._drop_cancelled()
        return self._sleepers[0][0] if self._sleepers else None

    async def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``, waking every sleeper whose deadline passes,
        in order, and letting each run before time moves past the next deadline."""
        target = self._now + seconds
        while True:
            self._drop_cancelled()
            if not self._sleepers or self._sleepers[0][0] > target:
                break
            deadline, _, fut = heapq.heappop(self._sleepers)
            self._now = max(self._now, deadline)
            fut.set_result(None)
            await _settle()
        self._now = target
        await _settle()

    async def step(self) -> bool:
        """Jump to the next pending deadline and wake its sleepers; False when none is pending."""
        deadline = self.next_deadline()
        if deadline is None:
            return False
        await self.advance(max(0.0, deadline - self._now))
        return True

    def _drop_cancelled(self) -> None:
        while self._sleepers and self._sleepers[0][2].done():
            heapq.heappop(self._sleepers)


async def run_within(aw: Awaitable[T], seconds: float, clock: Clock) -> asyncio.Future[T]:
    """Await ``aw`` for at most ``seconds`` of ``clock``, so a hung request cannot hold its
    caller. Returns the finished task: cancelled when the time ran out, else holding the
    result or the exception. Both tasks are owned here and cancelled/awaited before returning.
    """
    work = asyncio.ensure_future(aw)
    timer = asyncio.ensure_future(clock.sleep(seconds))
    try:
        await asyncio.wait({work, timer}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (work, timer):
            if not task.done():
                task.cancel()
        await asyncio.gather(work, timer, return_exceptions=True)
    return work


async def _settle(rounds: int = 5) -> None:
    # Several loop turns so woken coroutines get to their next await point.
    for _ in range(rounds):
        await asyncio.sleep(0)

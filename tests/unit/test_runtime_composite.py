"""CompositeController: several controllers run, stop and report health as one."""

from __future__ import annotations

import asyncio

import pytest

from pyprovlib.runtime import CompositeController, Controller


class FakeController:
    """A Controller whose run() waits for stop(), or fails / returns when told."""

    def __init__(self, *, fail: BaseException | None = None, healthy: bool = True) -> None:
        self.fail = fail
        self._healthy = healthy
        self._ready = False
        self.stopped = asyncio.Event()
        self.started = asyncio.Event()
        self.cancelled = False
        self.finished = False
        self.stop_calls = 0

    async def run(self) -> None:
        self.started.set()
        self._ready = True
        try:
            if self.fail is not None:
                await asyncio.sleep(0)
                raise self.fail
            await self.stopped.wait()
            self.finished = True
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        finally:
            self._ready = False

    def stop(self) -> None:
        self.stop_calls += 1
        self.stopped.set()

    def healthy(self) -> bool:
        return self._healthy

    def ready(self) -> bool:
        return self._ready


class ReturnsAtOnce(FakeController):
    async def run(self) -> None:
        self.finished = True


def test_is_a_controller() -> None:
    composite: Controller = CompositeController(FakeController())
    assert composite.healthy()


def test_needs_a_controller() -> None:
    with pytest.raises(ValueError, match="at least one"):
        CompositeController()


async def test_stop_stops_all_and_run_returns() -> None:
    a, b = FakeController(), FakeController()
    composite = CompositeController(a, b)
    task = asyncio.create_task(composite.run())
    await asyncio.wait_for(asyncio.gather(a.started.wait(), b.started.wait()), 1)
    assert composite.ready()
    composite.stop()
    await asyncio.wait_for(task, 1)
    assert a.finished
    assert b.finished
    assert not a.cancelled
    assert not b.cancelled
    assert not composite.ready()


async def test_failure_stops_the_others_and_propagates_as_is() -> None:
    a, b = FakeController(), FakeController(fail=RuntimeError("boom"))
    composite = CompositeController(a, b)
    with pytest.raises(RuntimeError, match="boom"):
        await asyncio.wait_for(composite.run(), 1)
    assert a.stop_calls >= 1
    assert a.cancelled or a.finished
    assert not a.ready()


async def test_one_returning_stops_the_others() -> None:
    a, b = FakeController(), ReturnsAtOnce()
    await asyncio.wait_for(CompositeController(a, b).run(), 1)
    assert a.stop_calls == 1
    assert a.finished
    assert b.finished


async def test_cancel_cancels_all() -> None:
    a, b = FakeController(), FakeController()
    task = asyncio.create_task(CompositeController(a, b).run())
    await asyncio.wait_for(asyncio.gather(a.started.wait(), b.started.wait()), 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert a.cancelled
    assert b.cancelled


async def test_ready_and_healthy_are_all() -> None:
    a, b = FakeController(), FakeController(healthy=False)
    composite = CompositeController(a, b)
    assert not composite.healthy()
    b._healthy = True
    assert composite.healthy()
    assert not composite.ready()
    task = asyncio.create_task(composite.run())
    await asyncio.wait_for(asyncio.gather(a.started.wait(), b.started.wait()), 1)
    assert composite.ready()
    b._ready = False
    assert not composite.ready()
    composite.stop()
    await asyncio.wait_for(task, 1)

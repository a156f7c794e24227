"""Reflector and SharedInformer logic against a scripted ListerWatcher and a FakeClock:
pagination, watch resumption, relists with tombstones, backoff, resync, handler isolation."""

from __future__ import annotations

import asyncio
import json
import random
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from pyprovlib.kube._backoff import Backoff, BackoffTimer
from pyprovlib.kube._clock import FakeClock
from pyprovlib.kube._informer import SharedInformer
from pyprovlib.kube._objects import Obj
from pyprovlib.kube._rest import WatchError, WatchExpiredError
from pyprovlib.kube._store import DeletedFinalStateUnknown
from pyprovlib.testing import eventually

END = object()


def obj(name: str, rv: str, ns: str = "ns") -> Obj:
    return {"metadata": {"namespace": ns, "name": name, "resourceVersion": rv, "uid": f"u-{name}"}}


def page(items: list[Obj], rv: str, cont: str = "") -> Obj:
    meta: dict[str, Any] = {"resourceVersion": rv}
    if cont:
        meta["continue"] = cont
    return {"kind": "List", "metadata": meta, "items": items}


def api_error(status: int, retry_after: float | None = None) -> ApiException:
    e = ApiException(status=status, reason="x")
    e.body = json.dumps({"kind": "Status", "code": status})  # type: ignore[assignment]
    e.headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}  # type: ignore[assignment]
    return e


class FakeWatch:
    """One scripted watch stream: the test pushes events, errors, or END."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.closed = False

    def push(self, *items: Any) -> FakeWatch:
        for item in items:
            self.queue.put_nowait(item)
        return self

    def __aiter__(self) -> FakeWatch:
        return self

    async def __anext__(self) -> Obj:
        item = await self.queue.get()
        if item is END:
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            raise item
        return dict(item)


class ScriptedLW:
    """A ListerWatcher answering from queues; an empty queue blocks the caller."""

    def __init__(self) -> None:
        self.lists: asyncio.Queue[Any] = asyncio.Queue()
        self.watches: asyncio.Queue[Any] = asyncio.Queue()
        self.list_calls: list[dict[str, Any]] = []
        self.watch_calls: list[dict[str, Any]] = []
        self.open_watches: list[FakeWatch] = []

    async def list(
        self, *, resource_version: str | None, limit: int | None, continue_: str | None
    ) -> Obj:
        self.list_calls.append(
            {"resource_version": resource_version, "limit": limit, "continue_": continue_}
        )
        item = await self.lists.get()
        if isinstance(item, BaseException):
            raise item
        return dict(item)

    @asynccontextmanager
    async def watch(
        self, *, resource_version: str, timeout_seconds: int | None, allow_bookmarks: bool
    ) -> AsyncIterator[AsyncIterator[Obj]]:
        self.watch_calls.append(
            {
                "resource_version": resource_version,
                "timeout_seconds": timeout_seconds,
                "allow_bookmarks": allow_bookmarks,
            }
        )
        item = await self.watches.get()
        if isinstance(item, BaseException):
            raise item
        self.open_watches.append(item)
        try:
            yield item
        finally:
            item.closed = True


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, Any, Any]] = []
        self.view: dict[str, Obj] = {}

    @staticmethod
    def _key(o: Obj) -> str:
        return f"{o['metadata']['namespace']}/{o['metadata']['name']}"

    def on_add(self, o: Obj) -> None:
        self.events.append(("add", self._key(o), o["metadata"]["resourceVersion"]))
        self.view[self._key(o)] = o

    def on_update(self, old: Obj, new: Obj) -> None:
        self.events.append(("update", self._key(new), new["metadata"]["resourceVersion"]))
        self.view[self._key(new)] = new

    def on_delete(self, o: Obj | DeletedFinalStateUnknown) -> None:
        if isinstance(o, DeletedFinalStateUnknown):
            self.events.append(("tombstone", o.key, o.obj["metadata"]["resourceVersion"]))
            self.view.pop(o.key, None)
        else:
            self.events.append(("delete", self._key(o), o["metadata"]["resourceVersion"]))
            self.view.pop(self._key(o), None)


async def until(cond: Callable[[], bool], what: str = "condition") -> None:
    await eventually(cond, timeout=3.0, message=what, interval=0.001)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def lw() -> ScriptedLW:
    return ScriptedLW()


Runner = Callable[..., Awaitable[tuple[SharedInformer, Recorder]]]


async def watching(
    lw: ScriptedLW, run_informer: Runner, *objs: Obj
) -> tuple[SharedInformer, Recorder, FakeWatch]:
    """Start an informer whose first list holds ``objs`` (at version 10) and wait until it
    watches; returns the informer, its recorder and that watch."""
    lw.lists.put_nowait(page(list(objs), "10"))
    watch = FakeWatch()
    lw.watches.put_nowait(watch)
    inf, rec = await run_informer()
    await until(lambda: len(lw.watch_calls) == 1)
    return inf, rec, watch


@pytest.fixture
async def run_informer(
    lw: ScriptedLW, clock: FakeClock
) -> AsyncIterator[Callable[..., Awaitable[tuple[SharedInformer, Recorder]]]]:
    tasks: list[asyncio.Task[None]] = []

    async def start(**kw: Any) -> tuple[SharedInformer, Recorder]:
        inf = SharedInformer(
            lw,
            name="things",
            clock=clock,
            backoff=BackoffTimer(clock=clock, rng=random.Random(1)),
            **kw,
        )
        rec = Recorder()
        inf.add_event_handler(rec.on_add, rec.on_update, rec.on_delete)
        tasks.append(asyncio.create_task(inf.run()))
        return inf, rec

    yield start
    for t in tasks:
        t.cancel()
    for t in tasks:
        with pytest.raises(asyncio.CancelledError):
            await t
    assert all(w.closed for w in lw.open_watches), "a watch stream was left open"


async def test_paginated_initial_list_then_watch_from_its_version(
    lw: ScriptedLW, run_informer: Runner
) -> None:
    lw.lists.put_nowait(page([obj("a", "5"), obj("b", "6")], "10", cont="c1"))
    lw.lists.put_nowait(page([obj("c", "7")], "10", cont="c2"))
    lw.lists.put_nowait(page([obj("d", "8")], "10"))
    inf, rec = await run_informer()
    assert await inf.wait_for_sync(timeout=3)
    assert lw.list_calls == [
        {"resource_version": "0", "limit": 500, "continue_": None},
        {"resource_version": None, "limit": 500, "continue_": "c1"},
        {"resource_version": None, "limit": 500, "continue_": "c2"},
    ]
    assert sorted(inf.store.list_keys()) == ["ns/a", "ns/b", "ns/c", "ns/d"]
    assert [e[0] for e in rec.events] == ["add"] * 4
    await until(lambda: len(lw.watch_calls) == 1, "watch")
    call = lw.watch_calls[0]
    assert call["resource_version"] == "10"
    assert call["allow_bookmarks"] is True
    assert 300 <= call["timeout_seconds"] <= 600


async def test_watch_events_update_store_and_handlers_and_resume_from_last_version(
    lw: ScriptedLW, run_informer: Runner, clock: FakeClock
) -> None:
    inf, rec, w1 = await watching(lw, run_informer, obj("a", "5"))
    await clock.advance(5)  # the watch is not "very short"
    w1.push(
        {"type": "ADDED", "object": obj("b", "11")},
        {"type": "MODIFIED", "object": obj("a", "12")},
        {"type": "DELETED", "object": obj("b", "13")},
        {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "20"}}},
        {"type": "DELETED", "object": obj("zz", "21")},  # unknown: not reported twice
        END,
    )
    w2 = FakeWatch()
    lw.watches.put_nowait(w2)
    await until(lambda: len(lw.watch_calls) == 2, "resumed watch")
    assert lw.watch_calls[1]["resource_version"] == "21"
    assert rec.events == [
        ("add", "ns/a", "5"),
        ("add", "ns/b", "11"),
        ("update", "ns/a", "12"),
        ("delete", "ns/b", "13"),
    ]
    assert inf.store.list_keys() == ["ns/a"]
    assert len(lw.list_calls) == 1  # resumed, not relisted
    assert w1.closed


async def test_expired_watch_relists_with_tombstones_adds_and_updates(
    lw: ScriptedLW, run_informer: Runner, clock: FakeClock
) -> None:
    inf, rec, w1 = await watching(lw, run_informer, obj("a", "5"), obj("b", "6"), obj("c", "7"))
    w1.push({"type": "MODIFIED", "object": obj("c", "15")})
    w1.push(WatchExpiredError({"kind": "Status", "code": 410, "reason": "Expired"}))
    await until(lambda: clock.waiters == 1, "backoff before relist")
    rec.events.clear()
    # b vanished, a changed, c unchanged since the watch, d new.
    lw.lists.put_nowait(page([obj("a", "30"), obj("c", "15"), obj("d", "31")], "40"))
    await clock.step()
    await until(lambda: len(lw.list_calls) == 2, "relist")
    assert lw.list_calls[1]["resource_version"] == "15"  # the last version seen
    await until(lambda: len(rec.events) == 3, "relist delivered")
    assert sorted(rec.events) == [
        ("add", "ns/d", "31"),
        ("tombstone", "ns/b", "6"),
        ("update", "ns/a", "30"),
    ]
    assert sorted(inf.store.list_keys()) == ["ns/a", "ns/c", "ns/d"]
    assert rec.view == {k: inf.store.get_by_key(k) for k in inf.store.list_keys()}
    assert w1.closed


async def test_relist_at_expired_version_falls_back_to_latest(
    lw: ScriptedLW, run_informer: Runner, clock: FakeClock
) -> None:
    inf, _, w1 = await watching(lw, run_informer, obj("a", "5"))
    w1.push(WatchExpiredError({"code": 410}))
    lw.lists.put_nowait(api_error(410))
    lw.lists.put_nowait(page([obj("a", "50")], "60"))
    lw.watches.put_nowait(FakeWatch())
    await until(lambda: clock.waiters == 1)
    await clock.step()
    await until(lambda: len(lw.watch_calls) == 2, "watch after relist")
    assert [c["resource_version"] for c in lw.list_calls] == ["0", "10", None]
    assert lw.watch_calls[1]["resource_version"] == "60"
    assert inf.store.get_by_key("ns/a")["metadata"]["resourceVersion"] == "50"  # type: ignore[index]


async def test_expired_continue_token_falls_back_to_one_full_list(
    lw: ScriptedLW, run_informer: Runner
) -> None:
    lw.lists.put_nowait(page([obj("a", "5")], "10", cont="c1"))
    lw.lists.put_nowait(api_error(410))
    lw.lists.put_nowait(page([obj("a", "5"), obj("b", "9")], "12"))
    inf, rec = await run_informer()
    assert await inf.wait_for_sync(timeout=3)
    assert lw.list_calls[2] == {"resource_version": None, "limit": None, "continue_": None}
    assert sorted(inf.store.list_keys()) == ["ns/a", "ns/b"]
    await until(lambda: len(lw.watch_calls) == 1)
    assert lw.watch_calls[0]["resource_version"] == "12"
    assert [e[0] for e in rec.events] == ["add", "add"]


async def test_list_errors_back_off_exponentially_with_jitter_and_honour_retry_after(
    lw: ScriptedLW, run_informer: Runner, clock: FakeClock
) -> None:
    for _ in range(5):
        lw.lists.put_nowait(api_error(500))
    inf, _ = await run_informer()
    delays = []
    for n in range(5):

        def backing_off(n: int = n) -> bool:
            return len(lw.list_calls) == n + 1 and clock.waiters == 1

        await until(backing_off, "backoff")
        deadline = clock.next_deadline()
        assert deadline is not None
        delays.append(deadline - clock.monotonic())
        await clock.step()
    for i, d in enumerate(delays):
        base = min(0.8 * 2**i, 30.0)
        assert base <= d <= 2 * base, (i, d)
    assert not inf.has_synced()
    lw.lists.put_nowait(api_error(429, retry_after=45))
    await until(lambda: len(lw.list_calls) == 6 and clock.waiters == 1)
    deadline = clock.next_deadline()
    assert deadline is not None
    assert deadline - clock.monotonic() >= 45
    lw.lists.put_nowait(page([obj("a", "1")], "2"))
    await clock.step()
    assert await inf.wait_for_sync(timeout=3)


async def test_backoff_resets_after_a_quiet_period() -> None:
    clock = FakeClock()
    b = BackoffTimer(Backoff(0.8, factor=2.0, steps=100, cap=30.0), clock=clock)
    assert [b.next() for _ in range(7)] == [0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0]
    await clock.advance(100)  # not quiet long enough
    assert b.next() == 30.0
    await clock.advance(121)  # quiet for longer than reset_after
    assert b.next() == 0.8
    jittered = BackoffTimer(
        Backoff(1.0, factor=2.0, jitter=1.0, steps=100, cap=30.0),
        clock=clock,
        rng=random.Random(3),
    )
    first = [jittered.next() for _ in range(3)]
    assert all(base <= d <= 2 * base for base, d in zip([1.0, 2.0, 4.0], first, strict=True))
    assert len(set(first)) == 3


async def test_throttled_watch_backs_off_and_rewatches_without_relisting(
    lw: ScriptedLW, run_informer: Runner, clock: FakeClock
) -> None:
    lw.lists.put_nowait(page([obj("a", "5")], "10"))
    lw.watches.put_nowait(api_error(429, retry_after=20))
    _inf, _ = await run_informer()
    await until(lambda: len(lw.watch_calls) == 1 and clock.waiters == 1)
    deadline = clock.next_deadline()
    assert deadline is not None
    assert deadline - clock.monotonic() >= 20
    w = FakeWatch()
    lw.watches.put_nowait(w)
    await clock.step()
    await until(lambda: len(lw.watch_calls) == 2)
    assert lw.watch_calls[1]["resource_version"] == "10"
    w.push(WatchError({"code": 429, "reason": "TooManyRequests"}))
    await until(lambda: clock.waiters == 1)
    lw.watches.put_nowait(FakeWatch())
    await clock.step()
    await until(lambda: len(lw.watch_calls) == 3)
    assert len(lw.list_calls) == 1


async def test_very_short_empty_watch_relists_after_backoff(
    lw: ScriptedLW, run_informer: Runner, clock: FakeClock
) -> None:
    lw.lists.put_nowait(page([obj("a", "5")], "10"))
    lw.watches.put_nowait(FakeWatch().push(END))
    _inf, rec = await run_informer()
    await until(lambda: len(lw.watch_calls) == 1 and clock.waiters == 1, "backoff")
    lw.lists.put_nowait(page([obj("a", "5")], "10"))
    await clock.step()
    await until(lambda: len(lw.list_calls) == 2)
    assert lw.list_calls[1]["resource_version"] == "10"
    assert rec.events == [("add", "ns/a", "5")]  # the unchanged object is not re-delivered


async def test_handler_exception_does_not_stop_other_handlers_or_the_informer(
    lw: ScriptedLW, run_informer: Runner
) -> None:
    lw.lists.put_nowait(page([obj("a", "5"), obj("b", "6")], "10"))
    w = FakeWatch()
    lw.watches.put_nowait(w)
    inf, rec = await run_informer()

    def boom(o: Obj) -> None:
        raise RuntimeError("handler bug")

    inf.add_event_handler(on_add=boom)
    other = Recorder()
    inf.add_event_handler(on_add=other.on_add)
    await inf.wait_for_sync(timeout=3)
    await until(lambda: len(lw.watch_calls) == 1)
    w.push({"type": "ADDED", "object": obj("c", "11")})
    await until(lambda: len(other.events) == 3)
    assert sorted(rec.view) == ["ns/a", "ns/b", "ns/c"]


async def test_late_handler_gets_existing_objects_then_changes(
    lw: ScriptedLW, run_informer: Runner
) -> None:
    lw.lists.put_nowait(page([obj("a", "5"), obj("b", "6")], "10"))
    w = FakeWatch()
    lw.watches.put_nowait(w)
    inf, _ = await run_informer()
    assert await inf.wait_for_sync(timeout=3)
    late = Recorder()
    handle = inf.add_event_handler(late.on_add, late.on_update, late.on_delete)
    assert handle.has_synced()
    assert sorted(late.events) == [("add", "ns/a", "5"), ("add", "ns/b", "6")]
    await until(lambda: len(lw.watch_calls) == 1)
    w.push({"type": "MODIFIED", "object": obj("a", "12")})
    await until(lambda: len(late.events) == 3)
    assert late.events[-1] == ("update", "ns/a", "12")
    inf.remove_event_handler(handle)
    w.push({"type": "MODIFIED", "object": obj("b", "13")})
    await until(lambda: inf.store.get_by_key("ns/b")["metadata"]["resourceVersion"] == "13")  # type: ignore[index]
    assert len(late.events) == 3


async def test_periodic_resync_per_handler(
    lw: ScriptedLW, run_informer: Runner, clock: FakeClock
) -> None:
    lw.lists.put_nowait(page([obj("a", "5"), obj("b", "6")], "10"))
    lw.watches.put_nowait(FakeWatch())
    inf, rec = await run_informer()  # the default handler: no resync
    assert await inf.wait_for_sync(timeout=3)
    fast: list[tuple[str, bool]] = []
    slow: list[tuple[str, bool]] = []
    inf.add_event_handler(
        on_update=lambda o, n: fast.append((n["metadata"]["name"], o is n)), resync_period=10
    )
    inf.add_event_handler(
        on_update=lambda o, n: slow.append((n["metadata"]["name"], o is n)), resync_period=30
    )
    await until(lambda: clock.waiters >= 1, "resync timer")
    await clock.advance(10)
    await until(lambda: len(fast) == 2, "first resync")
    assert sorted(fast) == [("a", True), ("b", True)]
    assert slow == []
    await clock.advance(20)
    await until(lambda: len(fast) == 6 and len(slow) == 2, "second resync")
    assert [e for e in rec.events if e[0] == "update"] == []


async def test_unknown_fields_and_bad_events_do_not_kill_the_reflector(
    lw: ScriptedLW, run_informer: Runner, clock: FakeClock
) -> None:
    lw.lists.put_nowait(page([obj("a", "5")], "10"))
    w = FakeWatch()
    lw.watches.put_nowait(w)
    inf, rec = await run_informer()
    await until(lambda: len(lw.watch_calls) == 1)
    w.push({"type": "ADDED", "object": {"metadata": {"resourceVersion": "11"}}})  # no name
    await until(lambda: clock.waiters == 1, "backoff after the bad event")
    lw.lists.put_nowait(page([obj("a", "5"), obj("b", "12")], "12"))
    await clock.step()
    await until(lambda: "ns/b" in inf.store)
    assert rec.events[-1] == ("add", "ns/b", "12")


async def refused() -> aiohttp.ClientConnectorError:
    """The error aiohttp raises for a port nothing listens on (a real one, not built by hand)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with aiohttp.ClientSession() as session:
        try:
            await session.get(f"http://127.0.0.1:{port}/")
        except aiohttp.ClientConnectorError as err:
            return err
    raise AssertionError(f"port {port} answered")


async def test_refused_connection_backs_off_and_resumes_the_watch(
    lw: ScriptedLW, run_informer: Runner, clock: FakeClock
) -> None:
    _inf, rec, w1 = await watching(lw, run_informer, obj("a", "5"))
    await clock.advance(2)
    # the stream breaks mid-way after an event: resumed at once from the last version
    w1.push(
        {"type": "MODIFIED", "object": obj("a", "11")},
        aiohttp.ClientPayloadError("Response payload is not completed"),
    )
    lw.watches.put_nowait(await refused())
    await until(lambda: len(lw.watch_calls) == 2 and clock.waiters == 1, "backoff after refusal")
    assert lw.watch_calls[1]["resource_version"] == "11"
    lw.watches.put_nowait(FakeWatch())
    await clock.step()
    await until(lambda: len(lw.watch_calls) == 3)
    assert lw.watch_calls[2]["resource_version"] == "11"
    assert len(lw.list_calls) == 1
    assert rec.events == [("add", "ns/a", "5"), ("update", "ns/a", "11")]


async def test_list_at_a_version_the_server_has_not_reached_falls_back_to_latest(
    lw: ScriptedLW, run_informer: Runner, clock: FakeClock
) -> None:
    inf, _, w1 = await watching(lw, run_informer, obj("a", "5"))
    w1.push(WatchExpiredError({"code": 410}))
    too_large = ApiException(status=504, reason="Gateway Timeout")
    too_large.body = json.dumps(  # type: ignore[assignment]
        {
            "kind": "Status",
            "code": 504,
            "message": "Too large resource version: 10, current: 9",
            "details": {"causes": [{"reason": "ResourceVersionTooLarge"}]},
        }
    )
    lw.lists.put_nowait(too_large)
    lw.lists.put_nowait(page([obj("a", "5")], "9"))
    await until(lambda: clock.waiters == 1)
    await clock.step()
    await until(lambda: len(lw.list_calls) == 3)
    assert [c["resource_version"] for c in lw.list_calls] == ["0", "10", None]
    await until(lambda: inf.last_sync_resource_version == "9")


async def test_relist_at_a_version_is_not_paged(
    lw: ScriptedLW, run_informer: Runner, clock: FakeClock
) -> None:
    """Regression (issue 17, found by restarting a real kube-apiserver): a paged LIST at the
    last seen version is an exact read from etcd, which the restarted watch cache cannot resume
    a watch from; relisting that way looped on 410 forever. Like client-go, relist unpaged."""
    inf, _rec, w1 = await watching(lw, run_informer, obj("a", "5"))
    w1.push(WatchExpiredError({"kind": "Status", "code": 410, "reason": "Expired"}))
    await until(lambda: clock.waiters == 1, "backoff before relist")
    lw.lists.put_nowait(page([obj("a", "30")], "40"))
    await clock.step()
    await until(lambda: len(lw.list_calls) == 2, "relist")
    assert lw.list_calls[0] == {"resource_version": "0", "limit": 500, "continue_": None}
    assert lw.list_calls[1] == {"resource_version": "10", "limit": None, "continue_": None}
    await until(lambda: inf.store.get_by_key("ns/a") is not None)

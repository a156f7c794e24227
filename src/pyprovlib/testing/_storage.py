"""Object storage of the in-memory API server: JSON dicts per resource, one global
resourceVersion, and the bounded event history that watches resume from.

All methods are synchronous so that a write and the events it fans out are atomic with
respect to the event loop. Each event is serialised at most once, however many watchers see it.
"""

from __future__ import annotations

import asyncio
import bisect
import json
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from pyprovlib.kube._objects import Obj
from pyprovlib.kube._resources import RESOURCES, Resource
from pyprovlib.testing._status import expired

__all__ = ["Event", "Storage", "Watcher", "copy_json", "dumps"]

Key = tuple[str, str]
_T = TypeVar("_T")


_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def dumps(obj: Any) -> bytes:
    """Compact JSON, as the real server writes it."""
    # One shared encoder: json.dumps builds a new JSONEncoder per call once options are given.
    return _ENCODER.encode(obj).encode()


def copy_json(value: _T) -> _T:
    """A deep copy of a JSON document (dicts, lists and scalars): ``copy.deepcopy`` without its
    memo and dispatch, about five times faster. Nesting deeper than the recursion limit raises
    RecursionError, as deepcopy does."""
    t = type(value)
    if t is dict:
        return cast(_T, {k: copy_json(v) for k, v in cast(dict[str, Any], value).items()})
    if t is list:
        return cast(_T, [copy_json(v) for v in cast(list[Any], value)])
    return value


@dataclass
class Event:
    """One change to one object, at one resourceVersion."""

    rv: int
    type: str  # ADDED, MODIFIED, DELETED
    resource: Resource
    key: Key
    obj: Obj
    old: Obj | None = None
    _data: bytes | None = field(default=None, repr=False)
    _line: bytes | None = field(default=None, repr=False)

    def data(self) -> bytes:
        """``obj`` serialised, once: shared by the write's response and every watch line."""
        if self._data is None:
            self._data = dumps(self.obj)
        return self._data

    def line(self) -> bytes:
        """The watch-stream line for this event, serialised once and shared."""
        if self._line is None:
            self._line = b'{"type":"%s","object":%s}\n' % (self.type.encode(), self.data())
        return self._line


class Watcher:
    """A subscription to one resource's events (filtering happens in the watch handler).

    Events accumulate in a list that the handler takes whole: a burst of writes wakes it once
    and goes out in one socket write, instead of one queue hand-off and write per event."""

    __slots__ = ("_pending", "_waiter", "closed", "resource")

    def __init__(self, resource: Resource) -> None:
        self.resource = resource
        self.closed = False
        """True once the stream is to end (after the events already pending)."""
        self._pending: list[Event] = []
        self._waiter: asyncio.Future[None] | None = None

    def push(self, event: Event) -> None:
        """Queue one event and wake the handler."""
        self._pending.append(event)
        self._wake()

    def close(self) -> None:
        """End the stream: the handler stops once it has taken what is pending."""
        self.closed = True
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def take(self) -> list[Event]:
        """Every pending event, oldest first; the list starts empty again."""
        out, self._pending = self._pending, []
        return out

    async def wait(self, timeout: float | None) -> None:  # noqa: ASYNC109
        """Return once an event is pending or the watcher is closed, or after ``timeout``
        seconds (``None``: no limit)."""
        if self._pending or self.closed:
            return
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiter = waiter
        # A timer handle rather than asyncio.timeout(): this runs once per wake-up of every
        # open watch.
        timer = loop.call_later(timeout, _resolve, waiter) if timeout is not None else None
        try:
            await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class Storage:
    """Objects by resource and key, the global resourceVersion, and the watch history."""

    def __init__(self, watch_window: int = 10000) -> None:
        self.rv = 1
        self._objects: dict[Resource, dict[Key, Obj]] = {r: {} for r in RESOURCES}
        self._sorted: dict[Resource, list[Key] | None] = dict.fromkeys(RESOURCES)
        self._history: deque[Event] = deque(maxlen=max(1, watch_window))
        self._floor = self.rv  # every event with rv > floor is in the history
        self._watchers: dict[Resource, set[Watcher]] = {r: set() for r in RESOURCES}
        # Namespaced objects per namespace: deleting a namespace's content asks after every
        # removal whether the namespace is empty, which must not cost a sort of every key.
        self._in_namespace: dict[str, int] = {}
        # Each stored object's encoding once something needed it (a write's response, a
        # LIST): relists re-encode only what changed. Dropped when the object changes.
        self._encoded: dict[Resource, dict[Key, tuple[Obj, bytes]]] = {r: {} for r in RESOURCES}

    # --- reads -------------------------------------------------------------------------------

    def get(self, resource: Resource, namespace: str | None, name: str) -> Obj | None:
        """The stored object itself (callers must not mutate it)."""
        return self._objects[resource].get((namespace or "", name))

    def sorted_keys(self, resource: Resource) -> list[Key]:
        """Keys in etcd order (namespace, then name); cached until the key set changes."""
        keys = self._sorted[resource]
        if keys is None:
            keys = sorted(self._objects[resource])
            self._sorted[resource] = keys
        return keys

    def iter_from(
        self, resource: Resource, namespace: str | None, after: Key | None
    ) -> Iterator[tuple[Key, Obj]]:
        """Objects in key order, optionally within one namespace, strictly after ``after``."""
        keys = self.sorted_keys(resource)
        objects = self._objects[resource]
        i = bisect.bisect_right(keys, after) if after is not None else 0
        if namespace:
            i = max(i, bisect.bisect_left(keys, (namespace, "")))
        for k in keys[i:]:
            if namespace and k[0] != namespace:
                break
            obj = objects.get(k)
            if obj is not None:
                yield k, obj

    def count(self, resource: Resource) -> int:
        """How many objects of a resource are stored."""
        return len(self._objects[resource])

    def count_after(self, resource: Resource, namespace: str | None, after: Key) -> int:
        """How many objects follow ``after`` in key order (within ``namespace`` when given)."""
        keys = self.sorted_keys(resource)
        start = bisect.bisect_right(keys, after)
        end = bisect.bisect_left(keys, (namespace + "\x00", "")) if namespace else len(keys)
        return max(0, end - start)

    def namespace_empty(self, namespace: str) -> bool:
        """Whether no namespaced object lives in ``namespace``."""
        return not self._in_namespace.get(namespace)

    def in_namespace(self, namespace: str) -> list[tuple[Resource, Obj]]:
        """Every namespaced object in a namespace."""
        out: list[tuple[Resource, Obj]] = []
        for r in RESOURCES:
            if r.namespaced:
                out.extend((r, o) for _k, o in self.iter_from(r, namespace, None))
        return out

    # --- writes ------------------------------------------------------------------------------

    def next_rv(self) -> int:
        """Allocate the resourceVersion of the next write."""
        self.rv += 1
        return self.rv

    def put(self, resource: Resource, obj: Obj, rv: int, event_type: str) -> Event:
        """Store ``obj`` (already stamped with ``rv``) and record the event. The stored object
        is never mutated afterwards: replace it with another ``put``."""
        meta = obj["metadata"]
        key = (meta.get("namespace") or "", meta["name"])
        objects = self._objects[resource]
        old = objects.get(key)
        if old is None:
            # Keep the sorted key list (when built) in step: one insertion instead of a sort
            # of every key at the next LIST.
            keys = self._sorted[resource]
            if keys is not None:
                bisect.insort(keys, key)
            if key[0]:
                self._in_namespace[key[0]] = self._in_namespace.get(key[0], 0) + 1
        objects[key] = obj
        self._encoded[resource].pop(key, None)
        return self._emit(Event(rv, event_type, resource, key, obj, old))

    def remove(self, resource: Resource, obj: Obj, rv: int) -> Event:
        """Remove the object; ``obj`` is its final state stamped with the deletion ``rv``."""
        meta = obj["metadata"]
        key = (meta.get("namespace") or "", meta["name"])
        old = self._objects[resource].pop(key, None)
        self._encoded[resource].pop(key, None)
        if old is not None:
            keys = self._sorted[resource]
            if keys is not None:
                i = bisect.bisect_left(keys, key)
                if i < len(keys) and keys[i] == key:
                    del keys[i]
                else:  # pragma: no cover - the list always holds every stored key
                    self._sorted[resource] = None
            if key[0]:
                left = self._in_namespace.get(key[0], 0) - 1
                if left > 0:
                    self._in_namespace[key[0]] = left
                else:
                    self._in_namespace.pop(key[0], None)
        return self._emit(Event(rv, "DELETED", resource, key, obj, old))

    def _emit(self, event: Event) -> Event:
        if len(self._history) == self._history.maxlen:
            self._floor = self._history[0].rv
        self._history.append(event)
        for w in self._watchers[event.resource]:
            w.push(event)
        return event

    def encoded(self, obj: Obj) -> bytes:
        """``obj`` serialised, reusing the bytes of the write that stored it when ``obj`` is
        the object of one of the latest events (a write's response and its watch lines
        share one encoding)."""
        history = self._history
        for i in range(1, min(4, len(history)) + 1):
            event = history[-i]
            if event.obj is obj:
                data = event.data()
                if event.type != "DELETED" and self._objects[event.resource].get(event.key) is obj:
                    self._encoded[event.resource][event.key] = (obj, data)
                return data
        return dumps(obj)

    def encoded_item(self, resource: Resource, key: Key, obj: Obj) -> bytes:
        """``obj`` (found at ``key``, or a view of it) serialised; the stored object's bytes
        are kept until it changes."""
        cache = self._encoded[resource]
        hit = cache.get(key)
        if hit is not None and hit[0] is obj:
            return hit[1]
        data = dumps(obj)
        if self._objects[resource].get(key) is obj:
            cache[key] = (obj, data)
        return data

    # --- watch -------------------------------------------------------------------------------

    def check_rv(self, rv: int) -> None:
        """Raise 410 Expired when events after ``rv`` are no longer all retained."""
        if rv < self._floor:
            raise expired(rv, self._floor + 1)

    def events_after(self, resource: Resource, rv: int) -> list[Event]:
        """Retained events of ``resource`` newer than ``rv`` (call :meth:`check_rv` first)."""
        if not self._history or self._history[-1].rv <= rv:
            return []
        # history is ordered by rv; find the first newer event by bisection
        lo, hi = 0, len(self._history)
        while lo < hi:
            mid = (lo + hi) // 2
            if self._history[mid].rv <= rv:
                lo = mid + 1
            else:
                hi = mid
        out = []
        for i in range(lo, len(self._history)):
            e = self._history[i]
            if e.resource is resource:
                out.append(e)
        return out

    def subscribe(self, resource: Resource) -> Watcher:
        """Register a watcher; it receives every later event of ``resource``."""
        w = Watcher(resource)
        self._watchers[resource].add(w)
        return w

    def unsubscribe(self, watcher: Watcher) -> None:
        """Forget a watcher."""
        self._watchers[watcher.resource].discard(watcher)

    def drop_watches(self) -> int:
        """Close every open watch; returns how many there were."""
        n = 0
        for ws in self._watchers.values():
            for w in list(ws):
                w.close()
                n += 1
            ws.clear()
        return n

    def watcher_count(self) -> int:
        """Open watches."""
        return sum(len(ws) for ws in self._watchers.values())

    def compact(self) -> None:
        """Forget the history: resuming from any resourceVersion before now gets 410."""
        self._history.clear()
        self._floor = self.rv

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
from typing import Any

from pyprovlib.kube.resources import RESOURCES, Resource
from pyprovlib.testing._status import expired

__all__ = ["Event", "Storage", "Watcher"]

Obj = dict[str, Any]
Key = tuple[str, str]


def dumps(obj: Any) -> bytes:
    """Compact JSON, as the real server writes it."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


@dataclass
class Event:
    """One change to one object, at one resourceVersion."""

    rv: int
    type: str  # ADDED, MODIFIED, DELETED
    resource: Resource
    key: Key
    obj: Obj
    old: Obj | None = None
    _line: bytes | None = field(default=None, repr=False)

    def line(self) -> bytes:
        """The watch-stream line for this event, serialised once and shared."""
        if self._line is None:
            self._line = dumps({"type": self.type, "object": self.obj}) + b"\n"
        return self._line


class Watcher:
    """A subscription to one resource's events (filtering happens in the watch handler)."""

    def __init__(self, resource: Resource) -> None:
        self.resource = resource
        self.queue: asyncio.Queue[Event | None] = asyncio.Queue()

    def close(self) -> None:
        """End the stream: the handler stops at the sentinel."""
        self.queue.put_nowait(None)


class Storage:
    """Objects by resource and key, the global resourceVersion, and the watch history."""

    def __init__(self, watch_window: int = 10000) -> None:
        self.rv = 1
        self._objects: dict[Resource, dict[Key, Obj]] = {r: {} for r in RESOURCES}
        self._sorted: dict[Resource, list[Key] | None] = dict.fromkeys(RESOURCES)
        self._history: deque[Event] = deque(maxlen=max(1, watch_window))
        self._floor = self.rv  # every event with rv > floor is in the history
        self._watchers: dict[Resource, set[Watcher]] = {r: set() for r in RESOURCES}

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
        for r in RESOURCES:
            if r.namespaced:
                keys = self.sorted_keys(r)
                i = bisect.bisect_left(keys, (namespace, ""))
                if i < len(keys) and keys[i][0] == namespace:
                    return False
        return True

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

    def put(self, resource: Resource, obj: Obj, rv: int, event_type: str) -> None:
        """Store ``obj`` (already stamped with ``rv``) and record the event."""
        meta = obj["metadata"]
        key = (meta.get("namespace") or "", meta["name"])
        objects = self._objects[resource]
        old = objects.get(key)
        if old is None:
            self._sorted[resource] = None
        objects[key] = obj
        self._emit(Event(rv, event_type, resource, key, obj, old))

    def remove(self, resource: Resource, obj: Obj, rv: int) -> None:
        """Remove the object; ``obj`` is its final state stamped with the deletion ``rv``."""
        meta = obj["metadata"]
        key = (meta.get("namespace") or "", meta["name"])
        old = self._objects[resource].pop(key, None)
        self._sorted[resource] = None
        self._emit(Event(rv, "DELETED", resource, key, obj, old))

    def _emit(self, event: Event) -> None:
        if len(self._history) == self._history.maxlen:
            self._floor = self._history[0].rv
        self._history.append(event)
        for w in self._watchers[event.resource]:
            w.queue.put_nowait(event)

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

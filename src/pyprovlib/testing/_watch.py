"""Watch streams of the in-memory API server: the backlog from a resourceVersion (or the
current state), then every matching event, bookmarks, 410 Expired for a compacted version, and
the end at ``timeoutSeconds`` — with the real server's selector semantics (an object leaving a
selector is a DELETED event, one entering it an ADDED event).

One job per part: :func:`_parse_watch` reads the request's options, :class:`_View` turns stored
objects and events into the watch's lines (selectors, the events.k8s.io/v1 view, Table
encoding), :func:`_backlog` is what the stream starts with, :func:`_live` what follows until
the end, and :func:`_watch_chunks` strings them together around one subscription.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable, Mapping
from dataclasses import dataclass

from pyprovlib.kube import _resources as R
from pyprovlib.kube._clock import Clock
from pyprovlib.kube._objects import Obj
from pyprovlib.kube._resources import Resource
from pyprovlib.testing import _discovery
from pyprovlib.testing._events import core_to_v1
from pyprovlib.testing._http import Request, Stream
from pyprovlib.testing._requests import Target, selectors, truthy, validate_watch_options
from pyprovlib.testing._selectors import FieldSelector, LabelSelector, parse_field_selector
from pyprovlib.testing._status import ApiError, bad_request
from pyprovlib.testing._storage import Event, Storage, Watcher, copy_json, dumps

__all__ = ["open_watch"]


@dataclass(frozen=True)
class _WatchOptions:
    """What a watch request asked for, parsed and checked."""

    rv_param: str  # resourceVersion as given: "" or "0" means "from the current state"
    since: int  # the resourceVersion the events start after
    send_initial: bool  # sendInitialEvents: the current state, then an initial-events-end bookmark
    timeout: float | None
    bookmarks: bool  # allowWatchBookmarks
    expired: ApiError | None  # 410 Expired: the resourceVersion was compacted away

    @property
    def from_current_state(self) -> bool:
        return self.rv_param in ("", "0") or self.send_initial


def _parse_watch(storage: Storage, query: Mapping[str, str]) -> _WatchOptions:
    """A watch's options from its query; a bad one is a 400 (an expired version is not: it is
    the stream's one ERROR event)."""
    rv_param = query.get("resourceVersion") or ""
    validate_watch_options(
        query.get("sendInitialEvents"), query.get("resourceVersionMatch"), query.get("continue")
    )
    try:
        timeout = float(query["timeoutSeconds"]) if query.get("timeoutSeconds") else None
    except ValueError as e:
        raise bad_request(f"invalid timeoutSeconds: {query.get('timeoutSeconds')}") from e
    since = storage.rv
    expired: ApiError | None = None
    if rv_param not in ("", "0"):
        try:
            since = int(rv_param)
        except ValueError as e:
            raise bad_request(f"invalid resource version: {rv_param}") from e
        try:
            storage.check_rv(since)
        except ApiError as e:
            expired = e
    return _WatchOptions(
        rv_param=rv_param,
        since=since,
        send_initial=truthy(query.get("sendInitialEvents")),
        timeout=timeout,
        bookmarks=truthy(query.get("allowWatchBookmarks")),
        expired=expired,
    )


class _View:
    """What one watch sees of a resource, as the lines of its stream: the objects its namespace
    and selectors match (events.k8s.io/v1 Events as a view of the stored core/v1 ones), encoded
    as JSON or as Table rows (the first with its column definitions)."""

    def __init__(
        self,
        r: Resource,
        namespace: str | None,
        labels: LabelSelector,
        fields: FieldSelector,
        *,
        table: bool,
        include: str,
        clock: Clock,
    ) -> None:
        self.resource = r
        self.namespace = namespace
        self.labels = labels
        self.fields = fields
        self.table = table
        self.include = include
        self.clock = clock
        self.stored = R.EVENTS if r is R.EVENTS_V1 else r
        self.convert: Callable[[Obj], Obj] | None = core_to_v1 if r is R.EVENTS_V1 else None
        self._first_table = True
        self._selective = bool(namespace or labels.requirements or fields.terms)

    def encode(self, event_type: str, obj: Obj, shared: Event | None = None) -> bytes:
        """One event's line; ``shared`` is the stored event whose encoding may be reused."""
        if self.table:
            t = _discovery.to_table(
                self.resource,
                [obj],
                self.clock.now(),
                self.include,
                {"resourceVersion": obj["metadata"].get("resourceVersion", "")},
                with_columns=self._first_table,
            )
            self._first_table = False
            return dumps({"type": event_type, "object": t}) + b"\n"
        if shared is not None and shared.type == event_type and shared.obj is obj:
            return shared.line()
        return dumps({"type": event_type, "object": obj}) + b"\n"

    def matches(self, obj: Obj | None) -> bool:
        if obj is None:
            return False
        if not self._selective:
            return True
        if self.namespace and (obj.get("metadata") or {}).get("namespace") != self.namespace:
            return False
        return self.labels.matches(obj) and self.fields.matches(obj)

    def shown(self, obj: Obj) -> Obj:
        return self.convert(obj) if self.convert is not None else obj

    def line(self, event: Event) -> bytes | None:
        """A stored event as this watch sees it, or None: an object entering the selection is
        ADDED, one leaving it DELETED (at the event's resourceVersion)."""
        obj = self.shown(event.obj)
        old = self.shown(event.old) if event.old is not None else None
        now_in = self.matches(obj)
        if event.type == "ADDED":
            return self.encode("ADDED", obj, event) if now_in else None
        if event.type == "DELETED":
            return self.encode("DELETED", obj, event) if now_in or self.matches(old) else None
        was_in = self.matches(old)
        if now_in and was_in:
            return self.encode("MODIFIED", obj, event)
        if now_in:
            return self.encode("ADDED", obj)
        if was_in and old is not None:
            gone = copy_json(old)
            gone["metadata"]["resourceVersion"] = str(event.rv)
            return self.encode("DELETED", gone)
        return None

    def bookmark(self, rv: int, *, initial_events_end: bool = False) -> bytes:
        metadata: Obj = {"resourceVersion": str(rv)}
        if initial_events_end:
            metadata["annotations"] = {"k8s.io/initial-events-end": "true"}
        obj = {"kind": self.resource.kind, "apiVersion": self.resource.api_version}
        return dumps({"type": "BOOKMARK", "object": {**obj, "metadata": metadata}}) + b"\n"


def _backlog(storage: Storage, view: _View, options: _WatchOptions) -> bytes:
    """What the stream starts with: the current state as ADDED events (with the
    initial-events-end bookmark when asked for), or the events after ``since``."""
    lines: list[bytes] = []
    if options.from_current_state:
        for _k, current in storage.iter_from(view.stored, view.namespace, None):
            shown = view.shown(current)
            if view.matches(shown):
                lines.append(view.encode("ADDED", shown))
        if options.send_initial:
            lines.append(view.bookmark(storage.rv, initial_events_end=True))
    else:
        for past in storage.events_after(view.stored, options.since):
            line = view.line(past)
            if line is not None:
                lines.append(line)
    return b"".join(lines)


async def _live(
    storage: Storage,
    watcher: Watcher,
    view: _View,
    options: _WatchOptions,
    bookmark_interval: float,
) -> AsyncGenerator[bytes, None]:
    """The events as they happen, each wake-up's as one write, with a bookmark every
    ``bookmark_interval`` when allowed, until the timeout or the watcher's close."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + options.timeout if options.timeout else None
    next_bookmark = loop.time() + bookmark_interval
    while True:
        chunk = [line for e in watcher.take() if (line := view.line(e)) is not None]
        if chunk:
            yield b"".join(chunk)
        if watcher.closed:
            return
        now = loop.time()
        if deadline is not None and now >= deadline:
            return
        if options.bookmarks and now >= next_bookmark:
            yield view.bookmark(storage.rv)
            next_bookmark = now + bookmark_interval
        waits = [deadline - now] if deadline is not None else []
        if options.bookmarks:
            waits.append(next_bookmark - now)
        await watcher.wait(min(waits) if waits else None)


async def _watch_chunks(
    storage: Storage, view: _View, options: _WatchOptions, bookmark_interval: float
) -> AsyncGenerator[bytes, None]:
    """The watch stream's bytes: the 410 of an expired version alone, or the backlog (b"" opens
    the stream), then the live events, on one subscription taken with the backlog."""
    if options.expired is not None:
        yield dumps({"type": "ERROR", "object": options.expired.body()}) + b"\n"
        return
    # subscribe and take the backlog in one synchronous step: no gap, no duplicate
    watcher = storage.subscribe(view.stored)
    try:
        yield _backlog(storage, view, options)
        async for chunk in _live(storage, watcher, view, options, bookmark_interval):
            yield chunk
    finally:
        storage.unsubscribe(watcher)


def open_watch(
    storage: Storage,
    clock: Clock,
    bookmark_interval: float,
    request: Request,
    target: Target,
    *,
    table: bool,
) -> Stream:
    """A watch request's stream: its backlog, then the matching events as they happen, with
    bookmarks, until its timeout, a dropped connection or the server's end."""
    r = target.resource
    labels, fields = selectors(request.query, r)
    if target.name is not None:
        # a watch on one object is a watch with metadata.name=<name>
        name_sel = parse_field_selector(f"metadata.name={target.name}", r.group, r.plural)
        fields = FieldSelector(fields.terms + name_sel.terms)
    options = _parse_watch(storage, request.query)
    view = _View(
        r,
        target.namespace,
        labels,
        fields,
        table=table,
        include=request.query.get("includeObject", "Metadata"),
        clock=clock,
    )
    return Stream(_watch_chunks(storage, view, options, bookmark_interval))

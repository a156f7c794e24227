"""Watch streams of the in-memory API server: the backlog from a resourceVersion (or the
current state), then every matching event, bookmarks, 410 Expired for a compacted version, and
the end at ``timeoutSeconds`` — with the real server's selector semantics (an object leaving a
selector is a DELETED event, one entering it an ADDED event)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

from pyprovlib.kube import resources as R
from pyprovlib.kube.clock import Clock
from pyprovlib.kube.resources import Resource
from pyprovlib.testing import _discovery
from pyprovlib.testing._events import core_to_v1
from pyprovlib.testing._http import Request, Stream
from pyprovlib.testing._requests import Target, selectors, truthy, validate_watch_options
from pyprovlib.testing._selectors import FieldSelector, LabelSelector, parse_field_selector
from pyprovlib.testing._status import ApiError, bad_request
from pyprovlib.testing._storage import Event, Obj, Storage, copy_json, dumps

__all__ = ["open_watch"]


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
    q = request.query
    r = target.resource
    labels, fields = selectors(q, r)
    if target.name is not None:
        # a watch on one object is a watch with metadata.name=<name>
        name_sel = parse_field_selector(f"metadata.name={target.name}", r.group, r.plural)
        fields = FieldSelector(fields.terms + name_sel.terms)
    rv_param = q.get("resourceVersion") or ""
    validate_watch_options(
        q.get("sendInitialEvents"), q.get("resourceVersionMatch"), q.get("continue")
    )
    send_initial = truthy(q.get("sendInitialEvents"))
    try:
        timeout = float(q["timeoutSeconds"]) if q.get("timeoutSeconds") else None
    except ValueError as e:
        raise bad_request(f"invalid timeoutSeconds: {q.get('timeoutSeconds')}") from e
    bookmarks = truthy(q.get("allowWatchBookmarks"))
    include = q.get("includeObject", "Metadata")
    if rv_param not in ("", "0"):
        try:
            since = int(rv_param)
        except ValueError as e:
            raise bad_request(f"invalid resource version: {rv_param}") from e
    else:
        since = storage.rv
    expired: ApiError | None = None
    if rv_param not in ("", "0"):
        try:
            storage.check_rv(since)
        except ApiError as e:
            expired = e
    return Stream(
        _watch_chunks(
            storage,
            clock,
            r,
            target.namespace,
            labels=labels,
            fields=fields,
            bookmark_interval=bookmark_interval,
            rv_param=rv_param,
            since=since,
            send_initial=send_initial,
            timeout=timeout,
            bookmarks=bookmarks,
            table=table,
            include=include,
            expired=expired,
        )
    )


async def _watch_chunks(
    storage: Storage,
    clock: Clock,
    r: Resource,
    namespace: str | None,
    *,
    labels: LabelSelector,
    fields: FieldSelector,
    bookmark_interval: float,
    rv_param: str,
    since: int,
    send_initial: bool,
    timeout: float | None,  # noqa: ASYNC109
    bookmarks: bool,
    table: bool,
    include: str,
    expired: ApiError | None,
) -> AsyncGenerator[bytes, None]:
    """The watch stream's bytes: the backlog first (or b"" to open the stream), then the
    matching events as they happen, bookmarks, and the end."""
    if expired is not None:
        yield dumps({"type": "ERROR", "object": expired.body()}) + b"\n"
        return
    # events.k8s.io/v1 Events are a view of the stored core/v1 Events
    stored = R.EVENTS if r is R.EVENTS_V1 else r
    convert = core_to_v1 if r is R.EVENTS_V1 else None
    first_table = [True]
    selective = bool(namespace or labels.requirements or fields.terms)

    def encode(event_type: str, obj: Obj, shared: Event | None = None) -> bytes:
        if table:
            t = _discovery.to_table(
                r,
                [obj],
                clock.now(),
                include,
                {"resourceVersion": obj["metadata"].get("resourceVersion", "")},
                with_columns=first_table[0],
            )
            first_table[0] = False
            return dumps({"type": event_type, "object": t}) + b"\n"
        if shared is not None and shared.type == event_type and shared.obj is obj:
            return shared.line()
        return dumps({"type": event_type, "object": obj}) + b"\n"

    def matches(obj: Obj | None) -> bool:
        if obj is None:
            return False
        if not selective:
            return True
        if namespace and (obj.get("metadata") or {}).get("namespace") != namespace:
            return False
        return labels.matches(obj) and fields.matches(obj)

    def filtered(event: Event) -> bytes | None:
        obj, old = event.obj, event.old
        if convert is not None:
            obj = convert(obj)
            old = convert(old) if old is not None else None
        now_in = matches(obj)
        if event.type == "ADDED":
            return encode("ADDED", obj, event) if now_in else None
        if event.type == "DELETED":
            return encode("DELETED", obj, event) if now_in or matches(old) else None
        was_in = matches(old)
        if now_in and was_in:
            return encode("MODIFIED", obj, event)
        if now_in:
            return encode("ADDED", obj)
        if was_in and old is not None:
            gone = copy_json(old)
            gone["metadata"]["resourceVersion"] = str(event.rv)
            return encode("DELETED", gone)
        return None

    # subscribe and take the backlog in one synchronous step: no gap, no duplicate
    watcher = storage.subscribe(stored)
    try:
        backlog: list[bytes] = []
        if rv_param in ("", "0") or send_initial:
            for _k, current in storage.iter_from(stored, namespace, None):
                shown = convert(current) if convert is not None else current
                if matches(shown):
                    backlog.append(encode("ADDED", shown))
            if send_initial:
                backlog.append(
                    dumps(
                        {
                            "type": "BOOKMARK",
                            "object": {
                                "kind": r.kind,
                                "apiVersion": r.api_version,
                                "metadata": {
                                    "resourceVersion": str(storage.rv),
                                    "annotations": {"k8s.io/initial-events-end": "true"},
                                },
                            },
                        }
                    )
                    + b"\n"
                )
        else:
            for past in storage.events_after(stored, since):
                line = filtered(past)
                if line is not None:
                    backlog.append(line)

        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout if timeout else None
        next_bookmark = loop.time() + bookmark_interval
        yield b"".join(backlog)
        while True:
            # Everything that happened since the last wake-up goes out as one write.
            chunk = [line for e in watcher.take() if (line := filtered(e)) is not None]
            if chunk:
                yield b"".join(chunk)
            if watcher.closed:
                break
            now = loop.time()
            if deadline is not None and now >= deadline:
                break
            if bookmarks and now >= next_bookmark:
                yield (
                    dumps(
                        {
                            "type": "BOOKMARK",
                            "object": {
                                "kind": r.kind,
                                "apiVersion": r.api_version,
                                "metadata": {"resourceVersion": str(storage.rv)},
                            },
                        }
                    )
                    + b"\n"
                )
                next_bookmark = now + bookmark_interval
            wait = None
            if deadline is not None:
                wait = deadline - now
            if bookmarks:
                wait = min(wait, next_bookmark - now) if wait is not None else next_bookmark - now
            await watcher.wait(wait)
    finally:
        storage.unsubscribe(watcher)

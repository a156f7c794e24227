"""The reflector: LIST then WATCH one collection forever (client-go's ``tools/cache``
``Reflector`` and ``ListerWatcher``).

It lists in pages, watches from the last resourceVersion it saw, relists when the server
says that version is gone (410) and backs off on failures, honouring a 429's Retry-After.
What it sees goes to a :class:`ReflectorSink`; the
:class:`~pyprovlib.kube.SharedInformer` is the one pyprovlib uses.
"""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from dataclasses import KW_ONLY, dataclass
from typing import Protocol

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException

from pyprovlib._errors import PyprovlibError
from pyprovlib._logging import get_logger
from pyprovlib.kube._backoff import BackoffTimer
from pyprovlib.kube._clock import Clock, RealClock
from pyprovlib.kube._config import describe_transport_error
from pyprovlib.kube._errors import (
    is_gone,
    is_too_many_requests,
    retry_after_seconds,
    status_reason,
)
from pyprovlib.kube._objects import Obj
from pyprovlib.kube._rest import ResourceClient, WatchError

__all__ = [
    "DEFAULT_PAGE_SIZE",
    "MIN_WATCH_TIMEOUT",
    "ListerWatcher",
    "Reflector",
    "ReflectorSink",
    "ResourceListerWatcher",
    "TransformError",
]

log = get_logger(__name__)

DEFAULT_PAGE_SIZE = 500
"""Items per LIST page (client-go's pager default)."""
MIN_WATCH_TIMEOUT = 300.0
"""Watches ask the server to end them after this many seconds times (1 + random), like client-go,
so watches of many clients do not all restart at once."""
_SHORT_WATCH = 1.0

# Transport failures: the request never got an HTTP answer or the stream broke.
_TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (aiohttp.ClientError, OSError)


class ListerWatcher(Protocol):
    """The seam between the reflector and the API (client-go's ``ListerWatcher``).

    ``list`` returns one List object (``items``, ``metadata.resourceVersion``,
    ``metadata.continue``) and raises ``ApiException`` on HTTP errors; ``watch`` returns an async
    context manager yielding an async iterator of ``{"type", "object"}`` events which raises
    :class:`~pyprovlib.kube.WatchExpiredError` / ``WatchError`` on ERROR events.
    """

    async def list(
        self, *, resource_version: str | None, limit: int | None, continue_: str | None
    ) -> Obj:
        """One LIST request."""
        ...

    def watch(
        self, *, resource_version: str, timeout_seconds: int | None, allow_bookmarks: bool
    ) -> AbstractAsyncContextManager[AsyncIterator[Obj]]:
        """One WATCH request."""
        ...


@dataclass(eq=False)
class ResourceListerWatcher:
    """A :class:`ListerWatcher` over a :class:`ResourceClient`, scoped by namespace and
    selectors."""

    client: ResourceClient
    _: KW_ONLY
    namespace: str | None = None
    label_selector: str | None = None
    field_selector: str | None = None

    async def list(
        self, *, resource_version: str | None, limit: int | None, continue_: str | None
    ) -> Obj:
        """LIST one page."""
        return await self.client.list(
            self.namespace,
            label_selector=self.label_selector,
            field_selector=self.field_selector,
            limit=limit,
            continue_=continue_,
            resource_version=resource_version,
        )

    def watch(
        self, *, resource_version: str, timeout_seconds: int | None, allow_bookmarks: bool
    ) -> AbstractAsyncContextManager[AsyncIterator[Obj]]:
        """Open a WATCH."""
        return self.client.watch(
            self.namespace,
            resource_version=resource_version,
            label_selector=self.label_selector,
            field_selector=self.field_selector,
            timeout_seconds=timeout_seconds,
            allow_bookmarks=allow_bookmarks,
        )


class ReflectorSink(Protocol):
    """Where a :class:`Reflector` delivers what it learns."""

    def replace(self, items: list[Obj], resource_version: str) -> None:
        """A complete LIST: the cache must now hold exactly ``items``."""
        ...

    def apply(self, event_type: str, obj: Obj) -> None:
        """A watch event: ``ADDED``, ``MODIFIED`` or ``DELETED``."""
        ...


class TransformError(PyprovlibError):
    """An informer's transform raised on (or returned something other than a dict for) an
    object: the LIST or watch that carried the object fails, and the informer relists after a
    backoff, so the cache never skips a change."""


class _VeryShortWatchError(PyprovlibError):
    """The watch closed within a second without any event: something is wrong server-side."""


class Reflector:
    """LIST then WATCH one collection forever, feeding a :class:`ReflectorSink`.

    client-go's semantics: the first LIST asks for resourceVersion "0", later ones for the last
    seen resourceVersion ("" after that failed with 410); pages of ``page_size`` with continue
    tokens (an expired token falls back to one full LIST); the WATCH starts at the LIST's
    resourceVersion with bookmarks and a randomized server timeout and is resumed from the last
    seen resourceVersion when it ends. A 410 relists; 429 and refused connections back off and
    re-watch; other failures back off (jittered, exponential) and relist.
    """

    def __init__(
        self,
        lister_watcher: ListerWatcher,
        sink: ReflectorSink,
        *,
        name: str = "",
        clock: Clock | None = None,
        backoff: BackoffTimer | None = None,
        page_size: int = DEFAULT_PAGE_SIZE,
        min_watch_timeout: float = MIN_WATCH_TIMEOUT,
        rng: random.Random | None = None,
    ) -> None:
        self.lister_watcher = lister_watcher
        self.sink = sink
        self.name = name
        self._clock = clock or RealClock()
        self._backoff = backoff or BackoffTimer(clock=self._clock)
        self.page_size = page_size
        self.min_watch_timeout = min_watch_timeout
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not cryptography
        self._last_sync_rv = ""
        self._last_sync_rv_unavailable = False
        # The server paged a LIST at "0" (it has no watch cache): keep paging relists too.
        self._paginated_result = False
        self._log = log.bind(resource=name)
        self.lists = 0
        """How many complete LISTs were delivered (for tests and metrics)."""
        self.watches = 0
        """How many WATCH requests were opened."""

    @property
    def last_sync_resource_version(self) -> str:
        """The resourceVersion of the last LIST or watch event (bookmarks included)."""
        return self._last_sync_rv

    async def run(self) -> None:
        """List and watch until cancelled, backing off between failed attempts."""
        while True:
            retry_after: float | None = None
            try:
                await self.list_and_watch()
            except ApiException as err:
                retry_after = retry_after_seconds(err) if is_too_many_requests(err) else None
                self._log.warning(
                    "list/watch failed",
                    status=err.status,
                    reason=status_reason(err) or err.reason,
                    message=_status_message(err),
                )
            except _TRANSPORT_ERRORS as err:
                self._log.warning("list/watch failed", error=describe_transport_error(err))
            except _VeryShortWatchError as err:
                self._log.warning("watch closed unexpectedly", error=str(err))
            except TransformError as err:
                self._log.error(
                    "informer transform failed; relisting after a backoff", error=str(err)
                )
            except Exception:
                # A bug (say, an object without a name) must not end the informer for good.
                self._log.exception("list/watch failed unexpectedly")
            delay = self._backoff.next()
            if retry_after is not None:
                delay = max(delay, retry_after)
            await self._clock.sleep(delay)

    async def list_and_watch(self) -> None:
        """One LIST then WATCHes; returns (or raises) when a relist is needed."""
        await self._list()
        await self._watch()

    def _relist_resource_version(self) -> str | None:
        if self._last_sync_rv_unavailable:
            return None  # a consistent read from etcd
        if not self._last_sync_rv:
            return "0"  # any version: the server may answer from its watch cache
        return self._last_sync_rv

    async def _list(self) -> None:
        rv = self._relist_resource_version()
        try:
            items, list_rv = await self._list_pages(rv)
        except ApiException as err:
            if not (is_gone(err) or _is_too_large_resource_version(err)) or rv is None:
                raise
            self._log.info("list at resourceVersion expired; listing latest", resource_version=rv)
            self._last_sync_rv_unavailable = True
            items, list_rv = await self._list_pages(None)
        self._last_sync_rv_unavailable = False
        self.sink.replace(items, list_rv)
        self._last_sync_rv = list_rv
        self.lists += 1
        self._log.debug("listed", items=len(items), resource_version=list_rv)

    async def _list_pages(self, rv: str | None) -> tuple[list[Obj], str]:
        lw = self.lister_watcher
        items: list[Obj] = []
        list_rv = ""
        continue_: str | None = None
        page_rv = rv
        limit = self.page_size or None
        if rv not in (None, "", "0") and not self._paginated_result:
            # client-go: a relist at a version goes unpaged, so the watch cache answers with
            # data at least that fresh. Paged, it would be an exact read at that version, which
            # after an apiserver restart the watch cache cannot resume from: 410, relist at the
            # same version, 410, ... forever.
            limit = None
        while True:
            try:
                page = await lw.list(resource_version=page_rv, limit=limit, continue_=continue_)
            except ApiException as err:
                if not (continue_ and is_gone(err)):
                    raise
                # The continue token outlived the server's history: one full list instead
                # (client-go's pager with FullListIfExpired).
                self._log.info("list continuation expired; listing in one request")
                page = await lw.list(resource_version=None, limit=None, continue_=None)
                meta = page.get("metadata") or {}
                return list(page.get("items") or ()), str(meta.get("resourceVersion") or "")
            meta = page.get("metadata") or {}
            if continue_ is None:
                list_rv = str(meta.get("resourceVersion") or "")
            page_items = page.get("items")
            if page_items:
                items.extend(page_items)
            continue_ = meta.get("continue") or None
            if continue_ and page_rv == "0":
                self._paginated_result = True
            if not continue_:
                return items, list_rv
            # A continue token carries its snapshot; the server rejects a resourceVersion too.
            page_rv = None

    async def _watch(self) -> None:
        lw = self.lister_watcher
        while True:
            timeout = int(self.min_watch_timeout * (1.0 + self._rng.random()))
            started = self._clock.monotonic()
            events = 0
            try:
                self.watches += 1
                async with lw.watch(
                    resource_version=self._last_sync_rv,
                    timeout_seconds=timeout,
                    allow_bookmarks=True,
                ) as stream:
                    async for event in stream:
                        events += 1
                        self._handle_event(event)
            except ApiException as err:
                if is_gone(err):
                    # Relist from the last seen version: a LIST at a version returns data at
                    # least that fresh, so the cache cannot go back in time.
                    self._log.info("watch expired; relisting", resource_version=self._last_sync_rv)
                    return
                if is_too_many_requests(err):
                    delay = max(self._backoff.next(), retry_after_seconds(err) or 0.0)
                    self._log.info("watch throttled; backing off", delay=round(delay, 3))
                    await self._clock.sleep(delay)
                    continue
                raise
            except aiohttp.ClientConnectorError as err:
                # The server is not listening (restarting?): wait and resume the watch.
                delay = self._backoff.next()
                self._log.info(
                    "watch could not connect; backing off", error=describe_transport_error(err)
                )
                await self._clock.sleep(delay)
                continue
            except _TRANSPORT_ERRORS as err:
                # A dropped stream ends the watch like a server-side close; resume below.
                self._log.debug("watch stream broke", error=describe_transport_error(err))
            if events == 0 and self._clock.monotonic() - started < _SHORT_WATCH:
                raise _VeryShortWatchError(
                    f"watch of {self.name or 'objects'} lasted less than a second and "
                    "delivered no event"
                )
            self._log.debug("watch ended; resuming", events=events)

    def _handle_event(self, event: Obj) -> None:
        event_type = event.get("type")
        obj = event.get("object")
        if not isinstance(obj, dict):
            raise ValueError(f"watch event {event_type!r} carries no object")
        if event_type in ("ADDED", "MODIFIED", "DELETED"):
            self.sink.apply(event_type, obj)
        elif event_type != "BOOKMARK":
            self._log.warning("unknown watch event type ignored", type=event_type)
            return
        meta = obj.get("metadata")
        rv = meta.get("resourceVersion") if isinstance(meta, dict) else None
        if rv:
            self._last_sync_rv = str(rv)


def _is_too_large_resource_version(err: ApiException) -> bool:
    """The server has not caught up with the asked resourceVersion (client-go's
    ``isTooLargeResourceVersionError``): like 410, fall back to the latest version."""
    if err.status != 504:
        return False
    try:
        body = json.loads(err.body or b"")
    except (TypeError, ValueError):
        return False
    details = body.get("details") if isinstance(body, dict) else None
    causes = details.get("causes") if isinstance(details, dict) else None
    if isinstance(causes, list) and any(
        isinstance(c, dict) and c.get("reason") == "ResourceVersionTooLarge" for c in causes
    ):
        return True
    message = body.get("message") if isinstance(body, dict) else None
    return isinstance(message, str) and "Too large resource version" in message


def _status_message(err: ApiException) -> str:
    """The Status ``message`` of an error body, without headers or the whole body."""
    if isinstance(err, WatchError):
        return str(err.status_object.get("message") or "")
    try:
        body = json.loads(err.body or b"")
    except (TypeError, ValueError):
        return ""
    message = body.get("message") if isinstance(body, dict) else None
    return message if isinstance(message, str) else ""

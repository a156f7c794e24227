"""Informers: a cache of one resource kept current by LIST+WATCH, with event handlers.

client-go's ``Reflector``, ``SharedIndexInformer`` and ``SharedInformerFactory`` for asyncio.
The :class:`Reflector` lists (paginated) and watches, resuming from the last seen
resourceVersion and relisting on 410; the :class:`SharedInformer` applies what it reports to its
:class:`~pyprovlib.kube.store.Indexer` and calls the handlers; the factory makes sure a process
runs one LIST+WATCH per (resource, namespace, selectors). A transform (client-go's
``TransformFunc``) may reshape every object before it is cached: :func:`strip_managed_fields`
is the one pyprovlib's controllers use.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import KW_ONLY, dataclass, field, replace
from typing import Any, Protocol

import aiohttp
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException

from pyprovlib._logging import get_logger
from pyprovlib.errors import PyprovlibError
from pyprovlib.kube.backoff import REFLECTOR_BACKOFF, BackoffTimer
from pyprovlib.kube.clock import Clock, RealClock
from pyprovlib.kube.config import describe_transport_error
from pyprovlib.kube.errors import (
    is_gone,
    is_too_many_requests,
    retry_after_seconds,
    status_reason,
)
from pyprovlib.kube.objects import Obj, meta_namespace_key
from pyprovlib.kube.resources import Resource
from pyprovlib.kube.rest import ResourceClient, WatchError
from pyprovlib.kube.store import DeletedFinalStateUnknown, Indexer, IndexFunc, KeyFunc

__all__ = [
    "EventHandlerRegistration",
    "ListerWatcher",
    "OnAdd",
    "OnDelete",
    "OnUpdate",
    "Reflector",
    "ReflectorSink",
    "ResourceListerWatcher",
    "SharedInformer",
    "SharedInformerFactory",
    "TransformError",
    "TransformFunc",
    "strip_managed_fields",
]

log = get_logger(__name__)

OnAdd = Callable[[Obj], None]
"""``on_add(obj)``: an object appeared in the cache."""
OnUpdate = Callable[[Obj, Obj], None]
"""``on_update(old, new)``: an object changed (or a resync re-delivered it: ``old is new``)."""
OnDelete = Callable[[Obj | DeletedFinalStateUnknown], None]
"""``on_delete(obj)``: an object left the cache; a tombstone when its final state is unknown."""
TransformFunc = Callable[[Obj], Obj]
"""client-go's ``cache.TransformFunc``: called with every object an informer receives (each item
of a LIST, the object of every ADDED, MODIFIED and DELETED watch event) before it is cached or
handed to a handler; what it returns is cached instead. The object is freshly decoded and
nobody else holds it, so the transform may change it in place and return it. It must keep the
object's name, namespace and resourceVersion, and must be quick: it runs on the event loop for
every event. If it raises, the LIST or watch fails as a whole, with :class:`TransformError`:
the cache keeps what it had, and the informer relists after a backoff."""

DEFAULT_PAGE_SIZE = 500
"""Items per LIST page (client-go's pager default)."""
MIN_WATCH_TIMEOUT = 300.0
"""Watches ask the server to end them after this many seconds times (1 + random), like client-go,
so watches of many clients do not all restart at once."""
MINIMUM_RESYNC_PERIOD = 1.0
"""A handler's resync period is never shorter than this (client-go's minimumResyncPeriod)."""
_SHORT_WATCH = 1.0

# Transport failures: the request never got an HTTP answer or the stream broke.
_TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (aiohttp.ClientError, OSError)


class ListerWatcher(Protocol):
    """The seam between the reflector and the API (client-go's ``ListerWatcher``).

    ``list`` returns one List object (``items``, ``metadata.resourceVersion``,
    ``metadata.continue``) and raises ``ApiException`` on HTTP errors; ``watch`` returns an async
    context manager yielding an async iterator of ``{"type", "object"}`` events which raises
    :class:`~pyprovlib.kube.rest.WatchExpiredError` / ``WatchError`` on ERROR events.
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


def strip_managed_fields(obj: Obj) -> Obj:
    """A :data:`TransformFunc` that drops ``metadata.managedFields`` (in place; the rest of the
    object is neither copied nor changed) and returns ``obj``.

    The API server attaches server-side-apply bookkeeping to every object (an entry per client
    that wrote it), more than half of a cached PersistentVolume's or claim's memory, and no
    controller of pyprovlib reads it: like kube-controller-manager and kube-scheduler
    (kubernetes/kubernetes PR 118455), the factories pyprovlib's controllers create cache
    objects without it. Writing back an object read from such a cache is safe: an update whose
    body has no ``managedFields`` leaves the server's as they were.
    """
    m = obj.get("metadata")
    if type(m) is dict and "managedFields" in m:
        del m["managedFields"]
    return obj


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


@dataclass(eq=False)
class EventHandlerRegistration:
    """The handle :meth:`SharedInformer.add_event_handler` returns; pass it to
    :meth:`SharedInformer.remove_event_handler`."""

    on_add: OnAdd | None
    on_update: OnUpdate | None
    on_delete: OnDelete | None
    resync_period: float
    next_resync: float
    _synced: bool = field(default=False, repr=False)

    def has_synced(self) -> bool:
        """True once this handler was given every object of the informer's first LIST."""
        return self._synced


class SharedInformer:
    """A cache of one collection plus the handlers interested in its changes.

    Handlers are plain, quick, synchronous callables (they enqueue keys). They are called in the
    order the API reported the changes; one handler raising is logged with the object's key and
    affects neither the informer nor the other handlers. Objects handed to handlers are the
    cache's own: never mutate them.

    ``transform`` (client-go's ``SetTransform``; none by default) reshapes every object before
    it is cached, see :data:`TransformFunc`.
    """

    def __init__(
        self,
        lister_watcher: ListerWatcher,
        *,
        name: str = "",
        resync_period: float = 0.0,
        clock: Clock | None = None,
        key_func: KeyFunc = meta_namespace_key,
        indexers: Mapping[str, IndexFunc] | None = None,
        backoff: BackoffTimer | None = None,
        page_size: int = DEFAULT_PAGE_SIZE,
        min_watch_timeout: float = MIN_WATCH_TIMEOUT,
        transform: TransformFunc | None = None,
    ) -> None:
        self.name = name
        self.default_resync_period = resync_period
        self._transform = transform
        self._clock = clock or RealClock()
        self._key_func = key_func
        self.store = Indexer(key_func, indexers)
        self.reflector = Reflector(
            lister_watcher,
            self,
            name=name,
            clock=self._clock,
            backoff=backoff or BackoffTimer(clock=self._clock),
            page_size=page_size,
            min_watch_timeout=min_watch_timeout,
        )
        self._listeners: tuple[EventHandlerRegistration, ...] = ()
        self._listeners_changed = asyncio.Event()
        self._synced = asyncio.Event()
        self._started = False
        self._log = log.bind(resource=name)

    # -- handlers ----------------------------------------------------------------------------

    def add_event_handler(
        self,
        on_add: OnAdd | None = None,
        on_update: OnUpdate | None = None,
        on_delete: OnDelete | None = None,
        *,
        resync_period: float | None = None,
    ) -> EventHandlerRegistration:
        """Subscribe to changes. ``resync_period`` (default: the informer's) > 0 re-delivers
        every cached object as ``on_update(obj, obj)`` that often (at least every second).

        A handler added once the informer runs is first given ``on_add`` for every object
        already cached (before this method returns), then the changes after that.
        """
        period = self.default_resync_period if resync_period is None else resync_period
        if 0 < period < MINIMUM_RESYNC_PERIOD:
            self._log.warning(
                "resync period raised to the minimum", requested=period, used=MINIMUM_RESYNC_PERIOD
            )
            period = MINIMUM_RESYNC_PERIOD
        handle = EventHandlerRegistration(
            on_add,
            on_update,
            on_delete,
            max(0.0, period),
            self._clock.monotonic() + max(0.0, period),
        )
        self._listeners = (*self._listeners, handle)
        self._listeners_changed.set()
        if self._synced.is_set():
            if on_add is not None:
                for key, obj in self.store.items():
                    self._call(on_add, "add", key, obj)
            handle._synced = True
        return handle

    def remove_event_handler(self, handle: EventHandlerRegistration) -> None:
        """Unsubscribe; unknown handles are ignored."""
        self._listeners = tuple(h for h in self._listeners if h is not handle)
        self._listeners_changed.set()

    def add_indexers(self, indexers: Mapping[str, IndexFunc]) -> None:
        """Add indexes to the store (existing objects are indexed at once)."""
        self.store.add_indexers(indexers)

    @property
    def transform(self) -> TransformFunc | None:
        """The transform applied to every object before it is cached (None: objects are cached
        as received)."""
        return self._transform

    def set_transform(self, transform: TransformFunc | None) -> None:
        """Replace the transform (client-go's ``SetTransform``); only before :meth:`run`, so
        every cached object went through the same one."""
        if self._started:
            raise RuntimeError(
                f"informer {self.name!r} has already started; set its transform before running it"
            )
        self._transform = transform

    # -- state -------------------------------------------------------------------------------

    @property
    def started(self) -> bool:
        """Whether :meth:`run` was called."""
        return self._started

    def has_synced(self) -> bool:
        """True once the first LIST has been stored and delivered to the handlers."""
        return self._synced.is_set()

    async def wait_for_sync(self, timeout: float | None = None) -> bool:  # noqa: ASYNC109
        """Wait until :meth:`has_synced` (at most ``timeout`` seconds of event-loop time)."""
        if self._synced.is_set():
            return True
        try:
            async with asyncio.timeout(timeout):
                await self._synced.wait()
        except TimeoutError:
            return False
        return True

    @property
    def last_sync_resource_version(self) -> str:
        """The resourceVersion the cache is current to."""
        return self.reflector.last_sync_resource_version

    async def run(self) -> None:
        """List, watch and resync until cancelled."""
        if self._started:
            raise RuntimeError(f"informer {self.name!r} is already running")
        self._started = True
        self._log.debug("informer starting")
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.reflector.run(), name=f"reflector {self.name}")
            tg.create_task(self._resync_loop(), name=f"resync {self.name}")

    # -- ReflectorSink -----------------------------------------------------------------------

    def replace(self, items: list[Obj], resource_version: str) -> None:
        """Apply a complete LIST (client-go's DeltaFIFO Replace as seen by the handlers):
        new objects → on_add, changed ones → on_update, vanished ones → on_delete with a
        :class:`DeletedFinalStateUnknown`. Unchanged objects (same resourceVersion) count as a
        resync and are not re-delivered. With a transform, every item is transformed before the
        cache changes at all, so a transform that raises leaves the cache as it was."""
        transform = self._transform
        if transform is not None:
            items = [self._transformed(transform, obj) for obj in items]
        store = self.store
        key_func = self._key_func
        listeners = self._listeners
        first = not self._synced.is_set()
        seen: set[str] = set()
        for obj in items:
            key = key_func(obj)
            seen.add(key)
            old = store.get_by_key(key)
            store.update(obj)
            if old is None:
                for h in listeners:
                    if h.on_add is not None:
                        self._call(h.on_add, "add", key, obj)
            elif _rv(old) != _rv(obj):
                for h in listeners:
                    if h.on_update is not None:
                        self._call(h.on_update, "update", key, old, obj)
        if len(seen) != len(store):
            for key in [k for k in store.list_keys() if k not in seen]:
                old = store.delete_key(key)
                if old is None:
                    continue
                tombstone = DeletedFinalStateUnknown(key, old)
                for h in listeners:
                    if h.on_delete is not None:
                        self._call(h.on_delete, "delete", key, tombstone)
        if first:
            for h in listeners:
                h._synced = True
            self._synced.set()
            self._log.info("informer synced", items=len(store), resource_version=resource_version)

    def apply(self, event_type: str, obj: Obj) -> None:
        """Apply one watch event (after the transform, if any) and tell the handlers."""
        transform = self._transform
        if transform is not None:
            obj = self._transformed(transform, obj)
        key = self._key_func(obj)
        store = self.store
        old = store.get_by_key(key)
        if event_type == "DELETED":
            if old is None:
                return  # already reported by a relist's tombstone
            store.delete_key(key)
            for h in self._listeners:
                if h.on_delete is not None:
                    self._call(h.on_delete, "delete", key, obj)
            return
        store.update(obj)
        if old is None:
            for h in self._listeners:
                if h.on_add is not None:
                    self._call(h.on_add, "add", key, obj)
        else:
            for h in self._listeners:
                if h.on_update is not None:
                    self._call(h.on_update, "update", key, old, obj)

    def _transformed(self, transform: TransformFunc, obj: Obj) -> Obj:
        try:
            out = transform(obj)
        except Exception as err:
            raise TransformError(
                f"the transform of informer {self.name or 'objects'} failed on "
                f"{_describe(obj)}: {type(err).__name__}: {err}"
            ) from err
        if type(out) is not dict:
            raise TransformError(
                f"the transform of informer {self.name or 'objects'} returned "
                f"{type(out).__name__} for {_describe(obj)}; it must return the object as a dict"
            )
        return out

    def _call(self, fn: Callable[..., None], kind: str, key: str, *args: Any) -> None:
        try:
            fn(*args)
        except Exception:
            self._log.exception("event handler failed", key=key, notification=kind)

    # -- resync ------------------------------------------------------------------------------

    def _resync_check_period(self) -> float | None:
        periods = [h.resync_period for h in self._listeners if h.resync_period > 0]
        return min(periods) if periods else None

    async def _resync_loop(self) -> None:
        while True:
            period = self._resync_check_period()
            if period is None:
                self._listeners_changed.clear()
                await self._listeners_changed.wait()
                continue
            await self._clock.sleep(period)
            self.resync()

    def resync(self) -> None:
        """Re-deliver every cached object as ``on_update(obj, obj)`` to the handlers whose
        resync period has come (called by the informer's resync loop)."""
        if not self._synced.is_set():
            return
        now = self._clock.monotonic()
        due = [h for h in self._listeners if h.resync_period > 0 and now >= h.next_resync]
        if not due:
            return
        for h in due:
            h.next_resync = now + h.resync_period
        for key, obj in self.store.items():
            for h in due:
                if h.on_update is not None:
                    self._call(h.on_update, "resync", key, obj, obj)


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


def _describe(obj: Obj) -> str:
    """``kind namespace/name`` of an object for an error message, whatever its shape."""
    raw = obj.get("metadata")
    m: dict[str, Any] = raw if isinstance(raw, dict) else {}
    name = f"{m.get('namespace')}/{m.get('name')}" if m.get("namespace") else str(m.get("name"))
    return f"{obj.get('kind') or 'object'} {name}"


def _rv(obj: Obj) -> object:
    meta = obj.get("metadata")
    return meta.get("resourceVersion") if isinstance(meta, dict) else None


_InformerKey = tuple[Resource, str | None, str | None, str | None]


class SharedInformerFactory:
    """Hands out one :class:`SharedInformer` per (resource, namespace, selectors) and runs them.

    ``resync_period`` is the default for informers (and so for their handlers). ``transform``
    (client-go's ``informers.WithTransform``; none by default) is given to every informer the
    factory creates: pass :func:`strip_managed_fields` to cache objects without their
    ``managedFields``, as pyprovlib's controllers do with the factories they create.
    ``start(tg)`` starts, in ``tg``, every informer not started yet; cancelling ``tg`` stops
    them.
    """

    def __init__(
        self,
        api_client: ApiClient,
        *,
        resync_period: float = 0.0,
        clock: Clock | None = None,
        page_size: int = DEFAULT_PAGE_SIZE,
        backoff_initial: float = 0.8,
        backoff_cap: float = 30.0,
        transform: TransformFunc | None = None,
    ) -> None:
        self.api_client = api_client
        self.resync_period = resync_period
        self.transform = transform
        self._clock = clock or RealClock()
        self.page_size = page_size
        self.backoff_initial = backoff_initial
        self.backoff_cap = backoff_cap
        self._informers: dict[_InformerKey, SharedInformer] = {}
        self._started: set[_InformerKey] = set()

    def informer_for(
        self,
        resource: Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        resync_period: float | None = None,
    ) -> SharedInformer:
        """The informer for ``resource`` (in ``namespace`` or all, filtered by the selectors),
        created on first request. ``resync_period`` only applies when it is created."""
        key: _InformerKey = (
            resource,
            namespace or None,
            label_selector or None,
            field_selector or None,
        )
        informer = self._informers.get(key)
        if informer is None:
            client = ResourceClient(self.api_client, resource)
            lw = ResourceListerWatcher(
                client,
                namespace=key[1],
                label_selector=key[2],
                field_selector=key[3],
            )
            name = resource.plural if key[1] is None else f"{resource.plural}/{key[1]}"
            informer = SharedInformer(
                lw,
                name=name,
                resync_period=self.resync_period if resync_period is None else resync_period,
                clock=self._clock,
                backoff=BackoffTimer(
                    replace(REFLECTOR_BACKOFF, duration=self.backoff_initial, cap=self.backoff_cap),
                    clock=self._clock,
                ),
                page_size=self.page_size,
                transform=self.transform,
            )
            self._informers[key] = informer
        return informer

    @property
    def informers(self) -> list[SharedInformer]:
        """Every informer handed out so far."""
        return list(self._informers.values())

    def caught_up(self, obj: Mapping[str, Any]) -> bool:
        """Whether every unfiltered informer of ``obj``'s kind (and namespace) holds this version
        of ``obj`` or a later one: its handlers have seen the write that returned ``obj``.

        resourceVersions are compared as numbers where both are (etcd's revisions are), else
        for equality. True when no informer of the kind was handed out."""
        metadata = obj.get("metadata") or {}
        api_version, kind = obj.get("apiVersion"), obj.get("kind")
        wanted = str(metadata.get("resourceVersion") or "")
        namespace = metadata.get("namespace") or None
        key = meta_namespace_key(obj)
        for (resource, ns, labels, fields), informer in self._informers.items():
            if resource.kind != kind or resource.api_version != api_version:
                continue
            if labels or fields or (ns is not None and ns != namespace):
                continue
            cached = informer.store.get_by_key(key)
            have = str(((cached or {}).get("metadata") or {}).get("resourceVersion") or "")
            if cached is None or not _at_least(have, wanted):
                return False
        return True

    def start(self, task_group: asyncio.TaskGroup) -> None:
        """Start every informer not started yet as a task of ``task_group``."""
        for key, informer in self._informers.items():
            if key in self._started:
                continue
            self._started.add(key)
            if informer.started:
                continue  # someone ran it directly; it is not ours to start again
            task_group.create_task(informer.run(), name=f"informer {informer.name}")

    async def wait_for_cache_sync(self, timeout: float | None = None) -> bool:  # noqa: ASYNC109
        """Wait until every started informer has synced; False if ``timeout`` passed first."""
        started = [self._informers[k] for k in self._started]
        try:
            async with asyncio.timeout(timeout):
                for informer in started:
                    await informer.wait_for_sync()
        except TimeoutError:
            return False
        return True


def _at_least(have: str, wanted: str) -> bool:
    if have.isdigit() and wanted.isdigit():
        return int(have) >= int(wanted)
    return have == wanted

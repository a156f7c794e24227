"""Informers: a cache of one resource kept current by LIST+WATCH, with event handlers.

client-go's ``SharedIndexInformer`` and ``SharedInformerFactory`` for asyncio, over the
:class:`~pyprovlib.kube._reflector.Reflector` (re-exported here with its ``ListerWatcher``,
``ReflectorSink`` and ``TransformError``). The reflector lists (paginated) and watches,
resuming from the last seen resourceVersion and relisting on 410; the
:class:`SharedInformer` applies what it reports to its :class:`~pyprovlib.kube.Indexer`
and calls the handlers; the factory makes sure a process runs one LIST+WATCH per (resource,
namespace, selectors). A transform (client-go's ``TransformFunc``) may reshape every object
before it is cached: :func:`strip_managed_fields` is the one pyprovlib's controllers use.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from kubernetes_asyncio.client import ApiClient

from pyprovlib._logging import get_logger
from pyprovlib.kube._backoff import REFLECTOR_BACKOFF, BackoffTimer
from pyprovlib.kube._clock import Clock, RealClock
from pyprovlib.kube._objects import Obj, meta_namespace_key
from pyprovlib.kube._reflector import (
    DEFAULT_PAGE_SIZE,
    MIN_WATCH_TIMEOUT,
    ListerWatcher,
    Reflector,
    ReflectorSink,
    ResourceListerWatcher,
    TransformError,
)
from pyprovlib.kube._resources import Resource
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.kube._store import DeletedFinalStateUnknown, Indexer, IndexFunc, KeyFunc

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

MINIMUM_RESYNC_PERIOD = 1.0
"""A handler's resync period is never shorter than this (client-go's minimumResyncPeriod)."""


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

"""The PV binder's controller: informers, its own caches, the work queue, workers and resync.

The informers are :mod:`pyprovlib.kube._informer`'s (from a
:class:`~pyprovlib.kube.SharedInformerFactory` over HTTP, or over the in-memory
server's in-process transport); their handlers only update the binder's caches and enqueue
keys. Workers take ``("claim", "ns/name")`` or ``("volume", name)`` keys from a
:class:`~pyprovlib.kube.RateLimitingQueue` (never one key twice at a time; failures
retry with per-key exponential backoff) and hand them to :class:`ClaimSync` /
:class:`VolumeSync`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException

from pyprovlib._logging import get_logger
from pyprovlib.kube._backoff import REFLECTOR_BACKOFF, BackoffTimer
from pyprovlib.kube._clock import Clock, RealClock
from pyprovlib.kube._config import use_resolved_proxy
from pyprovlib.kube._errors import is_conflict
from pyprovlib.kube._informer import SharedInformer, SharedInformerFactory
from pyprovlib.kube._objects import Obj, meta_namespace_key, resource_version
from pyprovlib.kube._resources import (
    PERSISTENT_VOLUME_CLAIMS,
    PERSISTENT_VOLUMES,
    STORAGE_CLASSES,
    Resource,
)
from pyprovlib.kube._store import DeletedFinalStateUnknown
from pyprovlib.kube._workqueue import (
    ItemExponentialFailureRateLimiter,
    RateLimitingQueue,
    run_worker,
)
from pyprovlib.testing._binder._claims import BY_CLAIM_REF, ClaimSync, volume_indexers
from pyprovlib.testing._binder._objects import (
    claim_key,
    claim_ref_key,
    describe,
    volume_name_of_claim,
)
from pyprovlib.testing._binder._protection import Protection
from pyprovlib.testing._binder._transport import (
    BinderTransport,
    HttpTransport,
    TransportListerWatcher,
)
from pyprovlib.testing._binder._volumes import VolumeSync
from pyprovlib.testing._binder._writes import BinderApi, ObjectCache
from pyprovlib.testing._lifecycle import StartStop

__all__ = ["PVBinder"]

log = get_logger(__name__)

Key = tuple[str, str]  # ("claim", "ns/name") or ("volume", name)

# The binder recovers quickly from a restarted or compacted test server: its reflectors back off
# from 50 ms up to 2 s (client-go's 800 ms to 30 s would slow every recovery test down).
_BACKOFF_INITIAL, _BACKOFF_CAP = 0.05, 2.0
# A failed sync is retried after 10 ms, doubling up to 5 s.
_RETRY_BASE, _RETRY_MAX = 0.01, 5.0


class PVBinder(StartStop):
    """The persistentvolume controller of kube-controller-manager, for tests.

    ``PVBinder(api_client)`` (or ``PVBinder(transport=...)``, see
    :class:`~pyprovlib.testing._binder.BinderTransport`); ``await start()`` launches its
    informers, workers and resync (owned tasks), ``await stop()`` cancels and awaits them.
    ``resync_period`` re-examines every claim and volume (upstream's
    ``--pvclaimbinder-sync-period``, shortened for tests), and ``event_interval`` bounds how
    often a still-true event (``ExternalProvisioning``, ``WaitForFirstConsumer``) is repeated
    for one claim; repeats increment the event's count like client-go's event correlator.

    ``workers`` claims and volumes are synced concurrently, never one key twice at a time (a
    key changed while being synced is synced again afterwards, like a client-go workqueue).
    kube-controller-manager runs one claim and one volume worker, each sync taking about a
    millisecond; here every sync waits for HTTP round trips to the API server, usually in the
    same process, so a single worker would annotate 1,000 new claims one after the other.
    Binding a claim to an unclaimed volume (static binding) stays serialised, so two claims
    never race for the same volume.
    """

    def __init__(
        self,
        api_client: ApiClient | None = None,
        *,
        resync_period: float = 2.0,
        event_interval: float = 15.0,
        clock: Clock | None = None,
        workers: int = 8,
        transport: BinderTransport | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        if (api_client is None) == (transport is None):
            raise ValueError(
                "PVBinder needs exactly one way to the API server: an api_client (HTTP) or a "
                "transport (e.g. the in-memory server's InProcessTransport), not both or neither"
            )
        self.clock: Clock = clock or RealClock()
        self.workers = workers
        self.resync_period = resync_period
        self.http: BinderTransport
        self._factory: SharedInformerFactory | None = None
        if api_client is not None:
            # Resolve the proxy once instead of aiohttp's two thread-pool hops per request
            # (about a third of the binder's CPU time under load).
            use_resolved_proxy(api_client)
            self.http = HttpTransport(api_client)
            self._factory = SharedInformerFactory(
                api_client,
                clock=self.clock,
                backoff_initial=_BACKOFF_INITIAL,
                backoff_cap=_BACKOFF_CAP,
            )
        else:
            assert transport is not None
            self.http = transport
        self._queue: RateLimitingQueue[Key] = RateLimitingQueue(
            rate_limiter=ItemExponentialFailureRateLimiter(_RETRY_BASE, _RETRY_MAX),
            clock=self.clock,
        )
        self.claims = ObjectCache(
            PERSISTENT_VOLUME_CLAIMS, lambda claim: self._queue.add(("claim", claim_key(claim)))
        )
        """The binder's own cache of claims (what its decisions read)."""
        self.volumes = ObjectCache(
            PERSISTENT_VOLUMES,
            lambda volume: self._queue.add(("volume", meta_namespace_key(volume))),
            volume_indexers(),
        )
        """The binder's own cache of volumes, indexed by claimRef and by unclaimed class."""
        self.api = BinderApi(
            self.http, self.clock, self.claims, self.volumes, event_interval=event_interval
        )
        self._claim_informer = self._informer(PERSISTENT_VOLUME_CLAIMS)
        self._volume_informer = self._informer(PERSISTENT_VOLUMES)
        self.classes = self._informer(STORAGE_CLASSES)
        """The StorageClass informer (its store is read directly)."""
        self._claim_informer.add_event_handler(
            self.claims.update, lambda _old, new: self.claims.update(new), self._claim_gone
        )
        self._volume_informer.add_event_handler(
            self.volumes.update, lambda _old, new: self.volumes.update(new), self._volume_gone
        )
        self._claim_sync = ClaimSync(self.api, self.classes)
        self._protection = Protection(self.api)
        self._volume_sync = VolumeSync(self.api, lambda key: self._queue.add(("claim", key)))
        self._tasks: list[asyncio.Task[None]] = []
        self._started = False
        self._resyncs = 0

    def _informer(self, resource: Resource) -> SharedInformer:
        if self._factory is not None:
            return self._factory.informer_for(resource)
        return SharedInformer(
            TransportListerWatcher(self.http, resource),
            name=resource.plural,
            clock=self.clock,
            backoff=BackoffTimer(
                replace(REFLECTOR_BACKOFF, duration=_BACKOFF_INITIAL, cap=_BACKOFF_CAP),
                clock=self.clock,
            ),
        )

    @property
    def _informers(self) -> tuple[SharedInformer, ...]:
        return (self._claim_informer, self._volume_informer, self.classes)

    @property
    def event_interval(self) -> float:
        """Seconds within which a repeated event is not recorded again."""
        return self.api.event_interval

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Start watching and binding; returns at once (see :meth:`wait_for_sync`)."""
        if self._started:
            raise RuntimeError("PVBinder already started")
        self._started = True
        self._tasks.append(asyncio.create_task(self._run(), name="pvbinder"))

    async def _run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            if self._factory is not None:
                self._factory.start(tg)
            else:
                for informer in self._informers:
                    tg.create_task(informer.run(), name=f"pvbinder-informer-{informer.name}")
            for i in range(self.workers):
                tg.create_task(self._worker(), name=f"pvbinder-worker-{i}")
            tg.create_task(self._resync_loop(), name="pvbinder-resync")

    async def stop(self) -> None:
        """Cancel the binder's tasks and wait for them to finish."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for task, result in zip(tasks, results, strict=True):
            if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
                log.error("binder task failed", task=task.get_name(), error=repr(result))
        await self._queue.aclose()

    @property
    def synced(self) -> bool:
        """True once claims, volumes and classes have all been listed."""
        return all(i.has_synced() for i in self._informers)

    async def wait_for_sync(self) -> None:
        """Wait until the first LIST of claims, volumes and classes has completed."""
        for informer in self._informers:
            await informer.wait_for_sync()

    @property
    def resyncs(self) -> int:
        """How many periodic resyncs have queued every claim and volume again: with a
        :class:`~pyprovlib.kube.FakeClock`, wait for it to grow and then for
        :meth:`idle` to know the resyncs a test advanced through were all synced."""
        return self._resyncs

    def idle(self, *, count_delayed: bool = False) -> bool:
        """Nothing queued or being synced (nor, with ``count_delayed``, waiting to retry)."""
        return self._queue.idle() and not (count_delayed and self._queue.waiting())

    def caught_up(self, obj: Mapping[str, Any]) -> bool:
        """Whether the binder's informer of ``obj``'s kind holds this version of it or a later
        one (True for kinds the binder does not watch)."""
        for informer, resource in zip(
            self._informers,
            (PERSISTENT_VOLUME_CLAIMS, PERSISTENT_VOLUMES, STORAGE_CLASSES),
            strict=True,
        ):
            if obj.get("kind") != resource.kind or obj.get("apiVersion") != resource.api_version:
                continue
            cached = informer.store.get_by_key(meta_namespace_key(obj))
            have, wanted = resource_version(cached or {}), resource_version(obj)
            if cached is None:
                return False
            if have.isdigit() and wanted.isdigit():
                return int(have) >= int(wanted)
            return have == wanted
        return True

    # -- informer handlers: the binder's caches queue what they take; deletions queue here ---

    def _claim_gone(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        claim = obj.obj if isinstance(obj, DeletedFinalStateUnknown) else obj
        last = self.claims.remove(claim) or claim
        key = claim_key(last)
        # Volumes pointing at the claim must notice it is gone (Released).
        for name in self.volumes.store.index_keys(BY_CLAIM_REF, key):
            self._queue.add(("volume", name))
        volume = volume_name_of_claim(last)
        if volume:
            self._queue.add(("volume", volume))

    def _volume_gone(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        volume = obj.obj if isinstance(obj, DeletedFinalStateUnknown) else obj
        last = self.volumes.remove(volume) or volume
        # deleteVolume: sync the claim now so it turns Lost without waiting for a resync.
        ref_key = claim_ref_key(last)
        if ref_key is not None:
            self._queue.add(("claim", ref_key))

    # -- workers -----------------------------------------------------------------------------

    async def _resync_loop(self) -> None:
        await self.wait_for_sync()
        while True:
            await self.clock.sleep(self.resync_period)
            for key in self.claims.store.list_keys():
                self._queue.add(("claim", key))
            for key in self.volumes.store.list_keys():
                self._queue.add(("volume", key))
            self._resyncs += 1

    async def _worker(self) -> None:
        # Like upstream, nothing is decided before the caches are complete: a claim missing
        # from a half-filled cache must not release its volume.
        await self.wait_for_sync()
        await run_worker(self._queue, self._sync)

    async def _sync(self, key: Key) -> None:
        try:
            if key[0] == "claim":
                claim = self.claims.get(key[1])
                if claim is None or not await self._protection.sync_claim(claim):
                    await self._claim_sync.sync(key[1])
            else:
                volume = self.volumes.get(key[1])
                if volume is None or not await self._protection.sync_volume(volume):
                    await self._volume_sync.sync(key[1])
            self._queue.forget(key)
        except asyncio.CancelledError:
            raise
        except Exception as err:
            delay = self._queue.rate_limiter.when(key)
            level = log.debug if isinstance(err, ApiException) and is_conflict(err) else log.info
            level(
                "binder sync failed; will retry",
                kind=key[0],
                key=key[1],
                error=describe(err),
                retry_in=delay,
            )
            self._queue.add_after(key, delay)

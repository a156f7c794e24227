"""The cloning-protection controller (external-provisioner's ``clone_controller.go``): takes the
``provisioner.storage.kubernetes.io/cloning-protection`` finalizer off a source claim once no
clone of it is in flight, with a work queue and workers of its own
(``--cloning-protection-threads``).

The finalizer is put on by :class:`~pyprovlib.csi.provisioner.CSIProvisioner` before the first
CreateVolume of a clone (upstream's ``setCloneFinalizer``); so a source claim whose deletion is
requested while a clone of it is being made stays, Terminating, until the clone is done (Bound)
or abandoned (deleted), and then goes. What counts as a clone in flight is
:func:`~pyprovlib.csi.provisioner._data_source.clone_holds_source`, plus the CreateVolume calls
of this process (:class:`~pyprovlib.csi.provisioner._data_source.SourceGuard`).

Invariants:

- Event handlers only enqueue source-claim keys (``namespace/name``); a worker decides on the
  objects the cache holds when it takes the key, and confirms with the API server (a LIST of
  the namespace) before it removes anything.
- The finalizer is removed under the lock the provisioner holds while adding it, after checking
  that no CreateVolume of this process uses the source: a clone starting meanwhile keeps it.
- Everything is driven by what the claims show, not by what this process remembers, so a
  restart (or a new leader) finishes what the last one left: the first LIST enqueues every
  claim carrying the finalizer.

Differences from upstream, each on purpose:

- The finalizer is removed from any source claim once no clone of it is in flight, not only
  from one being deleted, so it never lingers on a claim for nobody.
- A clone's changes (Bound, deleted) enqueue its source, so a finished or abandoned clone
  releases the source at once; upstream waits for the source's own next change or its
  retry with backoff (up to ``--retry-interval-max``), retrying while clones are Pending.
- Claims naming a source are found through an index of the claim cache, not by listing the
  namespace from the cache for every source.
"""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Mapping
from typing import Any, Final

from prometheus_client import CollectorRegistry

from pyprovlib._logging import get_logger
from pyprovlib.controller._renamed import warn_renamed
from pyprovlib.csi.provisioner._data_source import (
    CLONE_FINALIZER,
    SourceGuard,
    clone_holds_source,
    clone_source_key,
    clones_in_flight,
)
from pyprovlib.kube._clock import Clock
from pyprovlib.kube._errors import ApiException
from pyprovlib.kube._informer import SharedInformer, SharedInformerFactory
from pyprovlib.kube._objects import Obj, meta_namespace_key
from pyprovlib.kube._resources import PERSISTENT_VOLUME_CLAIMS
from pyprovlib.kube._store import DeletedFinalStateUnknown
from pyprovlib.kube._workqueue import (
    ItemExponentialFailureRateLimiter,
    RateLimiter,
    RateLimitingQueue,
    run_worker,
)

__all__ = [
    "CLONE_SOURCE_INDEX",
    "QUEUE_NAME",
    "CloningProtectionController",
]

log = get_logger(__name__)

QUEUE_NAME: Final = "cloning-protection"
"""The work queue's name in the ``workqueue_*`` metrics (upstream's queue shares the name
``claims`` with the provisioning queue, which mixes both in one series)."""

CLONE_SOURCE_INDEX: Final = "pyprovlib.io/clone-source"
"""The claim cache's index of clones by the ``namespace/name`` of their source claim."""


def _clone_source_index(claim: Obj) -> list[str]:
    key = clone_source_key(claim)
    return [] if key is None else [key]


def _finalizers(obj: Mapping[str, Any]) -> list[str]:
    return list((obj.get("metadata") or {}).get("finalizers") or [])


class CloningProtectionController:
    """Removes the cloning-protection finalizer from source claims no clone needs any more
    (upstream's ``CloningProtectionController``).

    ``informer_factory`` is the one the ProvisionController and the provisioner share (its
    claim informer is watched here; the caller starts the factory), ``guard`` the provisioner's
    clone guard (its CreateVolume calls in flight). ``workers`` workers
    (``--cloning-protection-threads``, upstream's default 1; ``threads=``, the former name,
    still works with a DeprecationWarning) take source claims from the
    queue; a failed removal is retried after ``rate_limiter``'s delay (upstream: the
    provisioner's ``--retry-interval-start`` to ``--retry-interval-max``).

    :meth:`run` runs it until cancelled or :meth:`stop`; the sidecars run it beside the
    ProvisionController's workers, under its Lease (see
    :meth:`~pyprovlib.ProvisionController.run_beside`).
    """

    def __init__(
        self,
        guard: SourceGuard,
        informer_factory: SharedInformerFactory,
        *,
        workers: int = 1,
        rate_limiter: RateLimiter | None = None,
        clock: Clock | None = None,
        registry: CollectorRegistry | None = None,
        threads: int | None = None,
    ) -> None:
        if threads is not None:
            warn_renamed(type(self).__name__, "threads", "workers")
            workers = threads
        if workers < 1:
            raise ValueError(
                f"workers must be at least 1, not {workers}: without a worker the "
                "cloning-protection finalizer is never removed and source claims cannot be deleted"
            )
        self.guard = guard
        self.workers = workers
        # Upstream's defaults of --retry-interval-start and --retry-interval-max.
        self.rate_limiter: RateLimiter = (
            rate_limiter
            if rate_limiter is not None
            else ItemExponentialFailureRateLimiter(1.0, 300.0)
        )
        self._clock = clock
        self._registry = registry
        self._factory = informer_factory
        self.informer: SharedInformer = informer_factory.informer_for(PERSISTENT_VOLUME_CLAIMS)
        if CLONE_SOURCE_INDEX not in self.informer.store.indexers:
            self.informer.add_indexers({CLONE_SOURCE_INDEX: _clone_source_index})
        self.queue: RateLimitingQueue[str] | None = None
        self._stop = asyncio.Event()
        self._log = log

    # -- running -----------------------------------------------------------------------------

    @property
    def threads(self) -> int:
        """Deprecated name of :attr:`workers`."""
        warnings.warn(
            f"{type(self).__name__}.threads is deprecated: read workers",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.workers

    def stop(self) -> None:
        """End :meth:`run`: workers finish the source in hand and take no other."""
        self._stop.set()

    def idle(self, *, count_delayed: bool = False) -> bool:
        """Running, and no source claim queued or being processed; retries waiting out their
        delay count only with ``count_delayed`` (see :func:`pyprovlib.testing.wait_idle`)."""
        queue = self.queue
        if queue is None or queue.shutting_down or not self.informer.has_synced():
            return False
        return queue.idle() and not (count_delayed and queue.waiting())

    def caught_up(self, obj: Mapping[str, Any]) -> bool:
        """Whether the claim cache holds this version of ``obj`` (as a write returned it) or a
        later one, so the handlers have queued whatever it causes."""
        return self._factory.caught_up(obj)

    async def run(self) -> None:
        """Wait for the claim cache, then watch claims and remove finalizers until cancelled
        or :meth:`stop` (upstream's ``Run``)."""
        queue: RateLimitingQueue[str] = RateLimitingQueue(
            QUEUE_NAME, self.rate_limiter, clock=self._clock, registry=self._registry
        )
        self.queue = queue
        await self.informer.wait_for_sync()
        # Registered now, so every cached claim is handed over as added: the sources a
        # stopped process (or the last leader) left with the finalizer are looked at first.
        handle = self.informer.add_event_handler(
            on_add=self._claim_changed,
            on_update=lambda _old, new: self._claim_changed(new),
            on_delete=self._claim_deleted,
        )
        self.guard.on_released = self._source_released
        self._log.info("started cloning-protection controller", workers=self.workers)
        try:
            async with queue, asyncio.TaskGroup() as tg:
                workers = [tg.create_task(self._worker(queue)) for _ in range(self.workers)]
                await self._stop.wait()
                queue.shut_down()
                await asyncio.gather(*workers)
        finally:
            self.informer.remove_event_handler(handle)
            if self.guard.on_released == self._source_released:
                self.guard.on_released = None
            queue.shut_down()
            self._log.info("cloning-protection controller stopped")

    async def _worker(self, queue: RateLimitingQueue[str]) -> None:
        async def process(key: str) -> None:
            try:
                await self.sync(key)
            except Exception as err:
                # Left in place, the finalizer only delays the source's deletion; retried.
                self._log.warning(
                    "cannot remove the cloning-protection finalizer; retrying with backoff",
                    claim=key,
                    retries=queue.num_requeues(key),
                    error=_describe(err),
                )
                queue.add_rate_limited(key)
            else:
                queue.forget(key)

        await run_worker(queue, process, stop=self._stop)

    # -- event handlers: they only enqueue ---------------------------------------------------

    def enqueue(self, key: str) -> None:
        """Look at the source claim ``key`` (``namespace/name``) again."""
        if self.queue is not None:
            self.queue.add(key)

    def _source_released(self, source: tuple[str, str]) -> None:
        self.enqueue(f"{source[0]}/{source[1]}")

    def _claim_changed(self, claim: Obj) -> None:
        if CLONE_FINALIZER in _finalizers(claim):
            self.enqueue(meta_namespace_key(claim))
        self._enqueue_source_of(claim)

    def _claim_deleted(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        last = obj.obj if isinstance(obj, DeletedFinalStateUnknown) else obj
        if isinstance(last, Mapping):
            self._enqueue_source_of(last)

    def _enqueue_source_of(self, claim: Mapping[str, Any]) -> None:
        key = clone_source_key(claim)
        if key is None:
            return
        source = self.informer.store.get_by_key(key)
        if source is not None and CLONE_FINALIZER in _finalizers(source):
            self.enqueue(key)

    # -- one source claim (public for tests and tools) ---------------------------------------

    def clones_in_cache(self, source: Obj) -> list[str]:
        """Names of the clones of ``source`` in flight, as the cache shows them."""
        key = meta_namespace_key(source)
        return [
            (clone.get("metadata") or {}).get("name", "")
            for clone in self.informer.store.by_index(CLONE_SOURCE_INDEX, key)
            if clone_holds_source(clone, source)
        ]

    async def sync(self, key: str) -> bool:
        """Remove the finalizer from the source claim ``key`` if no clone of it is in flight
        (upstream's ``syncClaim``); returns whether it was removed. Raises when the API server
        refuses (the caller retries)."""
        source = self.informer.store.get_by_key(key)
        if source is None or CLONE_FINALIZER not in _finalizers(source):
            return False
        namespace, name = key.split("/", 1)
        if (namespace, name) in self.guard.holders:
            self._log.debug("clone source in use by a CreateVolume in flight", claim=key)
            return False
        clones = self.clones_in_cache(source)
        if not clones:
            # The cache may not show a clone created a moment ago: ask the API server.
            clones = await clones_in_flight(self.guard.rest, source)
        if clones:
            self._log.debug("clones of the claim in flight", claim=key, clones=sorted(clones))
            return False
        removed = await self.guard.remove_unheld((namespace, name))
        if removed:
            self._log.info(
                "removed the cloning-protection finalizer: no clone of the claim is in flight",
                claim=key,
                terminating=bool((source.get("metadata") or {}).get("deletionTimestamp")),
            )
        return removed


def _describe(err: BaseException) -> str:
    if isinstance(err, ApiException):
        return f"{err.status} {err.reason}"
    return f"{type(err).__name__}: {err}"

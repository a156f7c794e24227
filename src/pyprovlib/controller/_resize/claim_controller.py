"""What external-resizer's two controllers over claims — the resize controller and the modify
controller — share: the driver's name taken from its backend, the event recorder
(``external-resizer <driver>``), the claim queue (``<driver>-pvc``, as upstream names both)
fed by the claim informer's handlers, the volume informer, and the worker's retry of one
claim. Each subclass says which claim updates matter, what a deleted claim leaves to forget,
and how one claim is synced.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from kubernetes_asyncio.client import ApiClient

from pyprovlib.controller._lifecycle import ControllerLifecycle, process_with_retry
from pyprovlib.controller._resize.claims import claim_key
from pyprovlib.controller._resize.options import ResizerSidecarOptions
from pyprovlib.controller._resize.status import ClaimWriter
from pyprovlib.controller._sidecar_options import retry_queue
from pyprovlib.kube._clock import Clock
from pyprovlib.kube._informer import SharedInformer, SharedInformerFactory
from pyprovlib.kube._objects import Obj
from pyprovlib.kube._resources import PERSISTENT_VOLUME_CLAIMS, PERSISTENT_VOLUMES
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.kube._store import DeletedFinalStateUnknown
from pyprovlib.kube._workqueue import RateLimitingQueue

__all__ = ["ResizerClaimController"]

WriterT = TypeVar("WriterT", bound=ClaimWriter)


class ResizerClaimController(ControllerLifecycle):
    """The base of the resize and modify controllers: ``backend`` is the resizer or modifier
    (``what`` names it in errors and logs) whose ``name`` is the CSI driver's; the Lease is
    ``options.lease`` or ``lease_name`` of that name.

    A subclass implements :meth:`sync_claim` (one claim, by key), :meth:`_should_enqueue` (an
    update of a claim that needs a look) and :meth:`_forget` (a claim was deleted), and runs
    :meth:`_run_claim_workers` as its ``_run_controller``.
    """

    def __init__(
        self,
        client: ApiClient,
        backend: object,
        options: ResizerSidecarOptions,
        *,
        what: str,
        role: str,
        lease_name: Callable[[str], str],
        describe: Callable[[BaseException], str],
        log: Any,
        informer_factory: SharedInformerFactory | None,
        clock: Clock | None,
    ) -> None:
        name = getattr(backend, "name", "")
        if not isinstance(name, str) or not name:
            raise ValueError(f"the {what} must have a non-empty name")
        self.name = name
        super().__init__(
            client,
            options,
            role=role,
            lease_name=options.lease or lease_name(name),
            log=log.bind(**{what: name}),
            informer_factory=informer_factory,
            clock=clock,
        )
        self._workers = options.workers
        self._describe = describe
        # Event writes yield to the work while claims wait for a worker.
        self.recorder = self._event_recorder(f"external-resizer {name}")
        self.claim_queue = retry_queue(f"{name}-pvc", options, self._clock)
        self.pvc_informer: SharedInformer = self.informer_factory.informer_for(
            PERSISTENT_VOLUME_CLAIMS
        )
        self.pvc_informer.add_event_handler(
            on_add=self._pvc_added, on_update=self._pvc_updated, on_delete=self._pvc_deleted
        )
        self.pv_informer: SharedInformer = self.informer_factory.informer_for(PERSISTENT_VOLUMES)

    async def sync_claim(self, key: str) -> None:
        """Look at the claim ``key`` (``namespace/name``) and act on it (upstream's
        ``syncPVC``); raises when it must be retried."""
        raise NotImplementedError

    def _should_enqueue(self, old: Obj, new: Obj) -> bool:
        """Whether this update of a claim needs a look."""
        raise NotImplementedError

    def _forget(self, key: str) -> None:
        """The claim ``key`` was deleted: drop what is remembered about it."""

    def _claim_writer(self, writer: type[WriterT]) -> WriterT:
        """The subclass's writer (of claims, their volumes and events), on this controller's
        API client, event recorder, clock and log."""
        return writer(
            pvcs=ResourceClient(self.client, PERSISTENT_VOLUME_CLAIMS),
            pvs=ResourceClient(self.client, PERSISTENT_VOLUMES),
            recorder=self.recorder,
            clock=self._clock,
            log=self._log,
        )

    # -- lifecycle -----------------------------------------------------------------------------

    def _work_queues(self) -> tuple[RateLimitingQueue[str], ...]:
        return (self.claim_queue,)

    async def _run_claim_workers(
        self,
        caches: Iterable[SharedInformer],
        *,
        started: str,
        on_synced: Callable[[], None] | None = None,
    ) -> None:
        """Informers, then the claim workers, until stop (upstream's ``Run``); the claim and
        volume caches are waited for beside ``caches``."""
        await self._run_workers_until_stop(
            [self.pvc_informer, self.pv_informer, *caches],
            [(self.claim_queue, self.recorder.waking(self._process_claim))],
            workers=self._workers,
            started=started,
            on_synced=on_synced,
        )

    # -- informer handlers ---------------------------------------------------------------------

    def _pvc_added(self, pvc: Obj) -> None:
        self.claim_queue.add(claim_key(pvc))

    def _pvc_updated(self, old: Obj, new: Obj) -> None:
        if self._should_enqueue(old, new):
            self.claim_queue.add(claim_key(new))

    def _pvc_deleted(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        pvc = obj.obj if isinstance(obj, DeletedFinalStateUnknown) else obj
        key = claim_key(pvc)
        self.claim_queue.forget(key)
        self._forget(key)

    # -- the worker ----------------------------------------------------------------------------

    async def _process_claim(self, key: str) -> None:
        await process_with_retry(
            self.claim_queue,
            key,
            self.sync_claim,
            log=self._log,
            failure="error syncing claim; retrying with backoff",
            describe=self._describe,
            claim=key,
        )

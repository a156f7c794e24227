"""The VolumeAttachment controller: kubernetes-csi/external-attacher's ``CSIAttachController``
with its CSI handler and trivial handler, driving an :class:`~pyprovlib.Attacher`.

Data flow (as upstream): informers on VolumeAttachments, PersistentVolumes and CSINodes; the
handlers enqueue VolumeAttachment names (only those whose ``spec.attacher`` is ours) on a VA
queue and PV names on a PV queue; workers read the current object from the cache and

- attach: add the ``external-attacher/<driver>`` finalizer to the PV, then to the VA (with the
  node ID annotation), call :meth:`Attacher.attach`, and patch ``status.attached=true`` with the
  publish context; a failure goes into ``status.attachError`` and is retried with backoff;
- detach (VA with a deletion timestamp): call :meth:`Attacher.detach`, remove the VA
  finalizer, clear the status; a failure goes into ``status.detachError``;
- PV: remove the PV finalizer once the PV is being deleted and no VolumeAttachment uses it.

Without an attacher (``attacher=None``) the controller is upstream's trivial handler: it marks
VolumeAttachments attached and uses no finalizer, for drivers without ControllerPublishVolume.
When the attacher can list what it published, a reconciler compares that with the
VolumeAttachments every ``reconcile_sync`` seconds and reprocesses the ones that drifted.

This module is the wiring: informers, queues, handlers that only enqueue, workers, the
reconciler and leader election. Beside it: :mod:`~pyprovlib.controller._attach.sync` syncs one
VolumeAttachment or PersistentVolume; :mod:`~pyprovlib.controller._attach.resolve` reads a
VolumeAttachment into the volume, node and secrets of an attacher call;
:mod:`~pyprovlib.controller._attach.writes` makes every write (finalizers, status, errors) and
remembers them; :mod:`~pyprovlib.controller._attach.options` holds the options and upstream's
defaults; :mod:`~pyprovlib.controller._attach.errors` the errors.
"""

from __future__ import annotations

import asyncio

from kubernetes_asyncio.client import ApiClient

from pyprovlib._attacher import Attacher, AttachError
from pyprovlib._logging import get_logger
from pyprovlib.controller._attach.options import AttachControllerOptions, finalizer_name
from pyprovlib.controller._attach.options import lease_name as default_lease_name
from pyprovlib.controller._attach.resolve import (
    NODE_ID_ANNOTATION,
    VolumeResolver,
    api_error_text,
    is_attached,
    is_deleting,
    pv_index,
    pv_name_of,
    should_enqueue_va_change,
)
from pyprovlib.controller._attach.sync import PV_INDEX, AttachSync
from pyprovlib.controller._attach.writes import AttachWriter
from pyprovlib.controller._lifecycle import (
    ControllerLifecycle,
    LeaderElectionLostError,
    process_with_retry,
)
from pyprovlib.controller._sidecar_options import retry_queue
from pyprovlib.kube._clock import Clock
from pyprovlib.kube._informer import SharedInformer, SharedInformerFactory
from pyprovlib.kube._objects import Obj, finalizers_of, name_of
from pyprovlib.kube._resources import (
    CSINODES,
    PERSISTENT_VOLUMES,
    SECRETS,
    VOLUME_ATTACHMENTS,
)
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.kube._store import DeletedFinalStateUnknown
from pyprovlib.kube._workqueue import RateLimitingQueue

__all__ = [
    "NODE_ID_ANNOTATION",
    "PV_INDEX",
    "AttachController",
    "LeaderElectionLostError",
    "should_enqueue_va_change",
]

log = get_logger(__name__)


# -- the controller ------------------------------------------------------------------------------


class AttachController(ControllerLifecycle):
    """Attaches and detaches volumes for VolumeAttachments whose ``spec.attacher`` is
    ``driver_name``, through ``attacher`` (upstream's ``CSIAttachController`` with the CSI
    handler), or marks them attached when ``attacher`` is None (the trivial handler).

    ``client`` is a kubernetes-asyncio ``ApiClient``. Informers come from ``informer_factory``
    when given (the caller starts it) or from a factory the controller owns. :meth:`run` runs
    everything until cancelled or :meth:`stop`; it can be called once.
    """

    def __init__(
        self,
        client: ApiClient,
        driver_name: str,
        attacher: Attacher | None,
        options: AttachControllerOptions | None = None,
        *,
        informer_factory: SharedInformerFactory | None = None,
        clock: Clock | None = None,
    ) -> None:
        if not driver_name:
            raise ValueError("driver_name must not be empty")
        self.driver_name = driver_name
        self.attacher = attacher
        self.options = options or AttachControllerOptions()
        self.finalizer = finalizer_name(driver_name)
        super().__init__(
            client,
            self.options,
            role="attacher",
            lease_name=self.options.lease or default_lease_name(driver_name),
            log=log.bind(driver=driver_name),
            informer_factory=informer_factory,
            clock=clock,
        )
        self.va_queue = retry_queue("csi-attacher-va", self.options, self._clock)
        self.pv_queue = retry_queue("csi-attacher-pv", self.options, self._clock)

        self.va_informer: SharedInformer = self.informer_factory.informer_for(VOLUME_ATTACHMENTS)
        self.va_informer.add_indexers({PV_INDEX: pv_index})
        self.va_informer.add_event_handler(
            on_add=self._va_added, on_update=self._va_updated, on_delete=self._va_deleted
        )
        self.pv_informer: SharedInformer = self.informer_factory.informer_for(PERSISTENT_VOLUMES)
        self.pv_informer.add_event_handler(
            on_add=self._pv_changed, on_update=lambda _old, new: self._pv_changed(new)
        )
        self.csinode_informer: SharedInformer = self.informer_factory.informer_for(CSINODES)

        # What one attach or detach needs, read from the caches (and Secrets).
        resolver = VolumeResolver(
            driver_name,
            self.options.default_fs_type,
            pvs=self.pv_informer.store,
            csinodes=self.csinode_informer.store,
            secrets=ResourceClient(client, SECRETS),
        )
        self._resolver = resolver
        # Our writes, and the record of them that tells our own stale writes from news.
        self._writes = AttachWriter(
            self.finalizer,
            vas=ResourceClient(client, VOLUME_ATTACHMENTS),
            pvs=ResourceClient(client, PERSISTENT_VOLUMES),
            clock=self._clock,
            log=self._log,
        )
        self._sync = AttachSync(
            driver_name=driver_name,
            attacher=attacher,
            options=self.options,
            finalizer=self.finalizer,
            vas=self.va_informer.store,
            resolver=resolver,
            writes=self._writes,
            log=self._log,
        )

    # -- properties ----------------------------------------------------------------------------

    @property
    def trivial(self) -> bool:
        """True when there is no attacher: VolumeAttachments are only marked attached."""
        return self.attacher is None

    @property
    def reconciles(self) -> bool:
        """Whether the reconciler runs (``options.reconcile``, by default when the attacher
        can list what it published)."""
        if self.attacher is None:
            return False
        if self.options.reconcile is not None:
            return self.options.reconcile
        return self.attacher.supports_list_published

    # -- lifecycle -----------------------------------------------------------------------------

    def _work_queues(self) -> tuple[RateLimitingQueue[str], ...]:
        return (self.va_queue, self.pv_queue)

    async def run(self) -> None:
        """Run until cancelled or :meth:`stop`. With leader election the control loops run only
        while holding the Lease; losing it raises :class:`LeaderElectionLostError`."""
        with self._running():
            self._log.info(
                "starting CSI attacher",
                handler="trivial" if self.trivial else "attacher",
                reconcile=self.reconciles,
            )
            await self._run_elected()
        self._log.info("CSI attacher stopped")

    async def _run_controller(self) -> None:
        """Informers, then workers and the reconciler, until stop (upstream's ``Run``)."""
        await self._run_workers_until_stop(
            (self.va_informer, self.pv_informer, self.csinode_informer),
            [(self.va_queue, self._process_va), (self.pv_queue, self._process_pv)],
            workers=self.options.workers,
            started="started CSI attacher",
            beside={"attacher-reconciler": self._reconcile_loop} if self.reconciles else None,
        )

    async def _reconcile_loop(self) -> None:
        # wait.UntilWithContext: run at once, then every period.
        while True:
            try:
                await self.reconcile()
            except Exception as err:
                self._log.error("failed to reconcile VolumeAttachments", error=str(err))
            await self._clock.sleep(self.options.reconcile_sync)

    # -- informer handlers -------------------------------------------------------------------

    def _va_added(self, va: Obj) -> None:
        if self._sync.is_ours(va):
            self.va_queue.add(name_of(va))

    def _va_updated(self, old: Obj, new: Obj) -> None:
        if not self._sync.is_ours(new):
            return
        if should_enqueue_va_change(old, new):
            self.va_queue.add(name_of(new))
        else:
            self._log.debug("ignoring VolumeAttachment error-only change", va=name_of(new))

    def _va_deleted(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        va = obj.obj if isinstance(obj, DeletedFinalStateUnknown) else obj
        self._sync.forget(name_of(va))
        pv_name = pv_name_of(va)
        if pv_name:
            # The PV may now lose its finalizer.
            self.pv_queue.add(pv_name)

    def _pv_changed(self, pv: Obj) -> None:
        # Only a PV being deleted with our finalizer needs anything (upstream's
        # processFinalizers without CSI migration).
        if self.finalizer in finalizers_of(pv) and is_deleting(pv):
            self.pv_queue.add(name_of(pv))

    # -- workers -------------------------------------------------------------------------------

    async def _process_va(self, name: str) -> None:
        logger = self._log.bind(va=name)
        va = self.va_informer.store.get_by_key(name)
        if va is None:
            logger.debug("VolumeAttachment was deleted, ignoring")
            self.va_queue.forget(name)
            return
        if not self._sync.is_ours(va):
            return
        if self._writes.is_own_stale_write(name, va):
            # Our newer write is on its way; an error-only update would not queue the VA
            # again, so look once more after a short while whatever happens.
            logger.debug("cache still shows an intermediate write of ours; looking later")
            self.va_queue.add_after(name, self.options.retry_interval_start)
            return
        self._writes.start_sync(name)
        await process_with_retry(
            self.va_queue,
            name,
            lambda _: self.sync_va(va),
            log=logger,
            failure="error processing VolumeAttachment; retrying with backoff",
        )

    async def _process_pv(self, name: str) -> None:
        pv = self.pv_informer.store.get_by_key(name)
        if pv is None:
            self.pv_queue.forget(name)
            return
        await process_with_retry(
            self.pv_queue,
            name,
            lambda _: self.sync_pv(pv),
            log=self._log,
            failure="failed to remove finalizer from PersistentVolume; retrying",
            describe=api_error_text,
            pv=name,
        )

    # -- the sync of one object ----------------------------------------------------------------

    async def sync_va(self, va: Obj) -> None:
        """Attach or detach for the VolumeAttachment ``va`` now, as a worker does with the
        cached copy; raises when it must be retried."""
        await self._sync.sync_va(va)

    async def sync_pv(self, pv: Obj) -> None:
        """Release the PersistentVolume ``pv`` now (our finalizer, once it is being deleted and
        unused), as a worker does with the cached copy; raises when it must be retried."""
        await self._sync.sync_pv(pv)

    # -- reconciler ------------------------------------------------------------------------------

    async def reconcile(self) -> int:
        """One reconciler pass (upstream's ``ReconcileVA``): list what the attacher published
        and reprocess every VolumeAttachment of ours whose ``status.attached`` disagrees,
        bypassing the "already attached/detached" shortcut once. Returns how many drifted."""
        if self.attacher is None:
            return 0
        async with asyncio.timeout(self.options.timeout):
            published = await self.attacher.list_published()
        drifted = 0
        for va in self.va_informer.store.list():
            if not self._sync.is_ours(va):
                continue
            name = name_of(va)
            try:
                node_id = self._resolver.node_id(va, True)
                volume_id = str(self._resolver.resolve(va).csi.get("volumeHandle") or "")
            except AttachError as err:
                self._log.info("cannot reconcile VolumeAttachment", va=name, error=err.message)
                continue
            found = node_id in (published.get(volume_id) or ())
            if is_attached(va) != found:
                self._log.warning(
                    "VolumeAttachment attached status and actual state do not match; "
                    "reprocessing it",
                    va=name,
                    volume_handle=volume_id,
                    attached_status=is_attached(va),
                    found=found,
                )
                self._sync.force_sync.add(name)
                self.va_queue.add(name)
                drifted += 1
        return drifted

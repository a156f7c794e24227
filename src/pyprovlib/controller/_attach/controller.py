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

Beside this module: :mod:`~pyprovlib.controller._attach.resolve` reads a VolumeAttachment into
the volume, node and secrets of an attacher call; :mod:`~pyprovlib.controller._attach.writes`
makes every write (finalizers, status, errors) and remembers them;
:mod:`~pyprovlib.controller._attach.options` holds the options and upstream's defaults.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Mapping
from typing import Any, Final

from kubernetes_asyncio.client import ApiClient

from pyprovlib._attacher import Attacher, AttachError, AttachNode, AttachVolume, GrpcCode
from pyprovlib._logging import get_logger
from pyprovlib.controller._attach.options import (
    AttachControllerOptions,
    finalizer_name,
)
from pyprovlib.controller._attach.options import (
    lease_name as default_lease_name,
)
from pyprovlib.controller._attach.resolve import (
    NODE_ID_ANNOTATION,
    VolumeResolver,
    api_error_text,
    attacher_of,
    is_attached,
    is_deleting,
    mask_secrets,
    pv_index,
    pv_name_of,
    should_enqueue_va_change,
    spec_of,
)
from pyprovlib.controller._attach.writes import AttachWriter
from pyprovlib.controller._errors import describe_error, is_user_bug, log_user_bug
from pyprovlib.controller._lifecycle import ControllerLifecycle, LeaderElectionLostError
from pyprovlib.controller._sidecar_options import retry_queue
from pyprovlib.kube._clock import Clock
from pyprovlib.kube._errors import ApiException
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

PV_INDEX: Final = "attacher-pv"
"""The VolumeAttachment cache index by ``spec.source.persistentVolumeName``."""


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

        # VAs the reconciler found drifted: processed even if their status says it is done.
        self._force_sync: set[str] = set()
        # What one attach or detach needs, read from the caches (and Secrets).
        self._resolver = VolumeResolver(
            driver_name,
            self.options.default_fs_type,
            pvs=self.pv_informer.store,
            csinodes=self.csinode_informer.store,
            secrets=ResourceClient(client, SECRETS),
        )
        # Our writes, and the record of them that tells our own stale writes from news.
        self._writes = AttachWriter(
            self.finalizer,
            vas=ResourceClient(client, VOLUME_ATTACHMENTS),
            pvs=ResourceClient(client, PERSISTENT_VOLUMES),
            clock=self._clock,
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
        async with asyncio.TaskGroup() as tg:
            informers = tg.create_task(self._run_informers(), name="attacher-informers")
            async with self.va_queue, self.pv_queue:
                caches = (self.va_informer, self.pv_informer, self.csinode_informer)
                if await self._wait_for_sync(caches):
                    self._synced = True
                    count = self.options.workers
                    tasks = [
                        *self._start_workers(tg, count, self.va_queue, self._process_va),
                        *self._start_workers(tg, count, self.pv_queue, self._process_pv),
                    ]
                    reconciler = (
                        tg.create_task(self._reconcile_loop(), name="attacher-reconciler")
                        if self.reconciles
                        else None
                    )
                    self._log.info("started CSI attacher", workers=self.options.workers)
                    await self._stop_requested.wait()
                    self._synced = False
                    if reconciler is not None:
                        reconciler.cancel()
                    self.va_queue.shut_down()
                    self.pv_queue.shut_down()
                    # Workers finish the item in hand and take no other.
                    await asyncio.gather(*tasks)
            informers.cancel()

    async def _reconcile_loop(self) -> None:
        # wait.UntilWithContext: run at once, then every period.
        while True:
            try:
                await self.reconcile()
            except Exception as err:
                self._log.error("failed to reconcile VolumeAttachments", error=str(err))
            await self._clock.sleep(self.options.reconcile_sync)

    # -- informer handlers -------------------------------------------------------------------

    def _is_ours(self, va: Mapping[str, Any]) -> bool:
        return attacher_of(va) == self.driver_name

    def _va_added(self, va: Obj) -> None:
        if self._is_ours(va):
            self.va_queue.add(name_of(va))

    def _va_updated(self, old: Obj, new: Obj) -> None:
        if not self._is_ours(new):
            return
        if should_enqueue_va_change(old, new):
            self.va_queue.add(name_of(new))
        else:
            self._log.debug("ignoring VolumeAttachment error-only change", va=name_of(new))

    def _va_deleted(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        va = obj.obj if isinstance(obj, DeletedFinalStateUnknown) else obj
        self._force_sync.discard(name_of(va))
        self._writes.forget(name_of(va))
        pv_name = pv_name_of(va)
        if pv_name:
            # The PV may now lose its finalizer.
            self.pv_queue.add(pv_name)

    def _pv_changed(self, pv: Obj) -> None:
        # Only a PV being deleted with our finalizer needs anything (upstream's
        # processFinalizers without CSI migration).
        if self.finalizer in finalizers_of(pv) and is_deleting(pv):
            self.pv_queue.add(name_of(pv))

    # -- VolumeAttachments ---------------------------------------------------------------------

    async def _process_va(self, name: str) -> None:
        logger = self._log.bind(va=name)
        va = self.va_informer.store.get_by_key(name)
        if va is None:
            logger.debug("VolumeAttachment was deleted, ignoring")
            self.va_queue.forget(name)
            return
        if not self._is_ours(va):
            return
        if self._writes.is_own_stale_write(name, va):
            # Our newer write is on its way; an error-only update would not queue the VA
            # again, so look once more after a short while whatever happens.
            logger.debug("cache still shows an intermediate write of ours; looking later")
            self.va_queue.add_after(name, self.options.retry_interval_start)
            return
        self._writes.start_sync(name)
        try:
            await self.sync_va(va)
        except Exception as err:
            logger.info("error processing VolumeAttachment; retrying with backoff", error=str(err))
            self.va_queue.add_rate_limited(name)
        else:
            self.va_queue.forget(name)

    async def sync_va(self, va: Obj) -> None:
        """Process one VolumeAttachment of ours (upstream's ``SyncNewOrUpdatedVolumeAttachment``
        without the queue bookkeeping); raises when it must be retried."""
        if self.attacher is None:
            if not is_attached(va):
                await self._writes.mark_as_attached(va, None)
                self._log.info("marked VolumeAttachment as attached", va=name_of(va))
            return
        if is_deleting(va):
            await self._sync_detach(va, self.attacher)
        else:
            await self._sync_attach(va, self.attacher)

    def _consume_force_sync(self, name: str) -> bool:
        if name in self._force_sync:
            self._force_sync.discard(name)
            return True
        return False

    async def _sync_attach(self, va: Obj, attacher: Attacher) -> None:
        name = name_of(va)
        if not self._consume_force_sync(name) and is_attached(va):
            return  # attached, nothing to do
        logger = self._log.bind(va=name)
        logger.info("attaching")
        secrets: Mapping[str, str] = {}
        try:
            va, volume, node, readonly = await self._prepare_attach(va, attacher)
            secrets = volume.secrets
            async with self._timeout("attach", volume.volume_id, node.name):
                metadata = await attacher.attach(volume, node, readonly, volume.volume_attributes)
        except Exception as err:
            raise await self._record_failure("attach", va, err, secrets, logger) from None
        logger.info("attached")
        await self._writes.mark_as_attached(va, dict(metadata) if metadata else None)

    async def _sync_detach(self, va: Obj, attacher: Attacher) -> None:
        name = name_of(va)
        if not self._consume_force_sync(name) and self.finalizer not in finalizers_of(va):
            return  # already detached
        logger = self._log.bind(va=name)
        logger.info("detaching")
        secrets: Mapping[str, str] = {}
        try:
            resolved = self._resolver.resolve(va)
            secrets = await self._resolver.controller_publish_secrets(resolved.csi)
            volume = self._resolver.volume(va, resolved, secrets)
            node_name = str(spec_of(va).get("nodeName") or "")
            node = AttachNode(node_name, self._resolver.node_id(va, True))
            async with self._timeout("detach", volume.volume_id, node.name):
                await attacher.detach(volume, node)
        except Exception as err:
            raise await self._record_failure("detach", va, err, secrets, logger) from None
        logger.info("detached")
        await self._writes.mark_as_detached(va)

    async def _record_failure(
        self, op: str, va: Obj, err: Exception, secrets: Mapping[str, str], logger: Any
    ) -> AttachError:
        """Record why ``op`` ("attach" or "detach") failed in the VA's ``status.<op>Error``,
        with the volume's ``secrets`` masked, and return the error that retries the sync."""
        message = mask_secrets(describe_error(err), secrets)
        if is_user_bug(err):
            log_user_bug(
                logger,
                f"{op} failed: the attacher raised an unexpected exception",
                err,
                mask=functools.partial(mask_secrets, secrets=secrets),
            )
        try:
            await self._writes.save_error(va, f"{op}Error", message, _error_code(err))
        except Exception as save_err:
            logger.info(f"failed to save {op} error", error=api_error_text(save_err))
        return AttachError(f"failed to {op}: {message}")

    def _timeout(self, op: str, volume_id: str, node: str) -> _OperationTimeout:
        return _OperationTimeout(self.options.timeout, op, volume_id, node)

    async def _prepare_attach(
        self, va: Obj, attacher: Attacher
    ) -> tuple[Obj, AttachVolume, AttachNode, bool]:
        """Check as much as possible before the VA finalizer goes on (it would block the
        VA's deletion on an error), add the finalizers, and build the attach arguments."""
        resolved = self._resolver.resolve(va)
        if resolved.pv is not None:
            if is_deleting(resolved.pv):
                raise AttachError(
                    f'PersistentVolume "{name_of(resolved.pv)}" is marked for deletion'
                )
            try:
                await self._writes.add_pv_finalizer(resolved.pv)
            except ApiException as err:
                raise AttachError(
                    f"could not add PersistentVolume finalizer: {api_error_text(err)}"
                ) from None
        volume = self._resolver.volume(va, resolved, {})
        attacher.check(volume)
        secrets = await self._resolver.controller_publish_secrets(resolved.csi)
        volume = volume.with_secrets(secrets)
        readonly = resolved.csi.get("readOnly") is True
        node_name = str(spec_of(va).get("nodeName") or "")
        node_id = self._resolver.node_id(va, False)
        va = await self._writes.add_va_finalizer_and_node_id(va, node_id)
        return va, volume, AttachNode(node_name, node_id), readonly

    # -- writes --------------------------------------------------------------------------------

    # -- PersistentVolumes ---------------------------------------------------------------------

    async def _process_pv(self, name: str) -> None:
        pv = self.pv_informer.store.get_by_key(name)
        if pv is None:
            self.pv_queue.forget(name)
            return
        try:
            await self.sync_pv(pv)
        except Exception as err:
            self._log.info(
                "failed to remove finalizer from PersistentVolume; retrying",
                pv=name,
                error=api_error_text(err),
            )
            self.pv_queue.add_rate_limited(name)
        else:
            self.pv_queue.forget(name)

    async def sync_pv(self, pv: Obj) -> None:
        """Remove our finalizer from a PV being deleted that no VolumeAttachment uses
        (upstream's ``SyncNewOrUpdatedPersistentVolume``); raises when it must be retried."""
        if self.attacher is None or not is_deleting(pv):
            return
        if self.finalizer not in finalizers_of(pv):
            return
        users = self.va_informer.store.by_index(PV_INDEX, name_of(pv))
        if users:
            self._log.debug("PersistentVolume is still used", pv=name_of(pv), va=name_of(users[0]))
            return
        await self._writes.remove_pv_finalizer(pv)
        self._log.info("removed finalizer from PersistentVolume", pv=name_of(pv))

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
            if not self._is_ours(va):
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
                self._force_sync.add(name)
                self.va_queue.add(name)
                drifted += 1
        return drifted


class _OperationTimeout:
    """``asyncio.timeout`` for one attach/detach call that turns the timeout into an
    in-progress :class:`AttachError` (gRPC DeadlineExceeded, as a CSI call's context would)."""

    def __init__(self, seconds: float, op: str, volume_id: str, node: str) -> None:
        self._cm = asyncio.timeout(seconds)
        self._seconds = seconds
        self._what = f"{op} of volume {volume_id} on node {node}"

    async def __aenter__(self) -> None:
        await self._cm.__aenter__()

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        try:
            await self._cm.__aexit__(exc_type, exc, tb)
        except TimeoutError:
            raise AttachError(
                f"{self._what} timed out after {self._seconds:g}s; it may still be in progress",
                code=GrpcCode.DEADLINE_EXCEEDED,
            ) from None
        return False


def _error_code(err: BaseException) -> int | None:
    return err.code if isinstance(err, AttachError) else None

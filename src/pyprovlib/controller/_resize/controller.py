"""The volume expansion controller: kubernetes-csi/external-resizer's ``resizeController`` with
its ``expandAndRecover`` path (Kubernetes' RecoverVolumeExpansionFailure semantics), driving a
:class:`~pyprovlib.Resizer`.

Data flow (as upstream): informers on PersistentVolumeClaims, PersistentVolumes, StorageClasses
(and Pods, for the in-use handling); the claim handlers enqueue ``namespace/name`` keys when a
claim's request grew; workers read the current claim and its volume from the caches and

- skip claims that are not Bound, do not ask for more than ``status.capacity``, or whose volume
  the resizer does not support (with a ``VolumeResizeFailed`` event when the class names this
  resizer as its provisioner, so the user learns why nothing happens);
- refuse (event, no action) claims whose class does not have ``allowVolumeExpansion: true`` —
  on a real cluster the PersistentVolumeClaimResize admission plugin refuses them earlier;
- choose the size to expand to from ``status.allocatedResources`` and
  ``status.allocatedResourceStatuses`` (so a user may lower a request that failed, but never
  below what may already be allocated), mark the claim ``Resizing`` /
  ``ControllerResizeInProgress``, call :meth:`Resizer.expand`, write the PV's capacity, and
  then either finish (``status.capacity``) or hand over to the node
  (``FileSystemResizePending`` / ``NodeResizePending``);
- record failures as a ``ControllerResizeError`` condition (``ControllerResizeInfeasible`` for
  requests that can never succeed) and a ``VolumeResizeFailed`` event, retried with backoff.

Beside this module: :mod:`~pyprovlib.controller._resize.claims` holds the names (reasons,
conditions, statuses) and the pure decisions over a claim and its volume (which size, whether
an update matters); :mod:`~pyprovlib.controller._resize.status` makes every write (claim status,
PV capacity, events); :mod:`~pyprovlib.controller._resize.options` holds the options and
upstream's defaults.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator, Mapping
from typing import Any, Generic, TypeVar

from kubernetes_asyncio.client import ApiClient, V1PersistentVolume

from pyprovlib._attacher import GrpcCode
from pyprovlib._logging import get_logger
from pyprovlib._redaction import scrub_text
from pyprovlib._resizer import ExpansionResult, ResizeError, Resizer
from pyprovlib.controller._errors import (
    DelayRetryError,
    describe_error,
    is_user_bug,
    log_user_bug,
)
from pyprovlib.controller._lifecycle import (
    EVENT_FLUSH_TIMEOUT,
    ControllerLifecycle,
    LeaderElectionLostError,
)
from pyprovlib.controller._resize.claims import (
    NOT_EXPANDABLE_CLASS,
    POD_PVC_INDEX,
    REASON_RESIZING,
    REASON_VOLUME_RESIZE_FAILED,
    STATUS_CONTROLLER_RESIZE_INFEASIBLE,
    allocated_of,
    bytes_quantity,
    claim_capacity,
    claim_key,
    cmp_quantities,
    dict_of,
    expansion_target,
    pod_claims,
    request_of,
    resize_status_of,
    should_enqueue_pvc_change,
    size_text,
)
from pyprovlib.controller._resize.options import ResizeControllerOptions
from pyprovlib.controller._resize.options import lease_name as default_lease_name
from pyprovlib.controller._resize.status import ResizeStatusWriter
from pyprovlib.controller._sidecar_options import retry_queue
from pyprovlib.kube._clock import Clock
from pyprovlib.kube._convert import ConversionError, to_model
from pyprovlib.kube._errors import ApiException, api_error_text
from pyprovlib.kube._events import (
    CONTROLLER_HOLD_LIMIT,
    CONTROLLER_MAX_BUFFER,
    EVENT_TYPE_NORMAL,
    EVENT_TYPE_WARNING,
    EventRecorder,
)
from pyprovlib.kube._informer import SharedInformer, SharedInformerFactory
from pyprovlib.kube._objects import Obj, name_of, namespace_of, spec_of, status_of, uid_of
from pyprovlib.kube._quantity import Quantity
from pyprovlib.kube._resources import (
    PERSISTENT_VOLUME_CLAIMS,
    PERSISTENT_VOLUMES,
    PODS,
    STORAGE_CLASSES,
)
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.kube._store import DeletedFinalStateUnknown
from pyprovlib.kube._workqueue import RateLimitingQueue

__all__ = [
    "EVENT_FLUSH_TIMEOUT",
    "DelayRetryError",
    "LeaderElectionLostError",
    "ResizeController",
]

log = get_logger(__name__)


# -- pure helpers --------------------------------------------------------------------------------


def _error_text(err: BaseException) -> str:
    # the resizer scrubs every message it writes to a claim or an event
    return scrub_text(describe_error(err))


@contextlib.contextmanager
def _api_error_as_failure(failure: str) -> Iterator[None]:
    """An API error in the block fails the sync with ``failure`` and why (retried with
    backoff)."""
    try:
        yield
    except ApiException as err:
        raise RuntimeError(f"{failure}: {api_error_text(err)}") from None


# -- the controller ------------------------------------------------------------------------------


ResizerT = TypeVar("ResizerT", bound=Resizer)


class ResizeController(ControllerLifecycle, Generic[ResizerT]):
    """Expands the volumes of claims whose storage request grew, through ``resizer``
    (external-resizer's ``resizeController``); generic in the resizer's type, so a subclass
    reads its own resizer's methods from :attr:`resizer`.

    ``client`` is a kubernetes-asyncio ``ApiClient``. Informers come from ``informer_factory``
    when given (the caller starts it) or from a factory the controller owns. :meth:`run` runs
    everything until cancelled or :meth:`stop`; it can be called once.
    """

    def __init__(
        self,
        client: ApiClient,
        resizer: ResizerT,
        options: ResizeControllerOptions | None = None,
        *,
        informer_factory: SharedInformerFactory | None = None,
        clock: Clock | None = None,
    ) -> None:
        name = getattr(resizer, "name", "")
        if not isinstance(name, str) or not name:
            raise ValueError("the resizer must have a non-empty name")
        self.resizer = resizer
        self.name = name
        self.options = options or ResizeControllerOptions()
        super().__init__(
            client,
            self.options,
            role="resizer",
            lease_name=self.options.lease or default_lease_name(name),
            log=log.bind(resizer=name),
            informer_factory=informer_factory,
            clock=clock,
        )
        # Event writes yield to resizing while claims wait for a worker (see _run_controller).
        self.recorder = EventRecorder(
            client,
            f"external-resizer {name}",
            host=socket.gethostname(),
            clock=self._clock,
            busy=self._work_waiting,
            max_buffer=CONTROLLER_MAX_BUFFER,
            hold_limit=CONTROLLER_HOLD_LIMIT,
        )
        # Every write: the claim's resize status, the volume's capacity, the claim's events.
        self._writes = ResizeStatusWriter(
            pvcs=ResourceClient(client, PERSISTENT_VOLUME_CLAIMS),
            pvs=ResourceClient(client, PERSISTENT_VOLUMES),
            recorder=self.recorder,
            clock=self._clock,
            log=self._log,
        )
        self.claim_queue = retry_queue(f"{name}-pvc", self.options, self._clock)

        self.pvc_informer: SharedInformer = self.informer_factory.informer_for(
            PERSISTENT_VOLUME_CLAIMS
        )
        self.pvc_informer.add_event_handler(
            on_add=self._pvc_added, on_update=self._pvc_updated, on_delete=self._pvc_deleted
        )
        self.pv_informer: SharedInformer = self.informer_factory.informer_for(PERSISTENT_VOLUMES)
        self.class_informer: SharedInformer = self.informer_factory.informer_for(STORAGE_CLASSES)
        self.pod_informer: SharedInformer | None = None
        if self.options.handle_volume_in_use_error:
            self.pod_informer = self.informer_factory.informer_for(PODS)
            self.pod_informer.add_indexers({POD_PVC_INDEX: pod_claims})

        # Claims whose last expansion failed with a final error: the user's current request may
        # replace the size being allocated (upstream's finalErrorPVCs).
        self._final_errors: set[str] = set()
        # Claims whose expansion was infeasible, with when: retried at the same size only after
        # retry_interval_max (upstream's slowSet).
        self._slow: dict[str, float] = {}
        # Claims the backend refused to expand while in use (upstream's inUsePVCStore).
        self._in_use_errors: set[str] = set()

    # -- lifecycle -----------------------------------------------------------------------------

    def _work_queues(self) -> tuple[RateLimitingQueue[str], ...]:
        return (self.claim_queue,)

    def _work_waiting(self) -> bool:
        """Claims queued for a worker and not shut down: the event writers hold back meanwhile."""
        return bool(len(self.claim_queue)) and not self.claim_queue.shutting_down

    async def run(self) -> None:
        """Run until cancelled or :meth:`stop`. With leader election the control loop runs only
        while holding the Lease; losing it raises :class:`LeaderElectionLostError`."""
        with self._running():
            self._log.info("starting external resizer")
            await self._run_elected_beside(
                {"resizer-events": self.recorder.run},
                graceful_tail=lambda: self._flush_events(self.recorder),
            )
        self._log.info("external resizer stopped")

    async def _run_controller(self) -> None:
        """Informers, then the workers, until stop (upstream's ``Run``)."""
        async with asyncio.TaskGroup() as tg:
            informers = tg.create_task(self._run_informers(), name="resizer-informers")
            async with self.claim_queue:
                caches = [self.pvc_informer, self.pv_informer, self.class_informer]
                if self.pod_informer is not None:
                    caches.append(self.pod_informer)
                if await self._wait_for_sync(caches):
                    self._synced = True
                    workers = self._start_workers(
                        tg,
                        self.options.workers,
                        self.claim_queue,
                        self.recorder.waking(self._process_claim),
                    )
                    self._log.info("started external resizer", workers=self.options.workers)
                    await self._stop_requested.wait()
                    self._synced = False
                    self.claim_queue.shut_down()
                    # Workers finish the claim in hand and take no other.
                    await asyncio.gather(*workers)
            informers.cancel()

    # -- informer handlers -------------------------------------------------------------------

    def _pvc_added(self, pvc: Obj) -> None:
        self.claim_queue.add(claim_key(pvc))

    def _pvc_updated(self, old: Obj, new: Obj) -> None:
        if should_enqueue_pvc_change(old, new):
            self.claim_queue.add(claim_key(new))

    def _pvc_deleted(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        pvc = obj.obj if isinstance(obj, DeletedFinalStateUnknown) else obj
        key = claim_key(pvc)
        self.claim_queue.forget(key)
        self._final_errors.discard(key)
        self._slow.pop(key, None)
        self._in_use_errors.discard(key)

    # -- claims --------------------------------------------------------------------------------

    async def _process_claim(self, key: str) -> None:
        try:
            await self.sync_claim(key)
        except DelayRetryError as err:
            self._log.debug(str(err), claim=key, delay=err.delay)
            self.claim_queue.add_after(key, err.delay)
        except Exception as err:
            self._log.info(
                "error syncing claim; retrying with backoff", claim=key, error=_error_text(err)
            )
            self.claim_queue.add_rate_limited(key)
        else:
            self.claim_queue.forget(key)

    async def sync_claim(self, key: str) -> None:
        """Look at the claim ``key`` (``namespace/name``) and expand its volume if it asks for
        more (upstream's ``syncPVC``); raises when it must be retried."""
        pvc = self.pvc_informer.store.get_by_key(key)
        if pvc is None:
            self._log.debug("claim is deleted or does not exist", claim=key)
            return
        volume_name = spec_of(pvc).get("volumeName")
        if not isinstance(volume_name, str) or not volume_name:
            return
        pv = self.pv_informer.store.get_by_key(volume_name)
        if pv is None:
            self._log.info("PersistentVolume bound to claim not found", claim=key, pv=volume_name)
            return
        if not self.claim_needs_resize(pvc):
            return
        volume = self._may_expand(pvc, pv)
        if volume is None:
            return
        await self.expand_and_recover(pvc, pv, volume)

    @staticmethod
    def claim_needs_resize(pvc: Mapping[str, Any]) -> bool:
        """A Bound claim with a volume that requests more than its ``status.capacity``
        (upstream's ``pvcNeedResize``)."""
        if status_of(pvc).get("phase") != "Bound" or not spec_of(pvc).get("volumeName"):
            return False
        return cmp_quantities(request_of(pvc), claim_capacity(pvc)) > 0

    def _may_expand(self, pvc: Obj, pv: Obj) -> V1PersistentVolume | None:
        """The volume ``pv`` as the model the resizer receives when this resizer should
        expand it for ``pvc``, else None; refusals the user should know about are reported as
        events.

        The conversion happens here, once per look at a claim that wants to grow, and its
        model is shared by every call into the resizer that follows (one conversion per call
        into user code, as ``ProvisionOptions``)."""
        key = claim_key(pvc)
        class_name = str(spec_of(pvc).get("storageClassName") or "")
        storage_class = self.class_informer.store.get_by_key(class_name) if class_name else None
        ours = storage_class is not None and storage_class.get("provisioner") == self.name
        try:
            volume = to_model(pv, V1PersistentVolume)
        except ConversionError as err:
            # Not retried: the same object fails the same way. A change of the claim (or the
            # resync) looks again.
            self._log.info("cannot read the volume", claim=key, pv=name_of(pv), error=str(err))
            if ours:
                self._writes.event(
                    pvc,
                    EVENT_TYPE_WARNING,
                    REASON_VOLUME_RESIZE_FAILED,
                    f'resizer "{self.name}" cannot expand volume {name_of(pv)}: {err}',
                )
            return None
        if not self.resizer.can_support(volume):
            self._log.debug("resizer does not support the volume", claim=key, pv=name_of(pv))
            if ours:
                self._writes.event(
                    pvc,
                    EVENT_TYPE_WARNING,
                    REASON_VOLUME_RESIZE_FAILED,
                    f'resizer "{self.name}" cannot expand volume {name_of(pv)}: '
                    f"{self.resizer.unsupported_reason(volume)}",
                )
            return None
        claim_ref = dict_of(spec_of(pv).get("claimRef"))
        if claim_ref.get("namespace") != namespace_of(pvc) or claim_ref.get("uid") != uid_of(pvc):
            self._log.debug("volume is not bound to the claim", claim=key, pv=name_of(pv))
            return None
        if storage_class is None or storage_class.get("allowVolumeExpansion") is not True:
            why = (
                f'StorageClass "{class_name}" does not set allowVolumeExpansion: true'
                if storage_class is not None
                else (
                    f'StorageClass "{class_name}" not found'
                    if class_name
                    else "the claim has no StorageClass"
                )
            )
            self._log.info("claim may not be expanded", claim=key, why=why)
            self._writes.event(
                pvc,
                EVENT_TYPE_WARNING,
                REASON_VOLUME_RESIZE_FAILED,
                f"{NOT_EXPANDABLE_CLASS}: {why}",
            )
            return None
        return volume

    async def expand_and_recover(
        self, pvc: Obj, pv: Obj, volume: V1PersistentVolume | None = None
    ) -> None:
        """Choose the size to expand to from the claim's allocation state, then expand
        (upstream's ``expandAndRecover``); raises when the claim must be retried.

        ``pv`` is the cached JSON; ``volume`` its model for the resizer (converted here when
        not given)."""
        key = claim_key(pvc)
        resize_status = resize_status_of(pvc)
        allocated = allocated_of(pvc)
        in_slow_set = self._slow_contains(key)
        if resize_status == STATUS_CONTROLLER_RESIZE_INFEASIBLE:
            self._slow.setdefault(key, self._clock.monotonic())

        new_size = expansion_target(
            pvc,
            pv,
            final_error=key in self._final_errors,
            supports_control_plane_expansion=self.resizer.supports_control_plane_expansion,
        )
        if new_size is None:
            return

        update_status = True
        if allocated is not None and allocated == new_size:
            if in_slow_set:
                raise DelayRetryError(
                    f"skipping volume expansion for pvc {key}, because expansion previously "
                    "failed with infeasible error",
                    self._slow_remaining(key),
                )
            update_status = False

        with _api_error_as_failure(f"marking pvc {key} as resizing failed"):
            pvc = await self._writes.mark_controller_resize_in_progress(
                pvc, new_size, update_status
            )

        if key in self._in_use_errors and self._in_use(key):
            message = (
                f"Unable to expand {key} because CSI driver {self.name} only supports offline "
                "expansion and volume is currently in-use"
            )
            self._writes.event(pvc, EVENT_TYPE_WARNING, REASON_VOLUME_RESIZE_FAILED, message)
            raise RuntimeError(message)

        self._writes.event(
            pvc,
            EVENT_TYPE_NORMAL,
            REASON_RESIZING,
            f"External resizer is resizing volume {name_of(pv)}",
        )
        self._in_use_errors.discard(key)
        try:
            if volume is None:
                volume = to_model(pv, V1PersistentVolume)
            await self._call_resize(pvc, pv, volume, new_size)
        except Exception as err:
            self._writes.event(
                pvc, EVENT_TYPE_WARNING, REASON_VOLUME_RESIZE_FAILED, _error_text(err)
            )
            raise

    async def _call_resize(
        self, pvc: Obj, pv: Obj, volume: V1PersistentVolume, new_size: Quantity
    ) -> None:
        """Expand through the resizer and record the outcome (upstream's
        ``callResizeOnPlugin``)."""
        key = claim_key(pvc)
        logger = self._log.bind(claim=key, pv=name_of(pv))
        try:
            result = await self._expand(pv, volume, new_size)
        except Exception as err:
            bug = is_user_bug(err)
            if bug:
                log_user_bug(
                    logger, "expansion failed: the resizer raised an unexpected exception", err
                )
            resize_err = (
                err if isinstance(err, ResizeError) else ResizeError(_error_text(err), final=False)
            )
            if resize_err.in_use:
                self._in_use_errors.add(key)
            if resize_err.final:
                self._final_errors.add(key)
                if resize_err.infeasible:
                    self._slow.setdefault(key, self._clock.monotonic())
                else:
                    self._slow.pop(key, None)
                try:
                    await self._writes.mark_controller_expansion_failed(
                        pvc, _error_text(resize_err), infeasible=resize_err.infeasible
                    )
                except ApiException as api_err:
                    raise ResizeError(
                        f"resizing failed in controller with {_error_text(resize_err)} but "
                        f"failed to update PVC {key} with: {api_error_text(api_err)}",
                        code=resize_err.code,
                    ) from None
            else:
                self._slow.pop(key, None)
                self._final_errors.discard(key)
            if not bug:  # a bug was logged above, with its traceback
                logger.info("expansion failed", error=_error_text(resize_err))
            raise ResizeError(
                f'resize volume "{name_of(pv)}" by resizer "{self.name}" failed: '
                f"{_error_text(resize_err)}",
                code=resize_err.code,
                final=resize_err.final,
                infeasible=resize_err.infeasible,
                in_use=resize_err.in_use,
            ) from None
        self._final_errors.discard(key)
        self._slow.pop(key, None)
        new_capacity = bytes_quantity(result.size)
        logger.info(
            "volume expanded",
            capacity=size_text(new_capacity),
            node_expansion_required=result.node_expansion_required,
        )
        with _api_error_as_failure(f'error updating pv "{name_of(pv)}" by resizer'):
            await self._writes.update_pv_capacity(pv, new_capacity)
        with _api_error_as_failure(f"mark PVC {key} after expansion failed"):
            if result.node_expansion_required:
                await self._writes.mark_for_pending_node_expansion(pvc)
            else:
                await self._writes.mark_expansion_finished(pvc, new_capacity)

    async def _expand(
        self, pv: Obj, volume: V1PersistentVolume, new_size: Quantity
    ) -> ExpansionResult:
        try:
            async with asyncio.timeout(self.options.timeout):
                result = await self.resizer.expand(volume, new_size.value())
        except TimeoutError:
            raise ResizeError(
                f"expansion of volume {name_of(pv)} timed out after {self.options.timeout:g}s; "
                "it may still be in progress",
                code=GrpcCode.DEADLINE_EXCEEDED,
            ) from None
        size, node = result
        if not isinstance(size, int) or size < 0:
            raise ResizeError(f"the resizer returned an invalid size {size!r}", final=False)
        return ExpansionResult(size, bool(node))

    # -- in-use and slow-retry bookkeeping ---------------------------------------------------

    def _in_use(self, key: str) -> bool:
        if self.pod_informer is None:
            return False
        return bool(self.pod_informer.store.by_index(POD_PVC_INDEX, key))

    def _slow_contains(self, key: str) -> bool:
        added = self._slow.get(key)
        if added is None:
            return False
        if self._clock.monotonic() - added >= self.options.retry_interval_max:
            del self._slow[key]
            return False
        return True

    def _slow_remaining(self, key: str) -> float:
        added = self._slow.get(key)
        if added is None:
            return 0.0
        return max(0.0, added + self.options.retry_interval_max - self._clock.monotonic())

    # -- writes --------------------------------------------------------------------------------

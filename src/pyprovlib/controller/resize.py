"""The volume expansion controller: kubernetes-csi/external-resizer's ``resizeController`` with
its ``expandAndRecover`` path (Kubernetes' RecoverVolumeExpansionFailure semantics), driving a
:class:`~pyprovlib.resizer.Resizer`.

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
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Mapping
from typing import Any, Final

from kubernetes_asyncio.client import ApiClient

from pyprovlib._logging import get_logger
from pyprovlib.attacher import GrpcCode
from pyprovlib.controller._errors import describe_user_error, is_user_bug, log_user_bug
from pyprovlib.controller._lifecycle import ControllerLifecycle, LeaderElectionLostError
from pyprovlib.controller.resize_options import ResizeControllerOptions
from pyprovlib.controller.resize_options import lease_name as default_lease_name
from pyprovlib.controller.volume_store import event_target
from pyprovlib.errors import PyprovlibError
from pyprovlib.kube.clock import Clock
from pyprovlib.kube.errors import ApiException
from pyprovlib.kube.events import EVENT_TYPE_NORMAL, EVENT_TYPE_WARNING, EventRecorder
from pyprovlib.kube.informer import SharedInformer, SharedInformerFactory
from pyprovlib.kube.objects import Obj, annotations_of, meta, name_of, namespace_of, uid_of
from pyprovlib.kube.quantity import Format, Quantity, parse_quantity
from pyprovlib.kube.resources import (
    PERSISTENT_VOLUME_CLAIMS,
    PERSISTENT_VOLUMES,
    PODS,
    STORAGE_CLASSES,
)
from pyprovlib.kube.rest import ResourceClient
from pyprovlib.kube.store import DeletedFinalStateUnknown
from pyprovlib.kube.workqueue import ItemExponentialFailureRateLimiter, RateLimitingQueue
from pyprovlib.redaction import scrub_text
from pyprovlib.resizer import ExpansionResult, ResizeError, Resizer

__all__ = [
    "ANN_NODE_EXPANSION_NOT_REQUIRED",
    "ANN_STORAGE_RESIZER",
    "CONDITION_CONTROLLER_RESIZE_ERROR",
    "CONDITION_FILE_SYSTEM_RESIZE_PENDING",
    "CONDITION_NODE_RESIZE_ERROR",
    "CONDITION_RESIZING",
    "EVENT_FLUSH_TIMEOUT",
    "REASON_FILE_SYSTEM_RESIZE_REQUIRED",
    "REASON_RESIZING",
    "REASON_VOLUME_RESIZE_FAILED",
    "REASON_VOLUME_RESIZE_SUCCESSFUL",
    "STATUS_CONTROLLER_RESIZE_INFEASIBLE",
    "STATUS_CONTROLLER_RESIZE_IN_PROGRESS",
    "STATUS_NODE_RESIZE_INFEASIBLE",
    "STATUS_NODE_RESIZE_IN_PROGRESS",
    "STATUS_NODE_RESIZE_PENDING",
    "DelayRetryError",
    "LeaderElectionLostError",
    "ResizeController",
    "expansion_target",
    "merge_resize_conditions",
    "should_enqueue_pvc_change",
]

log = get_logger(__name__)

REASON_RESIZING: Final = "Resizing"
"""Normal event: the resizer is calling the backend."""
REASON_VOLUME_RESIZE_SUCCESSFUL: Final = "VolumeResizeSuccessful"
"""Normal event: the volume was expanded and no node expansion is needed."""
REASON_VOLUME_RESIZE_FAILED: Final = "VolumeResizeFailed"
"""Warning event: the expansion failed, or cannot be done for this claim."""
REASON_FILE_SYSTEM_RESIZE_REQUIRED: Final = "FileSystemResizeRequired"
"""Normal event: the volume was expanded; the node must still grow the file system."""

CONDITION_RESIZING: Final = "Resizing"
"""Claim condition while the controller expands the volume."""
CONDITION_FILE_SYSTEM_RESIZE_PENDING: Final = "FileSystemResizePending"
"""Claim condition once the volume grew and the node must still grow the file system."""
CONDITION_CONTROLLER_RESIZE_ERROR: Final = "ControllerResizeError"
"""Claim condition carrying the message of the last final expansion failure."""
CONDITION_NODE_RESIZE_ERROR: Final = "NodeResizeError"
"""Claim condition set by kubelet when the node expansion failed (cleared on success)."""
_RESIZE_CONDITIONS: Final = frozenset(
    {
        CONDITION_RESIZING,
        CONDITION_FILE_SYSTEM_RESIZE_PENDING,
        CONDITION_CONTROLLER_RESIZE_ERROR,
        CONDITION_NODE_RESIZE_ERROR,
    }
)

STATUS_CONTROLLER_RESIZE_IN_PROGRESS: Final = "ControllerResizeInProgress"
"""``allocatedResourceStatuses.storage`` while the controller expands (or may be expanding)."""
STATUS_CONTROLLER_RESIZE_INFEASIBLE: Final = "ControllerResizeInfeasible"
"""``allocatedResourceStatuses.storage`` after the backend called the request impossible; the
user may lower it (above ``status.capacity``) to recover."""
STATUS_NODE_RESIZE_PENDING: Final = "NodeResizePending"
"""``allocatedResourceStatuses.storage`` when the node must grow the file system."""
STATUS_NODE_RESIZE_IN_PROGRESS: Final = "NodeResizeInProgress"
"""``allocatedResourceStatuses.storage`` while kubelet grows the file system."""
STATUS_NODE_RESIZE_INFEASIBLE: Final = "NodeResizeInfeasible"
"""``allocatedResourceStatuses.storage`` after kubelet found the node expansion impossible."""

ANN_NODE_EXPANSION_NOT_REQUIRED: Final = "volume.kubernetes.io/node-expansion-not-required"
"""Set on a claim whose expansion finished in the controller, so kubelet does not try again."""
ANN_STORAGE_RESIZER: Final = "volume.kubernetes.io/storage-resizer"
"""Set by Kubernetes' expand controller to the resizer that must expand the claim; a change of
it makes upstream look at the claim again (CSI migration)."""

EVENT_FLUSH_TIMEOUT: Final = 5.0
"""How long a graceful stop waits for buffered events to be written."""

_STORAGE: Final = "storage"
_PENDING_MESSAGE: Final = (
    "Waiting for user to (re-)start a pod to finish file system resize of volume on node."
)
_NOT_EXPANDABLE_CLASS: Final = (
    "only dynamically provisioned pvc can be resized and the storageclass that provisions the "
    "pvc must support resize"
)
_POD_PVC_INDEX: Final = "resizer-pvc"
_TERMINAL_POD_PHASES: Final = frozenset({"Succeeded", "Failed"})


class DelayRetryError(PyprovlibError):
    """A sync that must be retried after ``delay`` seconds, not with the usual backoff
    (upstream's ``DelayRetryError``, for infeasible expansions)."""

    def __init__(self, message: str, delay: float) -> None:
        super().__init__(message)
        self.delay = delay


# -- pure helpers --------------------------------------------------------------------------------


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return _dict(obj.get("spec"))


def _status(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return _dict(obj.get("status"))


def _quantity(value: Any) -> Quantity | None:
    if not isinstance(value, str):
        return None
    try:
        return parse_quantity(value)
    except ValueError:
        return None


def _request(pvc: Mapping[str, Any]) -> Quantity | None:
    return _quantity(_dict(_dict(_spec(pvc).get("resources")).get("requests")).get(_STORAGE))


def _claim_capacity(pvc: Mapping[str, Any]) -> Quantity | None:
    return _quantity(_dict(_status(pvc).get("capacity")).get(_STORAGE))


def _pv_capacity(pv: Mapping[str, Any]) -> Quantity | None:
    return _quantity(_dict(_spec(pv).get("capacity")).get(_STORAGE))


def _allocated(pvc: Mapping[str, Any]) -> Quantity | None:
    return _quantity(_dict(_status(pvc).get("allocatedResources")).get(_STORAGE))


def _resize_status(pvc: Mapping[str, Any]) -> str:
    value = _dict(_status(pvc).get("allocatedResourceStatuses")).get(_STORAGE)
    return value if isinstance(value, str) else ""


def _conditions(pvc: Mapping[str, Any]) -> list[Obj]:
    raw = _status(pvc).get("conditions")
    return [dict(c) for c in raw if isinstance(c, Mapping)] if isinstance(raw, list) else []


def _has_fs_resize_pending(pvc: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") == CONDITION_FILE_SYSTEM_RESIZE_PENDING and c.get("status") == "True"
        for c in _conditions(pvc)
    )


def _size_text(q: Quantity) -> str:
    return str(q)


def _bytes_quantity(size: int) -> Quantity:
    return Quantity.from_int(size, Format.BINARY_SI)


def _claim_key(pvc: Mapping[str, Any]) -> str:
    return f"{namespace_of(pvc)}/{name_of(pvc)}"


def _cmp(a: Quantity | None, b: Quantity | None) -> int:
    """``Quantity.Cmp`` where a missing quantity is zero."""
    an = a.nanos if a is not None else 0
    bn = b.nanos if b is not None else 0
    return (an > bn) - (an < bn)


def should_enqueue_pvc_change(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether an update of a claim needs a look (upstream's ``updatePVC``): its request
    changed, the resizer annotation changed, a resync (same resourceVersion), or its capacity
    grew. Other updates (labels, our own status writes) are ignored.

    Upstream only reacts to a *grown* request; a lowered one (recovery from a failed expansion)
    is also taken here so the user's correction is acted on at once instead of at the next
    retry of the failed claim."""
    if _cmp(_request(new), _request(old)) != 0:
        return True
    if annotations_of(new).get(ANN_STORAGE_RESIZER) != annotations_of(old).get(ANN_STORAGE_RESIZER):
        return True
    if meta(new).get("resourceVersion") == meta(old).get("resourceVersion"):
        return True
    return _cmp(_claim_capacity(new), _claim_capacity(old)) > 0


def merge_resize_conditions(
    old: list[Obj], new: list[Obj], *, keep_old_resize_conditions: bool
) -> list[Obj]:
    """Kubernetes' ``MergeResizeConditionOnPVC``: conditions that are not about resizing are
    kept; a resize condition in ``new`` replaces the old one of its type (keeping the old one,
    and so its transition time, when the status did not change); old resize conditions absent
    from ``new`` are dropped unless ``keep_old_resize_conditions``."""
    wanted = {str(c["type"]): c for c in new}
    result: list[Obj] = []
    for condition in old:
        kind = str(condition.get("type") or "")
        if kind not in _RESIZE_CONDITIONS:
            result.append(condition)
            continue
        replacement = wanted.pop(kind, None)
        if replacement is not None:
            if replacement.get("status") == condition.get("status") and replacement.get(
                "message"
            ) == condition.get("message"):
                result.append(condition)
            else:
                result.append(replacement)
        elif keep_old_resize_conditions:
            result.append(condition)
    result.extend(wanted.values())
    return result


def expansion_target(
    pvc: Mapping[str, Any],
    pv: Mapping[str, Any],
    *,
    final_error: bool,
    supports_control_plane_expansion: bool = True,
) -> Quantity | None:
    """The size to expand ``pv`` to for ``pvc``, or None when there is nothing to do now
    (external-resizer's ``expandAndRecover`` decision, verbose on purpose like upstream's).

    ``final_error``: the last expansion of this claim failed with a final error, so nothing is
    in progress and the user's current request may replace the size being allocated. Otherwise
    ``status.allocatedResources`` wins over a lowered request while an expansion may still be
    running, so a volume never ends up smaller than what the backend may have allocated.
    """
    spec_size = _request(pvc)
    if spec_size is None:
        return None
    pv_size = _pv_capacity(pv)
    resize_status = _resize_status(pvc)
    allocated = _allocated(pvc)
    new_size = spec_size
    if _cmp(pv_size, spec_size) < 0:
        # The volume is smaller than asked: expand, but let an expansion that may still be
        # running finish at its size first.
        if resize_status == STATUS_NODE_RESIZE_INFEASIBLE:
            new_size = allocated if allocated is not None else spec_size
        elif resize_status in (STATUS_NODE_RESIZE_PENDING, STATUS_NODE_RESIZE_IN_PROGRESS):
            new_size = allocated if allocated is not None else spec_size
            if _cmp(pv_size, new_size) >= 0:
                return None  # the node has work to finish first
        elif resize_status == STATUS_CONTROLLER_RESIZE_IN_PROGRESS:
            if final_error:
                new_size = spec_size
            elif allocated is not None:
                new_size = allocated
        else:
            new_size = spec_size
    else:
        # The volume was expanded already.
        if resize_status in (STATUS_NODE_RESIZE_IN_PROGRESS, STATUS_NODE_RESIZE_PENDING):
            return None  # kubelet's turn
        if resize_status == STATUS_NODE_RESIZE_INFEASIBLE:
            if supports_control_plane_expansion and allocated is not None:
                new_size = allocated
            else:
                new_size = spec_size
        elif resize_status in (
            STATUS_CONTROLLER_RESIZE_IN_PROGRESS,
            STATUS_CONTROLLER_RESIZE_INFEASIBLE,
        ):
            if allocated is not None:
                new_size = allocated
        elif resize_status == "" and allocated is not None:
            new_size = allocated
        else:
            if _has_fs_resize_pending(pvc):
                return None
            new_size = spec_size
    return new_size


def _api_error_text(err: BaseException) -> str:
    """A short description of an API error: the Status message, not the whole body."""
    if isinstance(err, ApiException):
        body: Any = err.body
        try:
            decoded = json.loads(body) if body else None
        except (TypeError, ValueError):
            decoded = None
        if isinstance(decoded, dict) and isinstance(decoded.get("message"), str):
            return str(decoded["message"])
        return f"{err.status} {err.reason}".strip()
    return str(err) or type(err).__name__


def _error_text(err: BaseException) -> str:
    if isinstance(err, ResizeError):
        return scrub_text(err.message)
    if isinstance(err, ApiException):
        return _api_error_text(err)
    if is_user_bug(err):
        return scrub_text(describe_user_error(err))
    return scrub_text(str(err) or type(err).__name__)


def _pod_claims(pod: Obj) -> list[str]:
    """``namespace/claim`` of every claim a pod that has not terminated uses (upstream's
    ``inUsePVCStore``)."""
    if _status(pod).get("phase") in _TERMINAL_POD_PHASES:
        return []
    namespace = namespace_of(pod)
    claims: list[str] = []
    for volume in _spec(pod).get("volumes") or ():
        claim = _dict(_dict(volume).get("persistentVolumeClaim")).get("claimName")
        if isinstance(claim, str) and claim:
            claims.append(f"{namespace}/{claim}")
    return claims


class _Stop(PyprovlibError):
    """Nothing to do for this claim now (not an error)."""


# -- the controller ------------------------------------------------------------------------------


class ResizeController(ControllerLifecycle):
    """Expands the volumes of claims whose storage request grew, through ``resizer``
    (external-resizer's ``resizeController``).

    ``client`` is a kubernetes-asyncio ``ApiClient``. Informers come from ``informer_factory``
    when given (the caller starts it) or from a factory the controller owns. :meth:`run` runs
    everything until cancelled or :meth:`stop`; it can be called once.
    """

    def __init__(
        self,
        client: ApiClient,
        resizer: Resizer,
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
        self._pvcs = ResourceClient(client, PERSISTENT_VOLUME_CLAIMS)
        self._pvs = ResourceClient(client, PERSISTENT_VOLUMES)
        self.recorder = EventRecorder(
            client, f"external-resizer {name}", host=socket.gethostname(), clock=self._clock
        )
        self.claim_queue: RateLimitingQueue[str] = RateLimitingQueue(
            f"{name}-pvc",
            ItemExponentialFailureRateLimiter(
                self.options.retry_interval_start, self.options.retry_interval_max
            ),
            clock=self._clock,
            registry=self.options.registry,
        )

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
            self.pod_informer.add_indexers({_POD_PVC_INDEX: _pod_claims})

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

    async def run(self) -> None:
        """Run until cancelled or :meth:`stop`. With leader election the control loop runs only
        while holding the Lease; losing it raises :class:`LeaderElectionLostError`."""
        with self._running():
            self._log.info("starting external resizer")
            failure: Exception | None = None
            async with asyncio.TaskGroup() as tg:
                events = tg.create_task(self.recorder.run(), name="resizer-events")
                try:
                    await self._run_elected()
                except Exception as err:  # re-raised as is below, not as an ExceptionGroup
                    failure = err
                else:
                    if not await self.recorder.flush(EVENT_FLUSH_TIMEOUT):
                        self._log.warning("not every event could be written before stopping")
                events.cancel()
            if failure is not None:
                raise failure
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
                    workers = [
                        tg.create_task(self._worker(self.claim_queue, self._process_claim))
                        for _ in range(self.options.workers)
                    ]
                    self._log.info("started external resizer", workers=self.options.workers)
                    await self._stop_requested.wait()
                    self._synced = False
                    self.claim_queue.shut_down()
                    # Workers finish the claim in hand and take no other.
                    await asyncio.gather(*workers)
            informers.cancel()

    # -- informer handlers -------------------------------------------------------------------

    def _pvc_added(self, pvc: Obj) -> None:
        self.claim_queue.add(_claim_key(pvc))

    def _pvc_updated(self, old: Obj, new: Obj) -> None:
        if should_enqueue_pvc_change(old, new):
            self.claim_queue.add(_claim_key(new))

    def _pvc_deleted(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        pvc = obj.obj if isinstance(obj, DeletedFinalStateUnknown) else obj
        key = _claim_key(pvc)
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
        volume_name = _spec(pvc).get("volumeName")
        if not isinstance(volume_name, str) or not volume_name:
            return
        pv = self.pv_informer.store.get_by_key(volume_name)
        if pv is None:
            self._log.info("PersistentVolume bound to claim not found", claim=key, pv=volume_name)
            return
        if not self.claim_needs_resize(pvc):
            return
        if not self._may_expand(pvc, pv):
            return
        await self.expand_and_recover(pvc, pv)

    @staticmethod
    def claim_needs_resize(pvc: Mapping[str, Any]) -> bool:
        """A Bound claim with a volume that requests more than its ``status.capacity``
        (upstream's ``pvcNeedResize``)."""
        if _status(pvc).get("phase") != "Bound" or not _spec(pvc).get("volumeName"):
            return False
        return _cmp(_request(pvc), _claim_capacity(pvc)) > 0

    def _may_expand(self, pvc: Obj, pv: Obj) -> bool:
        """Whether this resizer should expand ``pv`` for ``pvc``; refusals the user should know
        about are reported as events."""
        key = _claim_key(pvc)
        class_name = str(_spec(pvc).get("storageClassName") or "")
        storage_class = self.class_informer.store.get_by_key(class_name) if class_name else None
        ours = storage_class is not None and storage_class.get("provisioner") == self.name
        if not self.resizer.can_support(pv):
            self._log.debug("resizer does not support the volume", claim=key, pv=name_of(pv))
            if ours:
                self._event(
                    pvc,
                    EVENT_TYPE_WARNING,
                    REASON_VOLUME_RESIZE_FAILED,
                    f'resizer "{self.name}" cannot expand volume {name_of(pv)}: '
                    f"{self.resizer.unsupported_reason(pv)}",
                )
            return False
        claim_ref = _dict(_spec(pv).get("claimRef"))
        if claim_ref.get("namespace") != namespace_of(pvc) or claim_ref.get("uid") != uid_of(pvc):
            self._log.debug("volume is not bound to the claim", claim=key, pv=name_of(pv))
            return False
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
            self._event(
                pvc,
                EVENT_TYPE_WARNING,
                REASON_VOLUME_RESIZE_FAILED,
                f"{_NOT_EXPANDABLE_CLASS}: {why}",
            )
            return False
        return True

    async def expand_and_recover(self, pvc: Obj, pv: Obj) -> None:
        """Choose the size to expand to from the claim's allocation state, then expand
        (upstream's ``expandAndRecover``); raises when the claim must be retried."""
        key = _claim_key(pvc)
        resize_status = _resize_status(pvc)
        allocated = _allocated(pvc)
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

        try:
            pvc = await self._mark_controller_resize_in_progress(pvc, new_size, update_status)
        except ApiException as err:
            raise RuntimeError(
                f"marking pvc {key} as resizing failed: {_api_error_text(err)}"
            ) from None

        if key in self._in_use_errors and self._in_use(key):
            message = (
                f"Unable to expand {key} because CSI driver {self.name} only supports offline "
                "expansion and volume is currently in-use"
            )
            self._event(pvc, EVENT_TYPE_WARNING, REASON_VOLUME_RESIZE_FAILED, message)
            raise RuntimeError(message)

        self._event(
            pvc,
            EVENT_TYPE_NORMAL,
            REASON_RESIZING,
            f"External resizer is resizing volume {name_of(pv)}",
        )
        self._in_use_errors.discard(key)
        try:
            await self._call_resize(pvc, pv, new_size)
        except Exception as err:
            self._event(pvc, EVENT_TYPE_WARNING, REASON_VOLUME_RESIZE_FAILED, _error_text(err))
            raise

    async def _call_resize(self, pvc: Obj, pv: Obj, new_size: Quantity) -> None:
        """Expand through the resizer and record the outcome (upstream's
        ``callResizeOnPlugin``)."""
        key = _claim_key(pvc)
        logger = self._log.bind(claim=key, pv=name_of(pv))
        try:
            result = await self._expand(pv, new_size)
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
                    await self._mark_controller_expansion_failed(
                        pvc, _error_text(resize_err), infeasible=resize_err.infeasible
                    )
                except ApiException as api_err:
                    raise ResizeError(
                        f"resizing failed in controller with {_error_text(resize_err)} but "
                        f"failed to update PVC {key} with: {_api_error_text(api_err)}",
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
        new_capacity = _bytes_quantity(result.size)
        logger.info(
            "volume expanded",
            capacity=_size_text(new_capacity),
            node_expansion_required=result.node_expansion_required,
        )
        try:
            await self._update_pv_capacity(pv, new_capacity)
        except ApiException as err:
            raise RuntimeError(
                f'error updating pv "{name_of(pv)}" by resizer: {_api_error_text(err)}'
            ) from None
        try:
            if result.node_expansion_required:
                await self._mark_for_pending_node_expansion(pvc)
            else:
                await self._mark_expansion_finished(pvc, new_capacity)
        except ApiException as err:
            raise RuntimeError(
                f"mark PVC {key} after expansion failed: {_api_error_text(err)}"
            ) from None

    async def _expand(self, pv: Obj, new_size: Quantity) -> ExpansionResult:
        try:
            async with asyncio.timeout(self.options.timeout):
                result = await self.resizer.expand(pv, new_size.value())
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
        return bool(self.pod_informer.store.by_index(_POD_PVC_INDEX, key))

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

    def _event(self, pvc: Obj, type_: str, reason: str, message: str) -> None:
        self.recorder.event(event_target(pvc, "PersistentVolumeClaim"), type_, reason, message)

    def _condition(self, kind: str, message: str = "") -> Obj:
        condition: Obj = {
            "type": kind,
            "status": "True",
            "lastProbeTime": None,
            "lastTransitionTime": self._clock.now().strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        if message:
            condition["message"] = message
        return condition

    async def _patch_claim(
        self,
        pvc: Obj,
        status: Obj,
        *,
        annotation: bool | None,
        check_resource_version: bool,
    ) -> Obj:
        """Merge-patch the claim's status subresource (upstream's ``PatchClaim``), optionally
        guarded by the claim's resourceVersion; ``annotation`` adds (True) or removes (False)
        the node-expansion-not-required annotation when it is not already so."""
        metadata: Obj = {}
        if check_resource_version:
            metadata["resourceVersion"] = meta(pvc).get("resourceVersion")
        present = ANN_NODE_EXPANSION_NOT_REQUIRED in annotations_of(pvc)
        if annotation is True and not present:
            metadata["annotations"] = {ANN_NODE_EXPANSION_NOT_REQUIRED: "true"}
        elif annotation is False and present:
            metadata["annotations"] = {ANN_NODE_EXPANSION_NOT_REQUIRED: None}
        body: Obj = {"status": status}
        if metadata:
            body["metadata"] = metadata
        return await self._pvcs.patch(
            name_of(pvc), body, namespace=namespace_of(pvc), subresource="status"
        )

    async def _mark_controller_resize_in_progress(
        self, pvc: Obj, new_size: Quantity, update_status: bool
    ) -> Obj:
        conditions = merge_resize_conditions(
            _conditions(pvc),
            [self._condition(CONDITION_RESIZING)],
            keep_old_resize_conditions=not update_status,
        )
        status: Obj = {
            "conditions": conditions,
            "allocatedResources": {_STORAGE: _size_text(new_size)},
        }
        if update_status:
            status["allocatedResourceStatuses"] = {_STORAGE: STATUS_CONTROLLER_RESIZE_IN_PROGRESS}
        return await self._patch_claim(pvc, status, annotation=False, check_resource_version=True)

    async def _mark_controller_expansion_failed(
        self, pvc: Obj, message: str, *, infeasible: bool
    ) -> Obj:
        # No resourceVersion check (as upstream): the failure must be recorded even when our
        # copy of the claim is slightly old, or the whole operation would have to start over.
        conditions = merge_resize_conditions(
            _conditions(pvc),
            [
                self._condition(
                    CONDITION_CONTROLLER_RESIZE_ERROR, f"failed to expand pvc with {message}"
                )
            ],
            keep_old_resize_conditions=True,
        )
        status: Obj = {"conditions": conditions}
        if infeasible:
            status["allocatedResourceStatuses"] = {_STORAGE: STATUS_CONTROLLER_RESIZE_INFEASIBLE}
        return await self._patch_claim(pvc, status, annotation=None, check_resource_version=False)

    async def _mark_for_pending_node_expansion(self, pvc: Obj) -> Obj:
        conditions = merge_resize_conditions(
            _conditions(pvc),
            [self._condition(CONDITION_FILE_SYSTEM_RESIZE_PENDING, _PENDING_MESSAGE)],
            keep_old_resize_conditions=True,
        )
        status: Obj = {
            "conditions": conditions,
            "allocatedResourceStatuses": {_STORAGE: STATUS_NODE_RESIZE_PENDING},
        }
        updated = await self._patch_claim(
            pvc, status, annotation=False, check_resource_version=True
        )
        self._log.info("claim needs a file system resize on the node", claim=_claim_key(pvc))
        self._event(
            pvc,
            EVENT_TYPE_NORMAL,
            REASON_FILE_SYSTEM_RESIZE_REQUIRED,
            "Require file system resize of volume on node",
        )
        return updated

    async def _mark_expansion_finished(self, pvc: Obj, new_size: Quantity) -> Obj:
        conditions = merge_resize_conditions(_conditions(pvc), [], keep_old_resize_conditions=False)
        status: Obj = {"capacity": {_STORAGE: _size_text(new_size)}, "conditions": conditions}
        statuses = _dict(_status(pvc).get("allocatedResourceStatuses"))
        if _STORAGE in statuses:
            # JSON merge patch: null removes the key, or the whole map when nothing else is in it.
            status["allocatedResourceStatuses"] = {_STORAGE: None} if len(statuses) > 1 else None
        updated = await self._patch_claim(pvc, status, annotation=True, check_resource_version=True)
        self._log.info("claim expansion finished", claim=_claim_key(pvc))
        self._event(
            pvc, EVENT_TYPE_NORMAL, REASON_VOLUME_RESIZE_SUCCESSFUL, "Resize volume succeeded"
        )
        return updated

    async def _update_pv_capacity(self, pv: Obj, capacity: Quantity) -> Obj:
        body: Obj = {"spec": {"capacity": {_STORAGE: _size_text(capacity)}}}
        return await self._pvs.patch(name_of(pv), body)

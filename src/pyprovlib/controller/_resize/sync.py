"""The sync of one claim of the resize controller: upstream's ``syncPVC`` and
``expandAndRecover`` (Kubernetes' RecoverVolumeExpansionFailure semantics).

Invariants:

- The resizer is called only for a Bound claim asking for more than its capacity, whose
  volume it supports, is bound to it, and whose class allows expansion; refusals the user
  should know about become ``VolumeResizeFailed`` events.
- The claim says ``ControllerResizeInProgress`` towards the size before the resizer is called
  (a write guarded by the claim's resourceVersion), and the size is never chosen below what
  may already be allocated (:func:`~pyprovlib.controller._resize.claims.expansion_target`).
- An infeasible expansion is tried again at the same size only after ``retry_interval_max``
  (upstream's slow set); a claim the backend refused while in use is not expanded while a pod
  uses it (``handle_volume_in_use_error``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from kubernetes_asyncio.client import V1PersistentVolume

from pyprovlib._attacher import GrpcCode
from pyprovlib._resizer import ExpansionResult, ResizeError, Resizer
from pyprovlib.controller._errors import DelayRetryError, is_user_bug, log_user_bug
from pyprovlib.controller._resize.claims import (
    NOT_EXPANDABLE_CLASS,
    POD_PVC_INDEX,
    REASON_RESIZING,
    REASON_VOLUME_RESIZE_FAILED,
    STATUS_CONTROLLER_RESIZE_INFEASIBLE,
    allocated_of,
    bytes_quantity,
    claim_key,
    claim_needs_resize,
    expansion_target,
    resize_status_of,
    size_text,
)
from pyprovlib.controller._resize.errors import api_error_as_failure, error_text
from pyprovlib.controller._resize.options import ResizeControllerOptions
from pyprovlib.controller._resize.status import ResizeStatusWriter
from pyprovlib.kube._clock import Clock
from pyprovlib.kube._convert import ConversionError, to_model
from pyprovlib.kube._errors import ApiException, api_error_text
from pyprovlib.kube._events import EVENT_TYPE_NORMAL, EVENT_TYPE_WARNING
from pyprovlib.kube._objects import Obj, as_mapping, name_of, namespace_of, spec_of, uid_of
from pyprovlib.kube._quantity import Quantity
from pyprovlib.kube._store import Indexer

__all__ = ["ResizeSync"]


@dataclass(eq=False, kw_only=True)
class ResizeSync:
    """Syncs one claim at a time for the resizer ``resizer`` named ``name``, reading claims,
    volumes, classes (and pods, with ``handle_volume_in_use_error``) from the controller's
    caches and writing through ``writes``.

    The bookkeeping of failures is kept here, by claim key, and dropped by :meth:`forget`.
    """

    resizer: Resizer
    name: str
    options: ResizeControllerOptions
    claims: Indexer
    volumes: Indexer
    classes: Indexer
    pods: Indexer | None
    """The pod cache, indexed by the claims they use (with ``handle_volume_in_use_error``)."""
    writes: ResizeStatusWriter
    clock: Clock
    log: Any
    # Claims whose last expansion failed with a final error: the user's current request may
    # replace the size being allocated (upstream's finalErrorPVCs).
    _final_errors: set[str] = field(default_factory=set, init=False)
    # Claims whose expansion was infeasible, with when: retried at the same size only after
    # retry_interval_max (upstream's slowSet).
    _slow: dict[str, float] = field(default_factory=dict, init=False)
    # Claims the backend refused to expand while in use (upstream's inUsePVCStore).
    _in_use_errors: set[str] = field(default_factory=set, init=False)

    def forget(self, key: str) -> None:
        """The claim ``key`` was deleted: drop what is remembered about it."""
        self._final_errors.discard(key)
        self._slow.pop(key, None)
        self._in_use_errors.discard(key)

    async def sync_claim(self, key: str) -> None:
        """Look at the claim ``key`` (``namespace/name``) and expand its volume if it asks for
        more (upstream's ``syncPVC``); raises when it must be retried."""
        pvc = self.claims.get_by_key(key)
        if pvc is None:
            self.log.debug("claim is deleted or does not exist", claim=key)
            return
        volume_name = spec_of(pvc).get("volumeName")
        if not isinstance(volume_name, str) or not volume_name:
            return
        pv = self.volumes.get_by_key(volume_name)
        if pv is None:
            self.log.info("PersistentVolume bound to claim not found", claim=key, pv=volume_name)
            return
        if not claim_needs_resize(pvc):
            return
        volume = self._may_expand(pvc, pv)
        if volume is None:
            return
        await self.expand_and_recover(pvc, pv, volume)

    def _may_expand(self, pvc: Obj, pv: Obj) -> V1PersistentVolume | None:
        """The volume ``pv`` as the model the resizer receives when this resizer should
        expand it for ``pvc``, else None; refusals the user should know about are reported as
        events.

        The conversion happens here, once per look at a claim that wants to grow, and its
        model is shared by every call into the resizer that follows (one conversion per call
        into user code, as ``ProvisionOptions``)."""
        key = claim_key(pvc)
        class_name = str(spec_of(pvc).get("storageClassName") or "")
        storage_class = self.classes.get_by_key(class_name) if class_name else None
        ours = storage_class is not None and storage_class.get("provisioner") == self.name
        try:
            volume = to_model(pv, V1PersistentVolume)
        except ConversionError as err:
            # Not retried: the same object fails the same way. A change of the claim (or the
            # resync) looks again.
            self.log.info("cannot read the volume", claim=key, pv=name_of(pv), error=str(err))
            if ours:
                self._cannot_expand(pvc, pv, str(err))
            return None
        if not self.resizer.can_support(volume):
            self.log.debug("resizer does not support the volume", claim=key, pv=name_of(pv))
            if ours:
                self._cannot_expand(pvc, pv, self.resizer.unsupported_reason(volume))
            return None
        claim_ref = as_mapping(spec_of(pv).get("claimRef"))
        if claim_ref.get("namespace") != namespace_of(pvc) or claim_ref.get("uid") != uid_of(pvc):
            self.log.debug("volume is not bound to the claim", claim=key, pv=name_of(pv))
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
            self.log.info("claim may not be expanded", claim=key, why=why)
            self.writes.event(
                pvc,
                EVENT_TYPE_WARNING,
                REASON_VOLUME_RESIZE_FAILED,
                f"{NOT_EXPANDABLE_CLASS}: {why}",
            )
            return None
        return volume

    def _cannot_expand(self, pvc: Obj, pv: Obj, why: str) -> None:
        self.writes.event(
            pvc,
            EVENT_TYPE_WARNING,
            REASON_VOLUME_RESIZE_FAILED,
            f'resizer "{self.name}" cannot expand volume {name_of(pv)}: {why}',
        )

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
            self._slow.setdefault(key, self.clock.monotonic())

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

        with api_error_as_failure(f"marking pvc {key} as resizing failed"):
            pvc = await self.writes.mark_controller_resize_in_progress(pvc, new_size, update_status)

        if key in self._in_use_errors and self._in_use(key):
            message = (
                f"Unable to expand {key} because CSI driver {self.name} only supports offline "
                "expansion and volume is currently in-use"
            )
            self.writes.event(pvc, EVENT_TYPE_WARNING, REASON_VOLUME_RESIZE_FAILED, message)
            raise RuntimeError(message)

        self.writes.event(
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
            self.writes.event(pvc, EVENT_TYPE_WARNING, REASON_VOLUME_RESIZE_FAILED, error_text(err))
            raise

    async def _call_resize(
        self, pvc: Obj, pv: Obj, volume: V1PersistentVolume, new_size: Quantity
    ) -> None:
        """Expand through the resizer and record the outcome (upstream's
        ``callResizeOnPlugin``)."""
        key = claim_key(pvc)
        logger = self.log.bind(claim=key, pv=name_of(pv))
        try:
            result = await self._expand(pv, volume, new_size)
        except Exception as err:
            raise await self._expansion_failed(pvc, pv, err, logger) from None
        self._final_errors.discard(key)
        self._slow.pop(key, None)
        new_capacity = bytes_quantity(result.size)
        logger.info(
            "volume expanded",
            capacity=size_text(new_capacity),
            node_expansion_required=result.node_expansion_required,
        )
        with api_error_as_failure(f'error updating pv "{name_of(pv)}" by resizer'):
            await self.writes.update_pv_capacity(pv, new_capacity)
        with api_error_as_failure(f"mark PVC {key} after expansion failed"):
            if result.node_expansion_required:
                await self.writes.mark_for_pending_node_expansion(pvc)
            else:
                await self.writes.mark_expansion_finished(pvc, new_capacity)

    async def _expansion_failed(
        self, pvc: Obj, pv: Obj, err: Exception, logger: Any
    ) -> ResizeError:
        """Record a failed expansion (the failure bookkeeping, and a final error in the claim's
        status) and return the error that retries the claim."""
        key = claim_key(pvc)
        bug = is_user_bug(err)
        if bug:
            log_user_bug(
                logger, "expansion failed: the resizer raised an unexpected exception", err
            )
        resize_err = (
            err if isinstance(err, ResizeError) else ResizeError(error_text(err), final=False)
        )
        if resize_err.in_use:
            self._in_use_errors.add(key)
        if resize_err.final:
            self._final_errors.add(key)
            if resize_err.infeasible:
                self._slow.setdefault(key, self.clock.monotonic())
            else:
                self._slow.pop(key, None)
            try:
                await self.writes.mark_controller_expansion_failed(
                    pvc, error_text(resize_err), infeasible=resize_err.infeasible
                )
            except ApiException as api_err:
                return ResizeError(
                    f"resizing failed in controller with {error_text(resize_err)} but "
                    f"failed to update PVC {key} with: {api_error_text(api_err)}",
                    code=resize_err.code,
                )
        else:
            self._slow.pop(key, None)
            self._final_errors.discard(key)
        if not bug:  # a bug was logged above, with its traceback
            logger.info("expansion failed", error=error_text(resize_err))
        return ResizeError(
            f'resize volume "{name_of(pv)}" by resizer "{self.name}" failed: '
            f"{error_text(resize_err)}",
            code=resize_err.code,
            final=resize_err.final,
            infeasible=resize_err.infeasible,
            in_use=resize_err.in_use,
        )

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
        if self.pods is None:
            return False
        return bool(self.pods.by_index(POD_PVC_INDEX, key))

    def _slow_contains(self, key: str) -> bool:
        added = self._slow.get(key)
        if added is None:
            return False
        if self.clock.monotonic() - added >= self.options.retry_interval_max:
            del self._slow[key]
            return False
        return True

    def _slow_remaining(self, key: str) -> float:
        added = self._slow.get(key)
        if added is None:
            return 0.0
        return max(0.0, added + self.options.retry_interval_max - self.clock.monotonic())

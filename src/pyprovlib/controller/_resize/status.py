"""The resize controller's writes: the claim's resize conditions,
``status.allocatedResources``/``allocatedResourceStatuses`` and capacity, the
node-expansion-not-required annotation, the PV's new capacity, and the claim's events
(Kubernetes' ``MarkControllerReisizeInProgress`` (sic), ``MarkForFSResize``,
``MarkResizeFinished`` and external-resizer's failure marking).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyprovlib.controller._resize.claims import (
    ANN_NODE_EXPANSION_NOT_REQUIRED,
    CONDITION_CONTROLLER_RESIZE_ERROR,
    CONDITION_FILE_SYSTEM_RESIZE_PENDING,
    CONDITION_RESIZING,
    PENDING_MESSAGE,
    REASON_FILE_SYSTEM_RESIZE_REQUIRED,
    REASON_VOLUME_RESIZE_SUCCESSFUL,
    STATUS_CONTROLLER_RESIZE_IN_PROGRESS,
    STATUS_CONTROLLER_RESIZE_INFEASIBLE,
    STATUS_NODE_RESIZE_PENDING,
    STORAGE,
    claim_key,
    conditions_of,
    merge_resize_conditions,
    size_text,
)
from pyprovlib.controller._volume_store import event_target
from pyprovlib.kube._clock import Clock
from pyprovlib.kube._events import EVENT_TYPE_NORMAL, EventRecorder
from pyprovlib.kube._objects import (
    Obj,
    annotations_of,
    as_mapping,
    meta,
    name_of,
    namespace_of,
    status_of,
)
from pyprovlib.kube._quantity import Quantity
from pyprovlib.kube._rest import ResourceClient

__all__ = ["ClaimWriter", "ResizeStatusWriter"]


@dataclass(eq=False, kw_only=True)
class ClaimWriter:
    """What the writers of external-resizer's two controllers (resize and modify) share:
    claims are written through ``pvcs``, volumes through ``pvs``, events on the claim through
    ``recorder``, conditions carry the times of ``clock``, and ``log`` is the controller's
    logger."""

    pvcs: ResourceClient
    pvs: ResourceClient
    recorder: EventRecorder
    clock: Clock
    log: Any

    def event(self, pvc: Obj, type_: str, reason: str, message: str) -> None:
        """Record an event of ``type_`` and ``reason`` on the claim ``pvc``."""
        self.recorder.event(event_target(pvc, "PersistentVolumeClaim"), type_, reason, message)

    def _now(self) -> str:
        """Now, as a condition's times are written."""
        return self.clock.now().strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(eq=False, kw_only=True)
class ResizeStatusWriter(ClaimWriter):
    """Writes a claim's resize status through ``pvcs``, a volume's capacity through ``pvs``,
    and events through ``recorder``."""

    def _condition(self, kind: str, message: str = "") -> Obj:
        condition: Obj = {
            "type": kind,
            "status": "True",
            "lastProbeTime": None,
            "lastTransitionTime": self._now(),
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
        return await self.pvcs.patch(
            name_of(pvc), body, namespace=namespace_of(pvc), subresource="status"
        )

    async def mark_controller_resize_in_progress(
        self, pvc: Obj, new_size: Quantity, update_status: bool
    ) -> Obj:
        conditions = merge_resize_conditions(
            conditions_of(pvc),
            [self._condition(CONDITION_RESIZING)],
            keep_old_resize_conditions=not update_status,
        )
        status: Obj = {
            "conditions": conditions,
            "allocatedResources": {STORAGE: size_text(new_size)},
        }
        if update_status:
            status["allocatedResourceStatuses"] = {STORAGE: STATUS_CONTROLLER_RESIZE_IN_PROGRESS}
        return await self._patch_claim(pvc, status, annotation=False, check_resource_version=True)

    async def mark_controller_expansion_failed(
        self, pvc: Obj, message: str, *, infeasible: bool
    ) -> Obj:
        # No resourceVersion check (as upstream): the failure must be recorded even when our
        # copy of the claim is slightly old, or the whole operation would have to start over.
        conditions = merge_resize_conditions(
            conditions_of(pvc),
            [
                self._condition(
                    CONDITION_CONTROLLER_RESIZE_ERROR, f"failed to expand pvc with {message}"
                )
            ],
            keep_old_resize_conditions=True,
        )
        status: Obj = {"conditions": conditions}
        if infeasible:
            status["allocatedResourceStatuses"] = {STORAGE: STATUS_CONTROLLER_RESIZE_INFEASIBLE}
        return await self._patch_claim(pvc, status, annotation=None, check_resource_version=False)

    async def mark_for_pending_node_expansion(self, pvc: Obj) -> Obj:
        conditions = merge_resize_conditions(
            conditions_of(pvc),
            [self._condition(CONDITION_FILE_SYSTEM_RESIZE_PENDING, PENDING_MESSAGE)],
            keep_old_resize_conditions=True,
        )
        status: Obj = {
            "conditions": conditions,
            "allocatedResourceStatuses": {STORAGE: STATUS_NODE_RESIZE_PENDING},
        }
        updated = await self._patch_claim(
            pvc, status, annotation=False, check_resource_version=True
        )
        self.log.info("claim needs a file system resize on the node", claim=claim_key(pvc))
        self.event(
            pvc,
            EVENT_TYPE_NORMAL,
            REASON_FILE_SYSTEM_RESIZE_REQUIRED,
            "Require file system resize of volume on node",
        )
        return updated

    async def mark_expansion_finished(self, pvc: Obj, new_size: Quantity) -> Obj:
        conditions = merge_resize_conditions(
            conditions_of(pvc), [], keep_old_resize_conditions=False
        )
        status: Obj = {"capacity": {STORAGE: size_text(new_size)}, "conditions": conditions}
        statuses = as_mapping(status_of(pvc).get("allocatedResourceStatuses"))
        if STORAGE in statuses:
            # JSON merge patch: null removes the key, or the whole map when nothing else is in it.
            status["allocatedResourceStatuses"] = {STORAGE: None} if len(statuses) > 1 else None
        updated = await self._patch_claim(pvc, status, annotation=True, check_resource_version=True)
        self.log.info("claim expansion finished", claim=claim_key(pvc))
        self.event(
            pvc, EVENT_TYPE_NORMAL, REASON_VOLUME_RESIZE_SUCCESSFUL, "Resize volume succeeded"
        )
        return updated

    async def update_pv_capacity(self, pv: Obj, capacity: Quantity) -> Obj:
        body: Obj = {"spec": {"capacity": {STORAGE: size_text(capacity)}}}
        return await self.pvs.patch(name_of(pv), body)

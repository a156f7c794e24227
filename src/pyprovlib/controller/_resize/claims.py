"""What the resize controller reads from claims and volumes: the reasons, conditions,
statuses and annotations of an expansion (Kubernetes' and external-resizer's names), the
claim's sizes and resize state, and the decisions made from them alone —
:func:`claim_needs_resize`, :func:`should_enqueue_pvc_change`,
:func:`merge_resize_conditions` and :func:`expansion_target` (upstream's ``expandAndRecover``
choice of size). Pure functions over the cached JSON; nothing here writes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from pyprovlib.kube._objects import (
    Obj,
    annotations_of,
    as_mapping,
    meta,
    name_of,
    namespace_of,
    spec_of,
    status_of,
)
from pyprovlib.kube._quantity import Format, Quantity, quantity_or_none

__all__ = [
    "ANN_NODE_EXPANSION_NOT_REQUIRED",
    "ANN_STORAGE_RESIZER",
    "CONDITION_CONTROLLER_RESIZE_ERROR",
    "CONDITION_FILE_SYSTEM_RESIZE_PENDING",
    "CONDITION_NODE_RESIZE_ERROR",
    "CONDITION_RESIZING",
    "REASON_FILE_SYSTEM_RESIZE_REQUIRED",
    "REASON_RESIZING",
    "REASON_VOLUME_RESIZE_FAILED",
    "REASON_VOLUME_RESIZE_SUCCESSFUL",
    "STATUS_CONTROLLER_RESIZE_INFEASIBLE",
    "STATUS_CONTROLLER_RESIZE_IN_PROGRESS",
    "STATUS_NODE_RESIZE_INFEASIBLE",
    "STATUS_NODE_RESIZE_IN_PROGRESS",
    "STATUS_NODE_RESIZE_PENDING",
    "claim_needs_resize",
    "expansion_target",
    "merge_resize_conditions",
    "should_enqueue_pvc_change",
]

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
RESIZE_CONDITIONS: Final = frozenset(
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

STORAGE: Final = "storage"
PENDING_MESSAGE: Final = (
    "Waiting for user to (re-)start a pod to finish file system resize of volume on node."
)
NOT_EXPANDABLE_CLASS: Final = (
    "only dynamically provisioned pvc can be resized and the storageclass that provisions the "
    "pvc must support resize"
)
POD_PVC_INDEX: Final = "resizer-pvc"
TERMINAL_POD_PHASES: Final = frozenset({"Succeeded", "Failed"})


# -- readers ------------------------------------------------------------------------------------


def request_of(pvc: Mapping[str, Any]) -> Quantity | None:
    requests = as_mapping(as_mapping(spec_of(pvc).get("resources")).get("requests"))
    return quantity_or_none(requests.get(STORAGE))


def claim_capacity(pvc: Mapping[str, Any]) -> Quantity | None:
    return quantity_or_none(as_mapping(status_of(pvc).get("capacity")).get(STORAGE))


def pv_capacity(pv: Mapping[str, Any]) -> Quantity | None:
    return quantity_or_none(as_mapping(spec_of(pv).get("capacity")).get(STORAGE))


def allocated_of(pvc: Mapping[str, Any]) -> Quantity | None:
    return quantity_or_none(as_mapping(status_of(pvc).get("allocatedResources")).get(STORAGE))


def resize_status_of(pvc: Mapping[str, Any]) -> str:
    value = as_mapping(status_of(pvc).get("allocatedResourceStatuses")).get(STORAGE)
    return value if isinstance(value, str) else ""


def conditions_of(pvc: Mapping[str, Any]) -> list[Obj]:
    raw = status_of(pvc).get("conditions")
    return [dict(c) for c in raw if isinstance(c, Mapping)] if isinstance(raw, list) else []


def has_fs_resize_pending(pvc: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") == CONDITION_FILE_SYSTEM_RESIZE_PENDING and c.get("status") == "True"
        for c in conditions_of(pvc)
    )


def size_text(q: Quantity) -> str:
    return str(q)


def bytes_quantity(size: int) -> Quantity:
    return Quantity.from_int(size, Format.BINARY_SI)


def claim_key(pvc: Mapping[str, Any]) -> str:
    return f"{namespace_of(pvc)}/{name_of(pvc)}"


def cmp_quantities(a: Quantity | None, b: Quantity | None) -> int:
    """``Quantity.Cmp`` where a missing quantity is zero."""
    an = a.nanos if a is not None else 0
    bn = b.nanos if b is not None else 0
    return (an > bn) - (an < bn)


def claim_needs_resize(pvc: Mapping[str, Any]) -> bool:
    """A Bound claim with a volume that requests more than its ``status.capacity``
    (upstream's ``pvcNeedResize``)."""
    if status_of(pvc).get("phase") != "Bound" or not spec_of(pvc).get("volumeName"):
        return False
    return cmp_quantities(request_of(pvc), claim_capacity(pvc)) > 0


def should_enqueue_pvc_change(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether an update of a claim needs a look (upstream's ``updatePVC``): its request
    changed, the resizer annotation changed, a resync (same resourceVersion), or its capacity
    grew. Other updates (labels, our own status writes) are ignored.

    Upstream only reacts to a *grown* request; a lowered one (recovery from a failed expansion)
    is also taken here so the user's correction is acted on at once instead of at the next
    retry of the failed claim."""
    if cmp_quantities(request_of(new), request_of(old)) != 0:
        return True
    if annotations_of(new).get(ANN_STORAGE_RESIZER) != annotations_of(old).get(ANN_STORAGE_RESIZER):
        return True
    if meta(new).get("resourceVersion") == meta(old).get("resourceVersion"):
        return True
    return cmp_quantities(claim_capacity(new), claim_capacity(old)) > 0


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
        if kind not in RESIZE_CONDITIONS:
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
    spec_size = request_of(pvc)
    if spec_size is None:
        return None
    pv_size = pv_capacity(pv)
    resize_status = resize_status_of(pvc)
    allocated = allocated_of(pvc)
    new_size = spec_size
    if cmp_quantities(pv_size, spec_size) < 0:
        # The volume is smaller than asked: expand, but let an expansion that may still be
        # running finish at its size first.
        if resize_status == STATUS_NODE_RESIZE_INFEASIBLE:
            new_size = allocated if allocated is not None else spec_size
        elif resize_status in (STATUS_NODE_RESIZE_PENDING, STATUS_NODE_RESIZE_IN_PROGRESS):
            new_size = allocated if allocated is not None else spec_size
            if cmp_quantities(pv_size, new_size) >= 0:
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
            if has_fs_resize_pending(pvc):
                return None
            new_size = spec_size
    return new_size


def pod_claims(pod: Obj) -> list[str]:
    """``namespace/claim`` of every claim a pod that has not terminated uses (upstream's
    ``inUsePVCStore``)."""
    if status_of(pod).get("phase") in TERMINAL_POD_PHASES:
        return []
    namespace = namespace_of(pod)
    claims: list[str] = []
    for volume in spec_of(pod).get("volumes") or ():
        claim = as_mapping(as_mapping(volume).get("persistentVolumeClaim")).get("claimName")
        if isinstance(claim, str) and claim:
            claims.append(f"{namespace}/{claim}")
    return claims

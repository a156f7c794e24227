"""What the modify controller reads from claims: the names of a modification (Kubernetes'
statuses and condition types, external-resizer's event reasons and parameter keys), the
claim's class fields, and the decisions made from them alone — :func:`should_enqueue` (which
claim updates need a look) and :func:`next_step` (external-resizer's ``modify``: what to do
with a claim now). Pure functions over the cached JSON; nothing here writes.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any, Final

from pyprovlib.kube._objects import (
    Obj,
    as_mapping,
    meta,
    name_of,
    namespace_of,
    spec_of,
    status_of,
)

__all__ = [
    "CONDITION_MODIFYING_VOLUME",
    "CONDITION_MODIFY_VOLUME_ERROR",
    "MODIFY_CONDITIONS",
    "PVC_NAMESPACE_KEY",
    "PVC_NAME_KEY",
    "PV_NAME_KEY",
    "REASON_VOLUME_MODIFY",
    "REASON_VOLUME_MODIFY_CANCELED",
    "REASON_VOLUME_MODIFY_FAILED",
    "REASON_VOLUME_MODIFY_NOT_SUPPORTED",
    "REASON_VOLUME_MODIFY_SUCCESSFUL",
    "STATUS_INFEASIBLE",
    "STATUS_IN_PROGRESS",
    "STATUS_PENDING",
    "Step",
    "next_step",
    "should_enqueue",
]

STATUS_PENDING: Final = "Pending"
"""``status.modifyVolumeStatus.status`` while the claim's class does not exist (yet)."""
STATUS_IN_PROGRESS: Final = "InProgress"
"""``status.modifyVolumeStatus.status`` while the volume is being modified, or may be."""
STATUS_INFEASIBLE: Final = "Infeasible"
"""``status.modifyVolumeStatus.status`` after the driver refused the parameters as invalid;
another class (or the current one back) resolves it."""

CONDITION_MODIFYING_VOLUME: Final = "ModifyingVolume"
"""Claim condition while a modification is under way (or waits for a retry)."""
CONDITION_MODIFY_VOLUME_ERROR: Final = "ModifyVolumeError"
"""Claim condition with the driver's last error: its gRPC code as reason, its message."""
MODIFY_CONDITIONS: Final = frozenset({CONDITION_MODIFYING_VOLUME, CONDITION_MODIFY_VOLUME_ERROR})
"""The claim conditions of a modification: ``ModifyingVolume`` and ``ModifyVolumeError``."""

REASON_VOLUME_MODIFY: Final = "VolumeModify"
"""Normal event: the resizer starts modifying the volume."""
REASON_VOLUME_MODIFY_SUCCESSFUL: Final = "VolumeModifySuccessful"
"""Normal event: the volume has the class's attributes."""
REASON_VOLUME_MODIFY_FAILED: Final = "VolumeModifyFailed"
"""Warning event: the modification failed, or the class does not exist."""
REASON_VOLUME_MODIFY_CANCELED: Final = "VolumeModifyCanceled"
"""Normal event: the user took the class back before the modification was done (spelled as
external-resizer spells it)."""
REASON_VOLUME_MODIFY_NOT_SUPPORTED: Final = "VolumeModifyNotSupported"
"""Warning event: the claim asks for another class but the driver cannot modify volumes."""

PVC_NAME_KEY: Final = "csi.storage.k8s.io/pvc/name"
"""Parameter added with ``extra_modify_metadata``: the claim's name."""
PVC_NAMESPACE_KEY: Final = "csi.storage.k8s.io/pvc/namespace"
"""Parameter added with ``extra_modify_metadata``: the claim's namespace."""
PV_NAME_KEY: Final = "csi.storage.k8s.io/pv/name"
"""Parameter added with ``extra_modify_metadata``: the volume's name."""

VAC_INDEX: Final = "modify-vac"
"""Claims by the class their spec names (to look again at the claims waiting for a class
when it is created)."""

VAC: Final = "volumeAttributesClassName"
CURRENT: Final = "currentVolumeAttributesClassName"
MODIFY_STATUS: Final = "modifyVolumeStatus"
TARGET: Final = "targetVolumeAttributesClassName"


# -- readers ------------------------------------------------------------------------------------


def claim_key(pvc: Mapping[str, Any]) -> str:
    return f"{namespace_of(pvc)}/{name_of(pvc)}"


def spec_class(obj: Mapping[str, Any]) -> str | None:
    """The class a claim (or volume) names; None when unset."""
    value = spec_of(obj).get(VAC)
    return value if isinstance(value, str) else None


def current_class(pvc: Mapping[str, Any]) -> str | None:
    """``status.currentVolumeAttributesClassName``; None when unset."""
    value = status_of(pvc).get(CURRENT)
    return value if isinstance(value, str) else None


def modify_status(pvc: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """``status.modifyVolumeStatus``; None when unset (nothing pending)."""
    value = status_of(pvc).get(MODIFY_STATUS)
    return value if isinstance(value, Mapping) else None


def target_class(pvc: Mapping[str, Any]) -> str:
    """``status.modifyVolumeStatus.targetVolumeAttributesClassName`` ("" when unset)."""
    return str(as_mapping(modify_status(pvc)).get(TARGET) or "")


def conditions_of(pvc: Mapping[str, Any]) -> list[Obj]:
    raw = status_of(pvc).get("conditions")
    return [dict(c) for c in raw if isinstance(c, Mapping)] if isinstance(raw, list) else []


def has_condition(pvc: Mapping[str, Any], kind: str) -> bool:
    return any(c.get("type") == kind for c in conditions_of(pvc))


def claims_by_class(pvc: Obj) -> list[str]:
    """Index function: the class a claim's spec names (none when unset or "")."""
    name = spec_class(pvc)
    return [name] if name else []


# -- decisions ----------------------------------------------------------------------------------


def should_enqueue(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether an update of a claim needs a look: its class changed (to another, or taken
    back), it became Bound, or a resync (same resourceVersion). Our own status writes and
    everything else are ignored.

    Upstream only takes a change to a non-empty class of a claim already Bound; a claim whose
    class is taken back to nothing (the rollback of a failed change), or that binds, is taken
    here at once instead of at the next resync."""
    if spec_class(old) != spec_class(new):
        return True
    if status_of(old).get("phase") != "Bound" and status_of(new).get("phase") == "Bound":
        return True
    return bool(meta(new).get("resourceVersion") == meta(old).get("resourceVersion"))


class Step(enum.Enum):
    """What to do with a claim now (see :func:`next_step`)."""

    NOTHING = "nothing"
    """The volume has the class asked for and nothing is pending."""
    ROLLED_BACK = "rolled back"
    """The class was taken back to nothing while no modification was running: stop (and say
    the modification was cancelled, when one had been started)."""
    CONTINUE = "continue"
    """Finish the modification towards the status's target, whatever the spec says now: it
    may be running in the driver (an uncertain error), or the spec names no class."""
    START = "start"
    """Modify the volume towards the class the spec names (validated, marked InProgress)."""


def next_step(pvc: Mapping[str, Any], *, uncertain: bool) -> Step:
    """external-resizer's ``modify`` decision for a Bound claim of ours. ``uncertain``: the
    last call for this claim ended with an error that leaves the outcome open (not final), so
    the driver may still be applying the status's target."""
    spec = spec_class(pvc) or ""
    current = current_class(pvc) or ""
    status = modify_status(pvc)
    if status is None and spec == current:
        return Step.NOTHING
    in_progress = status is not None and status.get("status") == STATUS_IN_PROGRESS
    if not spec and not in_progress:
        return Step.ROLLED_BACK
    # An InProgress status not in the uncertain set: the last call ended with a final error,
    # or someone else wrote the status. The spec's class is tried, as if it were certain.
    if (in_progress and uncertain) or not spec:
        return Step.CONTINUE
    return Step.START

"""The modify controller's writes (external-resizer's ``modify_status.go``): the claim's
``status.modifyVolumeStatus`` and ``ModifyingVolume``/``ModifyVolumeError`` conditions, the
completion (the volume's ``spec.volumeAttributesClassName``, then the claim's
``status.currentVolumeAttributesClassName``), and the claim's events.

Claims are written with strategic merge patches, as upstream: the conditions merge by type, so
the resize controller's and kubelet's conditions written meanwhile are never lost. The marks
that start or judge a modification carry the claim's resourceVersion (a 409 means a newer claim
to look at first); the completion does not, so a success is recorded even from an older copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from pyprovlib._modifier import ModifyError
from pyprovlib.controller._modify.claims import (
    CONDITION_MODIFY_VOLUME_ERROR,
    CONDITION_MODIFYING_VOLUME,
    CURRENT,
    MODIFY_STATUS,
    STATUS_PENDING,
    TARGET,
    VAC,
    conditions_of,
    target_class,
)
from pyprovlib.controller._resize.status import ClaimWriter
from pyprovlib.kube._objects import Obj, meta, name_of, namespace_of

__all__ = ["GO_CODE_NAMES", "ModifyStatusWriter", "code_name"]

GO_CODE_NAMES: Final[dict[int, str]] = {
    0: "OK",
    1: "Canceled",
    2: "Unknown",
    3: "InvalidArgument",
    4: "DeadlineExceeded",
    5: "NotFound",
    6: "AlreadyExists",
    7: "PermissionDenied",
    8: "ResourceExhausted",
    9: "FailedPrecondition",
    10: "Aborted",
    11: "OutOfRange",
    12: "Unimplemented",
    13: "Internal",
    14: "Unavailable",
    15: "DataLoss",
    16: "Unauthenticated",
}
"""grpc-go's names of the status codes (``codes.Code.String()``): the ``ModifyVolumeError``
condition's reason."""


def code_name(code: int | None) -> str:
    """grpc-go's name of ``code`` (``Code(N)`` for one it does not know, as grpc-go)."""
    if code is None:
        return "Unknown"
    return GO_CODE_NAMES.get(code, f"Code({code})")


@dataclass(eq=False, kw_only=True)
class ModifyStatusWriter(ClaimWriter):
    """Writes a claim's modification status through ``pvcs``, a volume's class through
    ``pvs``, and events through ``recorder``."""

    def _condition(self, pvc: Obj, kind: str, message: str, reason: str | None = None) -> Obj:
        """A condition of ``kind`` as it is now: probed now, and transitioned now unless the
        claim has it True already (upstream's ``MergePVCConditions``). Every field is
        written (``reason`` null when none), so nothing of an older one of the type is left by
        the merge."""
        now = self._now()
        transitioned = now
        for old in conditions_of(pvc):
            if old.get("type") == kind and old.get("status") == "True":
                transitioned = str(old.get("lastTransitionTime") or now)
        return {
            "type": kind,
            "status": "True",
            "lastProbeTime": now,
            "lastTransitionTime": transitioned,
            "reason": reason,
            "message": message,
        }

    async def _patch_claim(self, pvc: Obj, status: Obj, *, check_resource_version: bool) -> Obj:
        body: Obj = {"status": status}
        if check_resource_version:
            body["metadata"] = {"resourceVersion": meta(pvc).get("resourceVersion")}
        return await self.pvcs.patch(
            name_of(pvc),
            body,
            namespace=namespace_of(pvc),
            subresource="status",
            patch_type="strategic",
        )

    async def mark_pending(self, pvc: Obj) -> Obj:
        """The claim's class does not exist: ``Pending``, with no target and the conditions
        as they are."""
        status: Obj = {MODIFY_STATUS: {"status": STATUS_PENDING, TARGET: None}}
        return await self._patch_claim(pvc, status, check_resource_version=True)

    async def mark_in_progress(self, pvc: Obj, target: str) -> Obj:
        """The modification towards ``target`` starts: ``InProgress`` and ``ModifyingVolume``."""
        status: Obj = {
            MODIFY_STATUS: {"status": "InProgress", TARGET: target},
            "conditions": [
                self._condition(
                    pvc,
                    CONDITION_MODIFYING_VOLUME,
                    f'Modifying volume to "{target}" is in progress.',
                )
            ],
        }
        return await self._patch_claim(pvc, status, check_resource_version=True)

    async def mark_failed(self, pvc: Obj, state: str, err: ModifyError) -> Obj:
        """The driver answered ``err``: ``state`` (InProgress or Infeasible) towards the target
        it was working on, ``ModifyingVolume`` saying whether it still runs, and
        ``ModifyVolumeError`` with the driver's code and message."""
        target = target_class(pvc)
        if err.final:
            progress = f'Modifying volume to "{target}" failed. Waiting for retry.'
        else:
            progress = f'Modifying volume to "{target}" is still in progress.'
        status: Obj = {
            MODIFY_STATUS: {"status": state, TARGET: target},
            "conditions": [
                self._condition(pvc, CONDITION_MODIFYING_VOLUME, progress),
                self._condition(
                    pvc, CONDITION_MODIFY_VOLUME_ERROR, err.detail, reason=code_name(err.code)
                ),
            ],
        }
        return await self._patch_claim(pvc, status, check_resource_version=True)

    async def mark_rolled_back(self, pvc: Obj) -> Obj:
        """The class was taken back before the modification finished: the ``ModifyingVolume``
        condition goes; the status of the last attempt stays, as upstream leaves it."""
        status: Obj = {"conditions": [{"type": CONDITION_MODIFYING_VOLUME, "$patch": "delete"}]}
        return await self._patch_claim(pvc, status, check_resource_version=True)

    async def mark_completed(self, pvc: Obj, pv: Obj, target: str) -> tuple[Obj, Obj]:
        """The volume has ``target``'s attributes: the volume's class first (so a claim never
        says more than its volume), then the claim's current class, no modify status and no
        modify conditions. Returns the claim and the volume as written."""
        updated_pv = await self.pvs.patch(name_of(pv), {"spec": {VAC: target}})
        status: Obj = {
            MODIFY_STATUS: None,
            CURRENT: target,
            "conditions": [
                {"type": kind, "$patch": "delete"}
                for kind in (CONDITION_MODIFYING_VOLUME, CONDITION_MODIFY_VOLUME_ERROR)
            ],
        }
        updated = await self._patch_claim(pvc, status, check_resource_version=False)
        return updated, updated_pv

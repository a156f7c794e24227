"""The attach controller's writes: finalizers on VolumeAttachments and PersistentVolumes, the
node ID annotation, ``status.attached`` and the attach/detach errors — and the record of what
was written, so a cache that has not caught up with our own writes is not mistaken for news.

Invariant of :class:`AttachWriter`'s record: for each VA, the resourceVersions our writes of
the current sync produced, oldest first. A cached VA at one of them but the last is our own
intermediate write; its newer version is on its way through the watch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from pyprovlib._attacher import AttachError
from pyprovlib.controller._attach.resolve import NODE_ID_ANNOTATION, api_error_text, is_attached
from pyprovlib.kube._clock import Clock
from pyprovlib.kube._errors import ApiException, is_not_found
from pyprovlib.kube._objects import Obj, finalizers_of, meta, name_of
from pyprovlib.kube._rest import PatchType, ResourceClient

__all__ = ["AttachWriter"]


@dataclass(eq=False)
class AttachWriter:
    """Writes the attach controller's finalizer ``finalizer`` and VolumeAttachment statuses
    through ``vas`` and ``pvs``, remembering the resourceVersions it wrote."""

    finalizer: str
    _: KW_ONLY
    vas: ResourceClient
    pvs: ResourceClient
    clock: Clock
    log: Any
    _written: dict[str, list[str]] = field(default_factory=dict, init=False)

    # -- the record of our own writes ------------------------------------------------------

    def start_sync(self, name: str) -> None:
        """A sync of the VA ``name`` starts: what the previous one wrote is now in the past."""
        self._written[name] = []

    def forget(self, name: str) -> None:
        """The VA ``name`` is gone."""
        self._written.pop(name, None)

    def is_own_stale_write(self, name: str, va: Mapping[str, Any]) -> bool:
        written = self._written.get(name)
        if not written:
            return False
        rv = meta(va).get("resourceVersion")
        if rv in written[:-1]:
            # The update events of our later writes are on their way and queue the VA again.
            return True
        del self._written[name]
        return False

    def wrote(self, va: Mapping[str, Any]) -> None:
        rv = meta(va).get("resourceVersion")
        if isinstance(rv, str) and rv:
            self._written.setdefault(name_of(va), []).append(rv)

    def add_finalizer_ops(self, obj: Mapping[str, Any]) -> list[Obj]:
        """JSON patch ops adding our finalizer, guarded by a ``test`` op so a concurrent change
        of the list (or of the object when it has none) fails the patch instead of being
        overwritten."""
        current = meta(obj).get("finalizers")
        if isinstance(current, list):
            return [
                {"op": "test", "path": "/metadata/finalizers", "value": current},
                {"op": "add", "path": "/metadata/finalizers/-", "value": self.finalizer},
            ]
        return [
            {
                "op": "test",
                "path": "/metadata/resourceVersion",
                "value": meta(obj).get("resourceVersion"),
            },
            {"op": "add", "path": "/metadata/finalizers", "value": [self.finalizer]},
        ]

    def remove_finalizer_ops(self, obj: Mapping[str, Any]) -> list[Obj]:
        current = finalizers_of(obj)
        index = current.index(self.finalizer)
        path = f"/metadata/finalizers/{index}"
        return [
            {"op": "test", "path": path, "value": self.finalizer},
            {"op": "remove", "path": path},
        ]

    async def add_pv_finalizer(self, pv: Obj) -> Obj:
        if self.finalizer in finalizers_of(pv):
            return pv
        updated = await self.pvs.patch(name_of(pv), self.add_finalizer_ops(pv), patch_type="json")
        self.log.debug("added finalizer to PersistentVolume", pv=name_of(pv))
        return updated

    async def add_va_finalizer_and_node_id(self, va: Obj, node_id: str) -> Obj:
        ops: list[Obj] = []
        if self.finalizer not in finalizers_of(va):
            ops += self.add_finalizer_ops(va)
        annotations = meta(va).get("annotations")
        if not isinstance(annotations, Mapping):
            ops.append(
                {
                    "op": "test",
                    "path": "/metadata/resourceVersion",
                    "value": meta(va).get("resourceVersion"),
                }
            )
            ops.append(
                {
                    "op": "add",
                    "path": "/metadata/annotations",
                    "value": {NODE_ID_ANNOTATION: node_id},
                }
            )
        elif annotations.get(NODE_ID_ANNOTATION) != node_id:
            ops.append(
                {
                    "op": "add",
                    "path": "/metadata/annotations/" + _json_pointer(NODE_ID_ANNOTATION),
                    "value": node_id,
                }
            )
        if not ops:
            return va
        return await self._patch_va(va, ops, "could not save VolumeAttachment", patch_type="json")

    async def mark_as_attached(self, va: Obj, metadata: dict[str, str] | None) -> Obj:
        body = {"status": {"attached": True, "attachmentMetadata": metadata, "attachError": None}}
        return await self._patch_va(va, body, "failed to mark as attached", subresource="status")

    async def _patch_va(
        self,
        va: Obj,
        body: Any,
        failure: str,
        *,
        patch_type: PatchType = "merge",
        subresource: str | None = None,
    ) -> Obj:
        """Patch ``va`` and record the write; an API error becomes an AttachError saying
        ``failure`` and why."""
        try:
            updated = await self.vas.patch(
                name_of(va), body, patch_type=patch_type, subresource=subresource
            )
        except ApiException as err:
            raise AttachError(f"{failure}: {api_error_text(err)}") from None
        self.wrote(updated)
        return updated

    async def mark_as_detached(self, va: Obj) -> None:
        """Remove the finalizer first, then clear the status: a deleted VA without our
        finalizer counts as detached whatever its status says, while the other order would
        leave ``attached=false`` with the finalizer, which forces another detach call."""
        has_finalizer = self.finalizer in finalizers_of(va)
        if not has_finalizer and not is_attached(va):
            return
        try:
            if has_finalizer:
                va = await self.vas.patch(
                    name_of(va), self.remove_finalizer_ops(va), patch_type="json"
                )
                self.wrote(va)
                self.log.debug("removed VolumeAttachment finalizer", va=name_of(va))
            body = {"status": {"attached": False, "detachError": None, "attachmentMetadata": None}}
            self.wrote(await self.vas.patch(name_of(va), body, subresource="status"))
        except ApiException as err:
            if is_not_found(err):
                return  # finalizer gone, the VA went with it
            raise AttachError(f"could not mark as detached: {api_error_text(err)}") from None

    async def save_error(self, va: Obj, field: str, message: str, code: int | None) -> None:
        error: Obj = {"time": _rfc3339(self.clock), "message": message}
        if code is not None:
            error["errorCode"] = code
        self.wrote(
            await self.vas.patch(name_of(va), {"status": {field: error}}, subresource="status")
        )

    async def remove_pv_finalizer(self, pv: Obj) -> None:
        """Remove our finalizer from ``pv`` (guarded: fails when the list changed meanwhile)."""
        await self.pvs.patch(name_of(pv), self.remove_finalizer_ops(pv), patch_type="json")


def _json_pointer(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def _rfc3339(clock: Clock) -> str:
    return clock.now().strftime("%Y-%m-%dT%H:%M:%SZ")

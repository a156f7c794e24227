"""The volume side of the PV binder: pv_controller's ``syncVolume`` (Available, Bound,
Released), ``unbindVolume`` and ``reclaimVolume`` for what exists without in-tree plugins."""

from __future__ import annotations

from collections.abc import Callable

from pyprovlib.kube._objects import Obj, annotations_of, name_of, uid_of
from pyprovlib.testing._binder._objects import (
    ANN_BOUND_BY_CONTROLLER,
    ANN_DYNAMICALLY_PROVISIONED,
    VOLUME_AVAILABLE,
    VOLUME_BOUND,
    VOLUME_FAILED,
    VOLUME_RELEASED,
    ClaimKey,
    as_dict,
    as_str,
    claim_ref,
    copy_obj,
    phase,
    quoted,
    volume_mode,
    volume_name_of_claim,
)
from pyprovlib.testing._binder._writes import BinderApi

__all__ = ["VolumeSync"]


class VolumeSync:
    """syncVolume over the binder's caches; ``enqueue_claim`` hands a claim whose binding the
    claim side must finish back to the queue."""

    def __init__(self, api: BinderApi, enqueue_claim: Callable[[ClaimKey], None]) -> None:
        self.api = api
        self.enqueue_claim = enqueue_claim

    async def sync(self, name: str) -> None:
        api = self.api
        volume = api.volumes.get(name)
        if volume is None:
            return
        ref = claim_ref(volume)
        if ref is None:
            await api.update_volume_phase(volume, VOLUME_AVAILABLE, "")
            return
        ref_ns, ref_name, ref_uid = (
            as_str(ref.get("namespace")),
            as_str(ref.get("name")),
            as_str(ref.get("uid")),
        )
        ref_key = f"{ref_ns}/{ref_name}"
        if not ref_uid:
            # Pre-bound by its creator: the claim's sync finishes the binding.
            await api.update_volume_phase(volume, VOLUME_AVAILABLE, "")
            self.enqueue_claim(ref_key)
            return
        claim = api.claims.get(ref_key)
        if claim is None and phase(volume) not in (VOLUME_RELEASED, VOLUME_FAILED):
            # Under load the claim may not have reached our cache yet: ask the server before
            # declaring the volume released.
            claim = await api.get_claim(ref_ns, ref_name)
        if claim is not None and uid_of(claim) != ref_uid:
            fresh = await api.get_claim(ref_ns, ref_name)
            claim = fresh if fresh is not None and uid_of(fresh) == ref_uid else None
        if claim is None:
            if phase(volume) not in (VOLUME_RELEASED, VOLUME_FAILED):
                volume = await api.update_volume_phase(volume, VOLUME_RELEASED, "")
            await self._reclaim_volume(volume)
            return
        claim_volume = volume_name_of_claim(claim)
        if not claim_volume:
            cspec, vspec = as_dict(claim.get("spec")), as_dict(volume.get("spec"))
            if volume_mode(cspec) != volume_mode(vspec):
                await api.event(
                    volume,
                    "Warning",
                    "VolumeMismatch",
                    f"Cannot bind PersistentVolume to requested PersistentVolumeClaim "
                    f"{quoted(name_of(claim))} due to incompatible volumeMode.",
                )
                await api.event(
                    claim,
                    "Warning",
                    "VolumeMismatch",
                    f"Cannot bind PersistentVolume {quoted(name)} to requested "
                    f"PersistentVolumeClaim due to incompatible volumeMode.",
                )
                return
            # The claim is Pending while the volume points at it: the claim's sync binds it.
            self.enqueue_claim(ref_key)
            return
        if claim_volume == name:
            await api.update_volume_phase(volume, VOLUME_BOUND, "")
            return
        # Bound to a claim that is bound elsewhere.
        spec = as_dict(volume.get("spec"))
        if (
            ANN_DYNAMICALLY_PROVISIONED in annotations_of(volume)
            and spec.get("persistentVolumeReclaimPolicy") == "Delete"
        ):
            if phase(volume) not in (VOLUME_RELEASED, VOLUME_FAILED):
                volume = await api.update_volume_phase(volume, VOLUME_RELEASED, "")
            await self._reclaim_volume(volume)
            return
        await self._unbind_volume(volume)

    async def _unbind_volume(self, volume: Obj) -> None:
        """unbindVolume: a controller-made binding is removed; a user's pre-binding keeps the
        claim's name but loses its uid."""
        updated = copy_obj(volume)
        spec = updated.setdefault("spec", {})
        annotations = updated.setdefault("metadata", {}).setdefault("annotations", {})
        if isinstance(annotations, dict) and ANN_BOUND_BY_CONTROLLER in annotations:
            spec.pop("claimRef", None)
            annotations.pop(ANN_BOUND_BY_CONTROLLER, None)
        elif isinstance(spec.get("claimRef"), dict):
            spec["claimRef"].pop("uid", None)
        volume = await self.api.put_volume(updated)
        await self.api.update_volume_phase(volume, VOLUME_AVAILABLE, "")

    async def _reclaim_volume(self, volume: Obj) -> None:
        """reclaimVolume, for what exists without in-tree plugins: Retain keeps the volume,
        Delete of a volume from an external provisioner waits for that provisioner, anything
        else has no plugin to act and fails like upstream."""
        policy = as_str(as_dict(volume.get("spec")).get("persistentVolumeReclaimPolicy"))
        policy = policy or "Retain"
        if policy == "Retain":
            return
        if policy == "Delete":
            provisioned_by = as_str(annotations_of(volume).get(ANN_DYNAMICALLY_PROVISIONED))
            if provisioned_by and not provisioned_by.startswith("kubernetes.io/"):
                return
            if provisioned_by:
                message = f"no volume plugin matched name: {provisioned_by}"
            else:
                message = (
                    f"error getting deleter volume plugin for volume {quoted(name_of(volume))}: "
                    "no deletable volume plugin matched"
                )
            await self._phase_with_event(volume, VOLUME_FAILED, "VolumeFailedDelete", message)
            return
        if policy == "Recycle":
            await self._phase_with_event(
                volume,
                VOLUME_FAILED,
                "VolumeFailedRecycle",
                "No recycler plugin found for the volume!",
            )
            return
        await self._phase_with_event(
            volume,
            VOLUME_FAILED,
            "VolumeUnknownReclaimPolicy",
            "Volume has unrecognized PersistentVolumeReclaimPolicy",
        )

    async def _phase_with_event(self, volume: Obj, phase_: str, reason: str, message: str) -> None:
        if phase(volume) == phase_:
            return
        volume = await self.api.update_volume_phase(volume, phase_, message)
        await self.api.event(volume, "Warning", reason, message, repeat=False)

"""The claim side of the PV binder: pv_controller's ``syncClaim`` (unbound and bound claims,
the best matching volume, provisioning by an external provisioner, the retroactive default
class) and ``bind`` (volume to claim, then claim to volume)."""

from __future__ import annotations

import asyncio

from kubernetes_asyncio.client.exceptions import ApiException

from pyprovlib.kube._informer import SharedInformer
from pyprovlib.kube._objects import (
    Obj,
    annotations_of,
    is_deleting,
    meta,
    name_of,
    namespace_of,
    resource_version,
    uid_of,
)
from pyprovlib.kube._quantity import Quantity
from pyprovlib.kube._store import IndexFunc
from pyprovlib.testing._binder._objects import (
    ANN_BETA_DEFAULT_STORAGE_CLASS,
    ANN_BETA_STORAGE_PROVISIONER,
    ANN_BIND_COMPLETED,
    ANN_BOUND_BY_CONTROLLER,
    ANN_DEFAULT_STORAGE_CLASS,
    ANN_SELECTED_NODE,
    ANN_STORAGE_PROVISIONER,
    CLAIM_BOUND,
    CLAIM_LOST,
    CLAIM_PENDING,
    VOLUME_AVAILABLE,
    VOLUME_BOUND,
    ClaimKey,
    as_dict,
    as_str,
    attributes_class,
    claim_class,
    claim_has_class,
    claim_key,
    claim_ref,
    claim_ref_key,
    copy_obj,
    phase,
    quoted,
    storage_quantity,
    str_list,
    volume_bound_to_claim,
    volume_class,
    volume_mode,
    volume_name_of_claim,
)
from pyprovlib.testing._binder._writes import BinderApi
from pyprovlib.testing._selectors import label_selector_from_json

__all__ = ["BY_CLAIM_REF", "UNCLAIMED_BY_CLASS", "ClaimSync", "volume_indexers"]

BY_CLAIM_REF = "claimRef"
"""Index of the binder's volume cache: volumes by the ``namespace/name`` their claimRef names."""
UNCLAIMED_BY_CLASS = "unclaimedByClass"
"""Index of the binder's volume cache: volumes without a claimRef by class (static binding
candidates)."""


def _by_claim_ref(volume: Obj) -> list[str]:
    key = claim_ref_key(volume)
    return [] if key is None else [key]


def _unclaimed_by_class(volume: Obj) -> list[str]:
    return [volume_class(volume)] if claim_ref(volume) is None else []


def volume_indexers() -> dict[str, IndexFunc]:
    """The indexes :class:`ClaimSync` looks volumes up by."""
    return {BY_CLAIM_REF: _by_claim_ref, UNCLAIMED_BY_CLASS: _unclaimed_by_class}


class ClaimSync:
    """syncClaim and bind, over the binder's caches (``api.claims``, ``api.volumes``) and the
    StorageClass informer."""

    def __init__(self, api: BinderApi, classes: SharedInformer) -> None:
        self.api = api
        self.classes = classes
        # Static binding picks among shared Available volumes: one claim at a time.
        self._static_bind = asyncio.Lock()

    async def sync(self, key: ClaimKey) -> None:
        claim = self.api.claims.get(key)
        if claim is None:
            return
        if ANN_BIND_COMPLETED not in annotations_of(claim):
            await self._sync_unbound_claim(claim)
        else:
            await self._sync_bound_claim(claim)

    async def _sync_unbound_claim(self, claim: Obj) -> None:
        api = self.api
        volume_name = volume_name_of_claim(claim)
        if not volume_name:
            delay_binding = self._is_delay_binding(claim)
            volume = self._find_best_match(claim, delay_binding)
            if volume is not None and claim_ref(volume) is None:
                async with self._static_bind:
                    # Another claim may have taken it while this one waited: look again.
                    volume = self._find_best_match(claim, delay_binding)
                    if volume is not None:
                        await self._bind(volume, claim)
                        return
            elif volume is not None:
                await self._bind(volume, claim)
                return
            if await self._assign_default_class(claim):
                return
            cls = claim_class(claim)
            if delay_binding and ANN_SELECTED_NODE not in annotations_of(claim):
                await self._pending(
                    claim,
                    "Normal",
                    "WaitForFirstConsumer",
                    "waiting for first consumer to be created before binding",
                )
            elif cls:
                await self._provision_claim(claim, cls)
            else:
                await self._pending(
                    claim,
                    "Normal",
                    "FailedBinding",
                    "no persistent volumes available for this claim and no storage class is set",
                )
            return
        # The user (or an earlier, interrupted binding) asked for a specific volume.
        volume = api.volumes.get(volume_name)
        if volume is None:
            await api.update_claim_status(claim, CLAIM_PENDING, None)
            return
        if claim_ref(volume) is None:
            mismatch = _volume_mismatch(volume, claim)
            if mismatch:
                await self._pending(
                    claim,
                    "Warning",
                    "VolumeMismatch",
                    f"Cannot bind to requested volume {quoted(volume_name)}: {mismatch}",
                )
                return
            await self._bind(volume, claim)
        elif volume_bound_to_claim(volume, claim):
            await self._bind(volume, claim)
        else:
            await api.event(
                claim,
                "Warning",
                "FailedBinding",
                f"volume {quoted(volume_name)} already bound to a different claim.",
            )
            if ANN_BOUND_BY_CONTROLLER in annotations_of(claim):
                # We bound it, yet the volume names another claim: should never happen.
                raise RuntimeError(
                    f"invalid binding of claim {quoted(claim_key(claim))} to volume "
                    f"{quoted(volume_name)}: volume already claimed by "
                    f"{quoted(claim_ref_key(volume))}"
                )
            # The user asked for a volume another claim has.
            await api.update_claim_status(claim, CLAIM_PENDING, None)

    async def _sync_bound_claim(self, claim: Obj) -> None:
        volume_name = volume_name_of_claim(claim)
        if not volume_name:
            await self._claim_status_with_event(
                claim,
                CLAIM_LOST,
                "ClaimLost",
                "Bound claim has lost reference to PersistentVolume. Data on the volume is lost!",
            )
            return
        volume = self.api.volumes.get(volume_name)
        if volume is None:
            await self._claim_status_with_event(
                claim,
                CLAIM_LOST,
                "ClaimLost",
                "Bound claim has lost its PersistentVolume. Data on the volume is lost!",
            )
            return
        ref = claim_ref(volume)
        if ref is None or as_str(ref.get("uid")) == uid_of(claim):
            # Unbound volume (or cache lag) is bound again; a good binding is re-asserted,
            # which writes nothing when everything is already set.
            await self._bind(volume, claim)
            return
        await self._claim_status_with_event(
            claim,
            CLAIM_LOST,
            "ClaimMisbound",
            "Two claims are bound to the same volume, this one is bound incorrectly",
        )

    async def _pending(self, claim: Obj, event_type: str, reason: str, message: str) -> None:
        """Say why in an event, then leave the claim Pending (upstream's order)."""
        await self.api.event(claim, event_type, reason, message)
        await self.api.update_claim_status(claim, CLAIM_PENDING, None)

    async def _claim_status_with_event(
        self, claim: Obj, phase_: str, reason: str, message: str
    ) -> None:
        if phase(claim) == phase_:
            return
        claim = await self.api.update_claim_status(claim, phase_, None)
        await self.api.event(claim, "Warning", reason, message, repeat=False)

    # -- classes -----------------------------------------------------------------------------

    def _storage_class(self, name: str) -> Obj | None:
        return self.classes.store.get_by_key(name)

    def _is_delay_binding(self, claim: Obj) -> bool:
        cls = claim_class(claim)
        if not cls:
            return False
        sc = self._storage_class(cls)
        if sc is None:
            return False
        return as_str(sc.get("volumeBindingMode")) == "WaitForFirstConsumer"

    def _default_class(self) -> Obj | None:
        # GetDefaultClass: the newest default wins; ties by name.
        defaults = [
            sc
            for sc in self.classes.store.list()
            if annotations_of(sc).get(ANN_DEFAULT_STORAGE_CLASS) == "true"
            or annotations_of(sc).get(ANN_BETA_DEFAULT_STORAGE_CLASS) == "true"
        ]
        if not defaults:
            return None
        defaults.sort(key=lambda sc: (as_str(meta(sc).get("creationTimestamp")), name_of(sc)))
        newest = as_str(meta(defaults[-1]).get("creationTimestamp"))
        return min(
            (sc for sc in defaults if as_str(meta(sc).get("creationTimestamp")) == newest),
            key=name_of,
        )

    async def _assign_default_class(self, claim: Obj) -> bool:
        """The retroactive default StorageClass assignment for claims that asked for none."""
        if claim_has_class(claim):
            return False
        default = self._default_class()
        if default is None:
            return False
        updated = copy_obj(claim)
        updated.setdefault("spec", {})["storageClassName"] = name_of(default)
        await self.api.put_claim(updated)
        return True

    # -- matching ----------------------------------------------------------------------------

    def _find_best_match(self, claim: Obj, delay_binding: bool) -> Obj | None:
        """findBestMatchForClaim: a volume pre-bound to the claim first, else (for immediate
        binding) the smallest Available volume of the claim's class that satisfies it."""
        volumes = self.api.volumes
        cspec = as_dict(claim.get("spec"))
        requested = storage_quantity(as_dict(cspec.get("resources")).get("requests"))
        if requested is None:
            requested = Quantity(0)
        claim_modes = set(str_list(cspec.get("accessModes")))
        claim_mode = volume_mode(cspec)
        claim_vac = attributes_class(claim)

        def usable(volume: Obj) -> Quantity | None:
            vspec = as_dict(volume.get("spec"))
            if not claim_modes <= set(str_list(vspec.get("accessModes"))):
                return None
            capacity = storage_quantity(vspec.get("capacity"))
            if capacity is None or capacity < requested:
                return None
            if volume_mode(vspec) != claim_mode or is_deleting(volume):
                return None
            if attributes_class(volume) != claim_vac:
                return None
            return capacity

        for name in sorted(volumes.store.index_keys(BY_CLAIM_REF, claim_key(claim))):
            volume = volumes.get(name)
            if (
                volume is not None
                and volume_bound_to_claim(volume, claim)
                and usable(volume) is not None
            ):
                return volume
        if delay_binding:
            # The scheduler picks static volumes for delayed binding, not this controller.
            return None
        cls = claim_class(claim)
        raw_selector = cspec.get("selector")
        selector = None if raw_selector is None else label_selector_from_json(raw_selector)
        if raw_selector is not None and selector is None:
            return None  # a malformed selector matches nothing
        best: tuple[Quantity, str] | None = None
        for name in volumes.store.index_keys(UNCLAIMED_BY_CLASS, cls):
            volume = volumes.get(name)
            if volume is None or phase(volume) != VOLUME_AVAILABLE:
                continue
            capacity = usable(volume)
            if capacity is None or (selector is not None and not selector.matches(volume)):
                continue
            if best is None or (capacity, name) < best:
                best = (capacity, name)
        return volumes.get(best[1]) if best else None

    # -- provisioning ------------------------------------------------------------------------

    async def _provision_claim(self, claim: Obj, cls: str) -> None:
        """provisionClaim for external provisioners: annotate the claim and say so."""
        api = self.api
        sc = self._storage_class(cls)
        if sc is None:
            await api.event(
                claim,
                "Warning",
                "ProvisioningFailed",
                f'storageclass.storage.k8s.io "{cls}" not found',
            )
            return
        provisioner = as_str(sc.get("provisioner"))
        if provisioner.startswith("kubernetes.io/") or not provisioner:
            # In-tree plugins are not part of this binder; upstream reports an unknown one.
            await api.event(
                claim,
                "Warning",
                "ProvisioningFailed",
                f"no volume plugin matched name: {provisioner}",
            )
            return
        if annotations_of(claim).get(ANN_STORAGE_PROVISIONER) != provisioner:
            updated = copy_obj(claim)
            annotations = updated.setdefault("metadata", {}).setdefault("annotations", {})
            annotations[ANN_BETA_STORAGE_PROVISIONER] = provisioner
            annotations[ANN_STORAGE_PROVISIONER] = provisioner
            try:
                claim = await api.put_claim(updated)
            except ApiException as err:
                await api.event(
                    claim, "Warning", "ProvisioningFailed", f"Error saving claim: {err.reason}"
                )
                raise
        await api.event(
            claim,
            "Normal",
            "ExternalProvisioning",
            f"Waiting for a volume to be created either by the external provisioner "
            f"'{provisioner}' or manually by the system administrator. If volume creation is "
            f"delayed, please verify that the provisioner is running and correctly registered.",
        )

    # -- binding (bind, bindVolumeToClaim, bindClaimToVolume) --------------------------------

    async def _bind(self, volume: Obj, claim: Obj) -> None:
        api = self.api
        volume = await self._bind_volume_to_claim(volume, claim)
        volume = await api.update_volume_phase(volume, VOLUME_BOUND, "")
        claim = await self._bind_claim_to_volume(claim, volume)
        await api.update_claim_status(claim, CLAIM_BOUND, volume)

    async def _bind_volume_to_claim(self, volume: Obj, claim: Obj) -> Obj:
        set_by_controller = not volume_bound_to_claim(volume, claim)
        updated = copy_obj(volume)
        dirty = False
        ref = claim_ref(volume)
        if (
            ref is None
            or as_str(ref.get("name")) != name_of(claim)
            or as_str(ref.get("namespace")) != namespace_of(claim)
            or as_str(ref.get("uid")) != uid_of(claim)
        ):
            updated.setdefault("spec", {})["claimRef"] = {
                "kind": "PersistentVolumeClaim",
                "namespace": namespace_of(claim),
                "name": name_of(claim),
                "uid": uid_of(claim),
                "apiVersion": "v1",
                "resourceVersion": resource_version(claim),
            }
            dirty = True
        if set_by_controller and _annotate_yes(updated, ANN_BOUND_BY_CONTROLLER):
            dirty = True
        if not dirty:
            return volume
        return await self.api.put_volume(updated)

    async def _bind_claim_to_volume(self, claim: Obj, volume: Obj) -> Obj:
        should_bind = volume_name_of_claim(claim) != name_of(volume)
        updated = copy_obj(claim)
        dirty = False
        if should_bind:
            updated.setdefault("spec", {})["volumeName"] = name_of(volume)
            dirty = True
        if should_bind and _annotate_yes(updated, ANN_BOUND_BY_CONTROLLER):
            dirty = True
        if _annotate_yes(updated, ANN_BIND_COMPLETED):
            dirty = True
        if not dirty:
            return claim
        return await self.api.put_claim(updated)


def _annotate_yes(obj: Obj, key: str) -> bool:
    """Add the annotation ``key: "yes"`` to ``obj`` (a copy being prepared for a write) unless
    it has ``key`` already; True when it added it."""
    annotations = obj.setdefault("metadata", {}).setdefault("annotations", {})
    if not isinstance(annotations, dict):
        annotations = obj["metadata"]["annotations"] = {}
    if key in annotations:
        return False
    annotations[key] = "yes"
    return True


def _volume_mismatch(volume: Obj, claim: Obj) -> str:
    """Why ``volume`` cannot satisfy ``claim`` (checkVolumeSatisfyClaim), or ''."""
    if is_deleting(volume):
        return f"the volume is marked for deletion {quoted(name_of(volume))}"
    vspec, cspec = as_dict(volume.get("spec")), as_dict(claim.get("spec"))
    requested = storage_quantity(as_dict(cspec.get("resources")).get("requests"))
    capacity = storage_quantity(vspec.get("capacity"))
    if capacity is None or (requested is not None and capacity < requested):
        return "requested PV is too small"
    if volume_class(volume) != claim_class(claim):
        return "storageClassName does not match"
    if attributes_class(volume) != attributes_class(claim):
        return "volumeAttributesClassName does not match"
    if volume_mode(vspec) != volume_mode(cspec):
        return "incompatible volumeMode"
    if not set(str_list(cspec.get("accessModes"))) <= set(str_list(vspec.get("accessModes"))):
        return "incompatible accessMode"
    return ""

"""Pure decisions over the cached JSON dicts, and the names the provisioning controller shares
with Kubernetes (annotations, the PV finalizer): upstream's helpers of ``controller.go`` and
``util``, each unit-tested on its own. Nothing here holds state or calls the API.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Mapping
from typing import Any, Final

from pyprovlib.controller._provision.errors import ClassNotFoundError
from pyprovlib.controller._volume_store import event_target
from pyprovlib.kube._objects import (
    Obj,
    annotations_of,
    finalizers_of,
    meta,
    name_of,
    namespace_of,
    spec_of,
    uid_of,
)
from pyprovlib.kube._quantity import parse_storage_size

__all__ = [
    "ANN_ALPHA_SELECTED_NODE",
    "ANN_BETA_STORAGE_CLASS",
    "ANN_BETA_STORAGE_PROVISIONER",
    "ANN_DYNAMICALLY_PROVISIONED",
    "ANN_MIGRATED_TO",
    "ANN_SELECTED_NODE",
    "ANN_STORAGE_PROVISIONER",
    "FINALIZER_PV",
    "add_finalizer",
    "claim_is_block",
    "claim_reference",
    "claim_wants_provisioning",
    "complete_volume",
    "desired_finalizers",
    "get_claim_class",
    "is_provisioner_for_volume",
    "remove_finalizer",
    "volume_should_delete",
]

ANN_DYNAMICALLY_PROVISIONED: Final = "pv.kubernetes.io/provisioned-by"
"""Set on every provisioned PV to the provisioner name; deletion keys on it."""
ANN_MIGRATED_TO: Final = "pv.kubernetes.io/migrated-to"
"""Names the CSI driver an in-tree PV was migrated to; deletion honours it too."""
ANN_BETA_STORAGE_PROVISIONER: Final = "volume.beta.kubernetes.io/storage-provisioner"
"""Set by the PV controller on claims it wants provisioned (deprecated form)."""
ANN_STORAGE_PROVISIONER: Final = "volume.kubernetes.io/storage-provisioner"
"""Set by the PV controller on claims it wants provisioned."""
ANN_SELECTED_NODE: Final = "volume.kubernetes.io/selected-node"
"""Set by the scheduler on WaitForFirstConsumer claims: the node the pod goes to."""
ANN_ALPHA_SELECTED_NODE: Final = "volume.alpha.kubernetes.io/selected-node"
"""The Kubernetes 1.11 form of :data:`ANN_SELECTED_NODE`."""
ANN_BETA_STORAGE_CLASS: Final = "volume.beta.kubernetes.io/storage-class"
"""The pre-``spec.storageClassName`` way of naming a claim's class."""
FINALIZER_PV: Final = "external-provisioner.volume.kubernetes.io/finalizer"
"""Keeps a Delete-policy PV around until its asset is deleted (with ``add_finalizer``)."""

EVENT_NORMAL: Final = "Normal"
EVENT_WARNING: Final = "Warning"
WAIT_FOR_FIRST_CONSUMER: Final = "WaitForFirstConsumer"


def _status_phase(obj: Mapping[str, Any]) -> str:
    status = obj.get("status")
    phase = status.get("phase") if (type(status) is dict or isinstance(status, Mapping)) else None
    return phase if isinstance(phase, str) else ""


def get_claim_class(claim: Mapping[str, Any]) -> str:
    """The claim's class: the beta annotation if present, else ``spec.storageClassName``
    (upstream's ``GetPersistentVolumeClaimClass``); '' for none."""
    ann = annotations_of(claim).get(ANN_BETA_STORAGE_CLASS)
    if isinstance(ann, str):
        return ann
    name = spec_of(claim).get("storageClassName")
    return name if isinstance(name, str) else ""


def claim_is_block(claim: Mapping[str, Any]) -> bool:
    """True when the claim asks for a raw block volume (``volumeMode: Block``)."""
    return spec_of(claim).get("volumeMode") == "Block"


def is_known(name: object, names: Collection[str]) -> bool:
    """Whether ``name`` is a non-empty string among ``names``."""
    return isinstance(name, str) and bool(name) and name in names


def requested_provisioner(claim: Mapping[str, Any]) -> object:
    """The provisioner a claim's storage-provisioner annotation names (GA, else beta)."""
    annotations = annotations_of(claim)
    provisioner = annotations.get(ANN_STORAGE_PROVISIONER)
    if provisioner is None:
        provisioner = annotations.get(ANN_BETA_STORAGE_PROVISIONER)
    return provisioner


def claim_wants_provisioning(
    claim: Mapping[str, Any],
    storage_class: Mapping[str, Any] | None,
    names: Collection[str],
) -> bool:
    """Whether ``claim`` asks one of ``names`` to provision it (upstream's ``shouldProvision``
    minus the Qualifier): not bound yet, the storage-provisioner annotation (GA, else beta)
    names one of ``names``, and for a ``WaitForFirstConsumer`` class a node was selected.

    ``storage_class`` is the claim's class from the cache, None when it does not exist, which
    raises :class:`ClassNotFoundError` for a claim meant for us.
    """
    if spec_of(claim).get("volumeName"):
        return False
    if not is_known(requested_provisioner(claim), names):
        return False
    annotations = annotations_of(claim)
    if storage_class is None:
        raise ClassNotFoundError(get_claim_class(claim))
    if storage_class.get("volumeBindingMode") == WAIT_FOR_FIRST_CONSUMER:
        # The PV controller only annotates such claims once a node is selected, but a
        # provisioner may have removed the node again to have the scheduler pick another.
        return bool(annotations.get(ANN_SELECTED_NODE))
    return True


def is_provisioner_for_volume(volume: Mapping[str, Any], names: Collection[str]) -> bool:
    """Whether a PV is this provisioner's to manage (upstream's ``isProvisionerForVolume``):
    provisioned by one of ``names`` (or migrated to one), or, when statically created, a CSI
    volume of one of ``names`` or an in-tree volume migrated to one."""
    annotations = annotations_of(volume)
    migrated = annotations.get(ANN_MIGRATED_TO)
    if ANN_DYNAMICALLY_PROVISIONED in annotations:
        return is_known(annotations.get(ANN_DYNAMICALLY_PROVISIONED), names) or is_known(
            migrated, names
        )
    csi = spec_of(volume).get("csi")
    if isinstance(csi, Mapping):
        return is_known(csi.get("driver"), names)
    return is_known(migrated, names)


def volume_should_delete(volume: Mapping[str, Any], add_finalizer: bool) -> bool:
    """Upstream's ``shouldDelete`` without the DeletionGuard: Released, reclaim policy Delete,
    and not already being deleted — except that with ``add_finalizer`` a PV being deleted but
    still holding our finalizer must still have its asset deleted."""
    deleting = meta(volume).get("deletionTimestamp") is not None
    if add_finalizer:
        if deleting and FINALIZER_PV not in finalizers_of(volume):
            return False
    elif deleting:
        return False
    if _status_phase(volume) != "Released":
        return False
    return spec_of(volume).get("persistentVolumeReclaimPolicy") == "Delete"


def add_finalizer(finalizers: list[str] | None, finalizer: str) -> tuple[list[str], bool]:
    """``finalizers`` with ``finalizer`` appended (a new list), and whether it was added."""
    current = list(finalizers or [])
    if finalizer in current:
        return current, False
    return [*current, finalizer], True


def remove_finalizer(finalizers: list[str] | None, finalizer: str) -> tuple[list[str] | None, bool]:
    """``finalizers`` without ``finalizer`` (a new list, None when empty), and whether it was
    there. The input is not modified."""
    original = list(finalizers or [])
    kept = [f for f in original if f != finalizer]
    return (kept or None), len(kept) != len(original)


def desired_finalizers(volume: Mapping[str, Any], add_finalizer_enabled: bool) -> list[str] | None:
    """The finalizers ``volume`` should have under upstream's ``handleProtectionFinalizer``, or
    None when they are right as they are: add ours to a Bound, Delete-policy PV not being
    deleted (with ``add_finalizer``); remove it when the option is off or the policy is Retain
    or Recycle."""
    finalizers = finalizers_of(volume)
    policy = spec_of(volume).get("persistentVolumeReclaimPolicy")
    deleting = meta(volume).get("deletionTimestamp") is not None
    if (
        add_finalizer_enabled
        and policy == "Delete"
        and not deleting
        and _status_phase(volume) == "Bound"
    ):
        updated, changed = add_finalizer(finalizers, FINALIZER_PV)
        return updated if changed else None
    if not add_finalizer_enabled or policy in ("Retain", "Recycle"):
        removed, changed = remove_finalizer(finalizers, FINALIZER_PV)
        return (removed or []) if changed else None
    return None


def claim_reference(claim: Mapping[str, Any]) -> Obj:
    """An ObjectReference to ``claim`` with its UID and resourceVersion (``ref.GetReference``)."""
    ref: Obj = {
        "kind": "PersistentVolumeClaim",
        "apiVersion": "v1",
        "namespace": namespace_of(claim),
        "name": name_of(claim),
        "uid": uid_of(claim),
    }
    rv = meta(claim).get("resourceVersion")
    if rv:
        ref["resourceVersion"] = str(rv)
    return ref


def complete_volume(
    volume: Obj,
    *,
    claim: Mapping[str, Any],
    storage_class: Mapping[str, Any],
    add_finalizer_enabled: bool,
) -> Obj:
    """Fill in what the controller owns on a provisioned PV (modifies and returns ``volume``):
    claimRef, ``pv.kubernetes.io/provisioned-by`` (the class's provisioner), storageClassName,
    the finalizer with ``add_finalizer``, and — where the provisioner left them empty — the
    class's reclaim policy (Delete by default) and mount options."""
    metadata = volume.setdefault("metadata", {})
    spec = volume.setdefault("spec", {})
    spec["claimRef"] = claim_reference(claim)
    if add_finalizer_enabled:
        finalizers, _ = add_finalizer(metadata.get("finalizers"), FINALIZER_PV)
        metadata["finalizers"] = finalizers
    annotations = metadata.get("annotations")
    if not isinstance(annotations, dict):
        annotations = metadata["annotations"] = {}
    annotations[ANN_DYNAMICALLY_PROVISIONED] = str(storage_class.get("provisioner", ""))
    spec["storageClassName"] = get_claim_class(claim)
    if not spec.get("persistentVolumeReclaimPolicy"):
        spec["persistentVolumeReclaimPolicy"] = storage_class.get("reclaimPolicy") or "Delete"
    mount_options = storage_class.get("mountOptions")
    if not spec.get("mountOptions") and mount_options:
        spec["mountOptions"] = list(mount_options)
    return volume


# -- small readers shared by the claim and volume sides ------------------------------------------


def claim_target(claim: Obj) -> Obj:
    """``claim`` as an event target (with its kind and apiVersion)."""
    return event_target(claim, "PersistentVolumeClaim")


def default_volume_name(claim: Mapping[str, Any]) -> str:
    """:func:`~pyprovlib.controller.provisioned_volume_name` on the claim's dict: it
    reads only the UID, so no model is needed."""
    uid = uid_of(claim)
    if not uid:
        raise ValueError("the claim has no metadata.uid; a PV name cannot be derived from it")
    return f"pvc-{uid}"


def claim_key(claim: Mapping[str, Any]) -> str:
    """``namespace/name`` of ``claim``."""
    return f"{namespace_of(claim)}/{name_of(claim)}"


def source_kind(claim: Mapping[str, Any]) -> str:
    """The kind of the claim's ``dataSource`` ('' for none): the metrics' ``source`` label."""
    source = spec_of(claim).get("dataSource")
    kind = source.get("kind") if isinstance(source, Mapping) else None
    return kind if isinstance(kind, str) else ""


def storage_request(claim: Mapping[str, Any]) -> object:
    """``spec.resources.requests.storage`` as found (None when missing)."""
    resources = spec_of(claim).get("resources")
    requests = (
        resources.get("requests")
        if (type(resources) is dict or isinstance(resources, Mapping))
        else None
    )
    return (
        requests.get("storage")
        if (type(requests) is dict or isinstance(requests, Mapping))
        else None
    )


@functools.lru_cache(maxsize=256)
def _storage_request_bytes(text: str) -> int:
    return parse_storage_size(text, what="storage request")


def storage_request_bytes(request: object) -> int:
    """Bytes of a storage request as :func:`storage_request` finds it; ``ValueError`` naming
    the value when it is not a valid, non-negative quantity. Claims repeat a few sizes
    ("1Gi"), and each attempt reads its claim's size twice (the controller's check, then the
    provisioner): each distinct string is parsed once (~10 µs; a refused one is not kept)."""
    if isinstance(request, str):
        return _storage_request_bytes(request)
    return parse_storage_size(request, what="storage request")


def claim_refusal(
    claim: Mapping[str, Any], supports_block: Callable[[], bool], provisioner_name: str
) -> str | None:
    """Why ``claim`` cannot be provisioned by us at all (block mode without
    ``supports_block()``, a selector, no or a bad size), or None."""
    if claim_is_block(claim) and not supports_block():
        return f"{provisioner_name} does not support block volume provisioning"
    if spec_of(claim).get("selector") is not None:
        return (
            "claim Selector is not supported: dynamically provisioned volumes cannot match "
            "a label selector; remove spec.selector from the claim"
        )
    # kube-apiserver refuses such claims; a cache can still hold one (another server, a
    # relaxed validator), and a volume of no size must never reach the provisioner.
    request = storage_request(claim)
    if request is None:
        return (
            f"claim {claim_key(claim)} has no spec.resources.requests.storage; "
            "set the size the volume should have"
        )
    try:
        size = storage_request_bytes(request)
    except ValueError as err:
        return f"claim {claim_key(claim)} has an invalid {err}"
    if size == 0:
        return (
            f"claim {claim_key(claim)} requests {request!r} of storage; "
            "the request must be greater than zero"
        )
    return None

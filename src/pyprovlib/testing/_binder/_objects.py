"""What the PV binder reads from claims, volumes and classes: the annotations, phases and small
pure helpers over their JSON. The helpers never raise on odd objects: a wrong type reads as
"absent", so a malformed object cannot stop the binder."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from pyprovlib.controller._provision import (
    ANN_BETA_STORAGE_CLASS,
    ANN_BETA_STORAGE_PROVISIONER,
    ANN_DYNAMICALLY_PROVISIONED,
    ANN_SELECTED_NODE,
    ANN_STORAGE_PROVISIONER,
    get_claim_class,
)
from pyprovlib.kube._clock import Clock
from pyprovlib.kube._objects import (
    Obj,
    annotations_of,
    meta,
    name_of,
    namespace_of,
    uid_of,
)
from pyprovlib.kube._quantity import Quantity, quantity_or_none
from pyprovlib.testing._storage import copy_json

__all__ = [
    "ANN_BETA_DEFAULT_STORAGE_CLASS",
    "ANN_BETA_STORAGE_CLASS",
    "ANN_BETA_STORAGE_PROVISIONER",
    "ANN_BIND_COMPLETED",
    "ANN_BOUND_BY_CONTROLLER",
    "ANN_DEFAULT_STORAGE_CLASS",
    "ANN_DYNAMICALLY_PROVISIONED",
    "ANN_SELECTED_NODE",
    "ANN_STORAGE_PROVISIONER",
    "BINDER_USER_AGENT",
    "COMPONENT",
    "claim_class",
    "storage_quantity",
    "volume_class",
]

ANN_BIND_COMPLETED = "pv.kubernetes.io/bind-completed"
"""On a claim: its binding went through the controller's initial setup."""
ANN_BOUND_BY_CONTROLLER = "pv.kubernetes.io/bound-by-controller"
"""On a PV or claim: the binding was made by the controller, not pre-bound by a user."""
ANN_DEFAULT_STORAGE_CLASS = "storageclass.kubernetes.io/is-default-class"
"""On a StorageClass: ``"true"`` makes it the class of claims that name none."""
ANN_BETA_DEFAULT_STORAGE_CLASS = "storageclass.beta.kubernetes.io/is-default-class"
"""The beta spelling of :data:`ANN_DEFAULT_STORAGE_CLASS`, still honoured."""

COMPONENT = "persistentvolume-controller"
"""The event source component, as kube-controller-manager reports it."""
VAC = "volumeAttributesClassName"
"""The VolumeAttributesClass field of a claim's and a volume's spec."""
CURRENT_VAC = "currentVolumeAttributesClassName"
"""The claim status field the binder sets from the volume's class when it binds them."""
BINDER_USER_AGENT = "pyprovlib-pv-binder (persistentvolume-controller)"
"""The User-Agent of the binder's requests when it runs inside the in-memory server."""

# Claim and volume phases (core/v1).
CLAIM_PENDING, CLAIM_BOUND, CLAIM_LOST = "Pending", "Bound", "Lost"
VOLUME_AVAILABLE, VOLUME_BOUND, VOLUME_RELEASED, VOLUME_FAILED = (
    "Available",
    "Bound",
    "Released",
    "Failed",
)

ClaimKey = str  # namespace/name


def as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def as_str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def str_list(value: Any) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def claim_key(claim: Mapping[str, Any]) -> ClaimKey:
    return f"{namespace_of(claim)}/{name_of(claim)}"


def claim_ref(volume: Mapping[str, Any]) -> dict[str, Any] | None:
    ref = as_dict(volume.get("spec")).get("claimRef")
    return ref if isinstance(ref, dict) else None


def claim_ref_key(volume: Mapping[str, Any]) -> ClaimKey | None:
    ref = claim_ref(volume)
    if ref is None:
        return None
    return f"{as_str(ref.get('namespace'))}/{as_str(ref.get('name'))}"


def phase(obj: Mapping[str, Any]) -> str:
    return as_str(as_dict(obj.get("status")).get("phase"))


def volume_name_of_claim(claim: Mapping[str, Any]) -> str:
    return as_str(as_dict(claim.get("spec")).get("volumeName"))


def claim_class(claim: Mapping[str, Any]) -> str:
    """``GetPersistentVolumeClaimClass``: the beta annotation wins over spec.storageClassName."""
    return get_claim_class(claim)


def claim_has_class(claim: Mapping[str, Any]) -> bool:
    """``PersistentVolumeClaimHasClass``: an explicit "" counts as asking for no class."""
    if ANN_BETA_STORAGE_CLASS in annotations_of(claim):
        return True
    return as_dict(claim.get("spec")).get("storageClassName") is not None


def volume_class(volume: Mapping[str, Any]) -> str:
    """``GetPersistentVolumeClass``: the beta annotation wins over spec.storageClassName."""
    ann = annotations_of(volume)
    if ANN_BETA_STORAGE_CLASS in ann:
        return as_str(ann[ANN_BETA_STORAGE_CLASS])
    return as_str(as_dict(volume.get("spec")).get("storageClassName"))


def attributes_class(obj: Mapping[str, Any]) -> str:
    """A claim's or volume's VolumeAttributesClass name; unset and "" are the same (the PV
    controller compares them with ``ptr.Deref(..., "")``)."""
    return as_str(as_dict(obj.get("spec")).get(VAC))


def volume_bound_to_claim(volume: Mapping[str, Any], claim: Mapping[str, Any]) -> bool:
    """``IsVolumeBoundToClaim``: claimRef names the claim and its uid, if set, matches."""
    ref = claim_ref(volume)
    if ref is None:
        return False
    if as_str(ref.get("name")) != name_of(claim) or as_str(ref.get("namespace")) != namespace_of(
        claim
    ):
        return False
    ref_uid = as_str(ref.get("uid"))
    return not ref_uid or ref_uid == uid_of(claim)


def storage_quantity(resources: Any) -> Quantity | None:
    """The ``storage`` entry of a claim's requests or a volume's capacity, parsed by
    :mod:`pyprovlib.kube._quantity`; None when absent or not a quantity."""
    return quantity_or_none(as_dict(resources).get("storage"))


def volume_mode(spec: Mapping[str, Any]) -> str:
    return as_str(spec.get("volumeMode")) or "Filesystem"


def is_newer(new: Mapping[str, Any], old: Mapping[str, Any] | None) -> bool:
    """Whether ``new`` is a later version than the cached ``old`` (``storeObjectUpdate``): the
    cache keeps the result of the controller's own write when a late watch event brings the
    version before it, and the echo of that write changes nothing."""
    if old is None:
        return True
    n, o = _rv_int(new), _rv_int(old)
    if n is None or o is None:
        return True
    return n > o


def _rv_int(obj: Mapping[str, Any]) -> int | None:
    try:
        return int(as_str(meta(obj).get("resourceVersion")))
    except ValueError:
        return None


def quoted(value: object) -> str:
    """Go's ``%q`` for the names in upstream's messages: a double-quoted string."""
    return json.dumps("" if value is None else str(value))


def describe(err: BaseException) -> str:
    """A one-line account of an error: the Status message for API errors."""
    if isinstance(err, ApiException):
        message = ""
        if err.body:
            try:
                body = json.loads(err.body)
                message = as_str(body.get("message")) if isinstance(body, dict) else ""
            except ValueError:
                message = ""
        return f"{err.status} {err.reason}: {message}".strip()
    return f"{type(err).__name__}: {err}".strip()


def copy_obj(obj: Obj) -> Obj:
    """A deep copy to modify and write, with ``metadata`` (and ``spec`` if present) dicts."""
    copied = copy_json(obj)
    if not isinstance(copied.get("metadata"), dict):
        copied["metadata"] = {}
    if not isinstance(copied.get("spec"), dict) and "spec" in copied:
        copied["spec"] = {}
    return copied


def timestamp(clock: Clock) -> str:
    return clock.now().strftime("%Y-%m-%dT%H:%M:%SZ")

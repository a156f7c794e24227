"""The provisioning-protection finalizer on claims (``provisioning_finalizer``).

Upstream keeps the claims whose volume is being created in memory only: a claim deleted while
its ``CreateVolume`` still runs in the backend, followed by a restart of the provisioner, leaks
the volume (kubernetes-csi/external-provisioner#486; the fix proposed there was never merged).
With this option the controller puts :data:`FINALIZER_PROVISIONING` on the claim before the
provisioner is first asked for its volume, so a deleted claim stays visible (with a
``deletionTimestamp``) until the controller has finished the volume and deleted it again; the
finalizer comes off once the claim is bound to its PV or provisioning failed for good.

This module holds the API writes and the decisions that need no controller state; the
ProvisionController drives them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from pyprovlib.kube.errors import ApiException, is_not_found
from pyprovlib.kube.objects import Obj, finalizers_of, meta, name_of, namespace_of, uid_of
from pyprovlib.kube.rest import ResourceClient

__all__ = [
    "FINALIZER_PROVISIONING",
    "add_provisioning_finalizer",
    "has_provisioning_finalizer",
    "is_deleting",
    "only_protection_changed",
    "remove_provisioning_finalizer",
]

FINALIZER_PROVISIONING: Final = "pyprovlib.io/provisioning-protection"
"""Held on a claim from before its volume is requested until the claim is bound to the PV (or
provisioning failed for good), so deleting the claim cannot make the volume unreachable."""


def has_provisioning_finalizer(claim: Mapping[str, Any]) -> bool:
    """Whether ``claim`` carries :data:`FINALIZER_PROVISIONING`."""
    return FINALIZER_PROVISIONING in finalizers_of(claim)


def is_deleting(obj: Mapping[str, Any]) -> bool:
    """Whether ``obj`` has a ``deletionTimestamp`` (finalizers are holding it)."""
    return meta(obj).get("deletionTimestamp") is not None


# What every write changes, besides the finalizer itself.
_WRITE_BOOKKEEPING: Final = frozenset({"resourceVersion", "managedFields", "finalizers"})


def only_protection_changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether the claim update ``old`` → ``new`` is nothing but :data:`FINALIZER_PROVISIONING`
    coming or going — the echo of the controller's own PATCH, which needs no sync: the claim's
    state is unchanged. A resync (same resourceVersion) is never one."""
    old_meta, new_meta = meta(old), meta(new)
    if old_meta.get("resourceVersion") == new_meta.get("resourceVersion"):
        return False
    old_finalizers = old_meta.get("finalizers") or []
    new_finalizers = new_meta.get("finalizers") or []
    if (FINALIZER_PROVISIONING in old_finalizers) == (FINALIZER_PROVISIONING in new_finalizers):
        return False
    if [f for f in old_finalizers if f != FINALIZER_PROVISIONING] != [
        f for f in new_finalizers if f != FINALIZER_PROVISIONING
    ]:
        return False
    if old.keys() != new.keys() or any(old[key] != new[key] for key in old if key != "metadata"):
        return False
    keys = (old_meta.keys() | new_meta.keys()) - _WRITE_BOOKKEEPING
    return all(old_meta.get(key) == new_meta.get(key) for key in keys)


async def add_provisioning_finalizer(claims: ResourceClient, claim: Obj) -> Obj:
    """Add the finalizer to ``claim`` and return the claim as saved.

    A strategic merge patch: kube-apiserver merges ``metadata.finalizers`` as a set, so other
    finalizers added meanwhile are kept and no read-modify-write conflict can happen. The UID in
    the patch makes it fail with 409 when the name now belongs to a recreated claim; a claim
    already being deleted refuses new finalizers with 422. Both raise :class:`ApiException`.
    """
    body = {"metadata": {"uid": uid_of(claim), "finalizers": [FINALIZER_PROVISIONING]}}
    saved: Obj = await claims.patch(
        name_of(claim), body, namespace=namespace_of(claim), patch_type="strategic"
    )
    return saved


async def remove_provisioning_finalizer(claims: ResourceClient, claim: Obj) -> Obj | None:
    """Remove the finalizer from ``claim``; returns the claim as saved, or None when it is gone
    (the finalizer went with it). A claim recreated under the same name is left alone (the UID
    guard answers 409, raised as :class:`ApiException`)."""
    body = {
        "metadata": {
            "uid": uid_of(claim),
            "$deleteFromPrimitiveList/finalizers": [FINALIZER_PROVISIONING],
        }
    }
    try:
        saved: Obj = await claims.patch(
            name_of(claim), body, namespace=namespace_of(claim), patch_type="strategic"
        )
    except ApiException as err:
        if is_not_found(err):
            return None
        raise
    return saved

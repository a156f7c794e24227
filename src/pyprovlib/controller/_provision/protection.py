"""The provisioning-protection finalizer on claims (``provisioning_finalizer``).

Upstream keeps the claims whose volume is being created in memory only: a claim deleted while
its ``CreateVolume`` still runs in the backend, followed by a restart of the provisioner, leaks
the volume (kubernetes-csi/external-provisioner#486; the fix proposed there was never merged).
With this option the controller puts :data:`FINALIZER_PROVISIONING` on the claim before the
provisioner is first asked for its volume, so a deleted claim stays visible (with a
``deletionTimestamp``) until the controller has finished the volume and deleted it again; the
finalizer comes off once the claim is bound to its PV or provisioning failed for good.

This module holds the API writes, the decisions that need no controller state, and
:class:`ClaimProtection`, the one place the controller remembers what it did with the finalizer
while its cache may not show it yet; the ProvisionController drives them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Final

from pyprovlib.kube._errors import ApiException, is_not_found
from pyprovlib.kube._objects import (
    Obj,
    finalizers_of,
    is_deleting,
    meta,
    name_of,
    namespace_of,
    uid_of,
)
from pyprovlib.kube._rest import ResourceClient

__all__ = [
    "FINALIZER_PROVISIONING",
    "ClaimProtection",
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


CLEANED_UP_REMEMBERED: Final = 4096
"""How many cleaned-up deleted claims a :class:`ClaimProtection` remembers."""


class ClaimProtection:
    """The finalizer's life cycle on each claim, as this process wrote it; the informer cache
    may show any older version of the claim meanwhile.

    Per claim UID, what the controller remembers and until when:

    - *added*: it put the finalizer on the claim (the cache may not show it yet); until the
      claim is released or gone. An added claim is protected whatever the cache shows.
    - *released while bound*: it removed the finalizer from a bound claim; until a worker sees
      a version without it. A version still carrying it predates the removal (the PV
      controller writes a bound claim twice): it must not cause a second removal.
    - *cleaned up*: it dealt with the volume of a deleted claim and released the claim; the
      latest :data:`CLEANED_UP_REMEMBERED`, kept past the claim's DELETED event because a
      worker may already hold an older cached version (still deleting, still protected): that
      version must not finish and delete the volume a second time.

    Only workers read or write this object; event handlers only enqueue keys.
    """

    def __init__(self, remembered: int = CLEANED_UP_REMEMBERED) -> None:
        self._added: set[str] = set()
        self._released_bound: set[str] = set()
        self._cleaned_up: OrderedDict[str, None] = OrderedDict()
        self._remembered = remembered

    def is_protected(self, claim: Mapping[str, Any]) -> bool:
        """Whether the claim carries the finalizer, or this process put it there."""
        return has_provisioning_finalizer(claim) or uid_of(claim) in self._added

    def was_added(self, uid: str) -> bool:
        """Whether this process put the finalizer on the claim and has not released it."""
        return uid in self._added

    def added(self, uid: str) -> None:
        """The finalizer is on the claim (as saved by the API server)."""
        self._added.add(uid)

    def released(self, claim: Mapping[str, Any]) -> None:
        """The finalizer is off the claim; a deleting claim is now cleaned up."""
        uid = uid_of(claim)
        self._added.discard(uid)
        if is_deleting(claim):
            self._cleaned_up[uid] = None
            if len(self._cleaned_up) > self._remembered:
                self._cleaned_up.popitem(last=False)

    def released_while_bound(self, uid: str) -> bool:
        """Whether the finalizer already came off this bound claim (the version at hand
        predates the removal)."""
        return uid in self._released_bound

    def mark_released_while_bound(self, uid: str) -> None:
        self._released_bound.add(uid)

    def seen_without_finalizer(self, uid: str) -> None:
        """A worker read a version of the claim without the finalizer: the cache shows the
        removal."""
        self._released_bound.discard(uid)

    def was_cleaned_up(self, uid: str) -> bool:
        """Whether this process already dealt with the deleted claim and released it."""
        return uid in self._cleaned_up

    def forget(self, uid: str) -> None:
        """The claim is gone from the cache and nothing runs for it any more."""
        self._added.discard(uid)
        self._released_bound.discard(uid)

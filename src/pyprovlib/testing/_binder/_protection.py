"""kube-controller-manager's pvc-protection and pv-protection controllers, for a control plane
where the binder stands in for kube-controller-manager.

A real kube-apiserver's StorageObjectInUseProtection admission puts ``kubernetes.io/pvc-protection``
on every claim and ``kubernetes.io/pv-protection`` on every PV; without the controllers that
remove them, no claim or PV is ever deleted. A deleting claim loses its finalizer once no
scheduled, unfinished pod uses it; a deleting PV once it is no longer ``Bound``. The in-memory
server adds neither finalizer, so there this has nothing to do.
"""

from __future__ import annotations

from typing import Any

from pyprovlib.kube._objects import Obj, finalizers_of, is_deleting, name_of, namespace_of
from pyprovlib.kube._resources import PODS
from pyprovlib.testing._binder._objects import VOLUME_BOUND, as_dict, as_str, copy_obj, phase
from pyprovlib.testing._binder._writes import BinderApi

__all__ = ["PVC_PROTECTION", "PV_PROTECTION", "Protection"]

PVC_PROTECTION = "kubernetes.io/pvc-protection"
"""The finalizer that keeps a claim while a pod uses it."""
PV_PROTECTION = "kubernetes.io/pv-protection"
"""The finalizer that keeps a PV while it is bound."""


class Protection:
    """Removes the protection finalizers from deleting claims and volumes no longer in use."""

    def __init__(self, api: BinderApi) -> None:
        self.api = api

    async def sync_claim(self, claim: Obj) -> bool:
        """True when it let the claim go (removed the finalizer)."""
        if not _deleting_held_by(claim, PVC_PROTECTION) or await self._claim_in_use(claim):
            return False
        await self.api.put_claim(_without_finalizer(claim, PVC_PROTECTION))
        return True

    async def sync_volume(self, volume: Obj) -> bool:
        """True when it let the volume go (removed the finalizer)."""
        if not _deleting_held_by(volume, PV_PROTECTION) or phase(volume) == VOLUME_BOUND:
            return False
        await self.api.put_volume(_without_finalizer(volume, PV_PROTECTION))
        return True

    async def _claim_in_use(self, claim: Obj) -> bool:
        """Whether a scheduled pod that has not finished uses the claim (asked of the server,
        like upstream's live check before it lets a claim go)."""
        pods = await self.api.http.json("GET", PODS.path(namespace_of(claim)))
        return any(_pod_uses(pod, name_of(claim)) for pod in pods.get("items") or ())


def _deleting_held_by(obj: Obj, finalizer: str) -> bool:
    return is_deleting(obj) and finalizer in finalizers_of(obj)


def _without_finalizer(obj: Obj, finalizer: str) -> Obj:
    updated = copy_obj(obj)
    updated["metadata"]["finalizers"] = [f for f in finalizers_of(obj) if f != finalizer]
    return updated


def _pod_uses(pod: Any, claim_name: str) -> bool:
    if not isinstance(pod, dict):
        return False
    spec = as_dict(pod.get("spec"))
    if not as_str(spec.get("nodeName")):
        return False  # kubelet only starts scheduled pods; an unscheduled one holds nothing
    if phase(pod) in ("Succeeded", "Failed"):
        return False
    for volume in spec.get("volumes") or ():
        source = as_dict(as_dict(volume).get("persistentVolumeClaim"))
        if as_str(source.get("claimName")) == claim_name:
            return True
    return False

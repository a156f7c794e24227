"""Expansion of RBD volumes for :class:`~pyprovlib.ResizeController`: the
in-tree RBD plugin's ``ExpandImage`` (``rbd info``, then ``rbd resize`` only when the image is
smaller) behind the :class:`~pyprovlib.Resizer` contract. Kubelet then grows the file
system on the node, as with the in-tree plugin."""

from __future__ import annotations

from kubernetes_asyncio.client import V1PersistentVolume

from pyprovlib._attacher import GrpcCode
from pyprovlib._provisioner import IgnoredError
from pyprovlib._resizer import ExpansionResult, ResizeError, Resizer
from pyprovlib.examples.rbd._provisioner import (
    DEFAULT_PROVISIONER_NAME,
    IMAGE_PREFIX,
    RBDProvisioner,
    RBDVolumeRef,
)
from pyprovlib.examples.rbd._rbd_cli import RbdNotFoundError

__all__ = ["RBDResizer"]


class RBDResizer(Resizer):
    """Grows the images of PVs made by ``provisioner`` (whose classes name ``name`` as their
    provisioner)."""

    def __init__(self, provisioner: RBDProvisioner, name: str = DEFAULT_PROVISIONER_NAME) -> None:
        self.provisioner = provisioner
        self.name = name

    def can_support(self, pv: V1PersistentVolume) -> bool:
        """RBD volumes whose image this provisioner created."""
        source = pv.spec.rbd if pv.spec else None
        return source is not None and str(source.image or "").startswith(IMAGE_PREFIX)

    async def expand(self, pv: V1PersistentVolume, new_size: int) -> ExpansionResult:
        """Grow the image to at least ``new_size`` bytes (whole MiB); the node grows the file
        system afterwards unless the volume is a raw block device. A missing image is an
        infeasible request (NOT_FOUND); cluster errors are retried."""
        try:
            ref = RBDVolumeRef.from_model(pv)
        except IgnoredError as err:
            raise ResizeError(str(err), code=GrpcCode.INVALID_ARGUMENT) from None
        try:
            size = await self.provisioner.expand(ref, new_size)
        except RbdNotFoundError as err:
            raise ResizeError(str(err), code=GrpcCode.NOT_FOUND) from None
        return ExpansionResult(size, node_expansion_required=not ref.block)

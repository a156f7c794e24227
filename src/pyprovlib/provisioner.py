"""The user contract for provisioning: what a storage backend implements.

Port of sig-storage-lib-external-provisioner's ``Provisioner``, ``Qualifier``, ``DeletionGuard``
and ``BlockProvisioner`` interfaces (v13). Go returns ``(pv, state, err)``; here
:meth:`Provisioner.provision` returns the PersistentVolume and reports failure by raising
:class:`ProvisioningError`, which carries the :class:`ProvisioningState`.

Objects crossing this boundary are kubernetes-asyncio models (``V1PersistentVolumeClaim``,
``V1StorageClass``, ``V1PersistentVolume``) so backends work with the types they know.
"""

from __future__ import annotations

import abc
import enum
from dataclasses import dataclass

from kubernetes_asyncio.client import (
    V1PersistentVolume,
    V1PersistentVolumeClaim,
    V1StorageClass,
)

from pyprovlib.errors import PyprovlibError

__all__ = [
    "BlockProvisioner",
    "DeletionGuard",
    "IgnoredError",
    "InfeasibleError",
    "MountOptionsProvisioner",
    "ProvisionOptions",
    "Provisioner",
    "ProvisioningError",
    "ProvisioningState",
    "Qualifier",
]


class ProvisioningState(enum.Enum):
    """Where a failed provisioning attempt left the backend (upstream's ``ProvisioningState``)."""

    FINISHED = "Finished"
    """Nothing is in progress: the backend created nothing, or cleaned up. The controller retries
    up to the failed-provision threshold, then gives up on the claim."""

    IN_BACKGROUND = "Background"
    """The backend may still be creating the volume. The controller keeps retrying, and keeps
    retrying even when the claim is deleted meanwhile, so the volume is finished and then
    released rather than leaked."""

    NO_CHANGE = "NoChange"
    """The attempt did not change anything (e.g. a Secret could not be read before any call to
    the backend): keep whatever state the previous attempt left."""

    RESCHEDULE = "Reschedule"
    """The selected node cannot host the volume: the controller removes the claim's
    ``volume.kubernetes.io/selected-node`` annotation so the scheduler picks again."""


class ProvisioningError(PyprovlibError):
    """Raised by :meth:`Provisioner.provision` when the volume could not be provisioned.

    The message becomes the ``ProvisioningFailed`` event's message: say what failed and what
    the user can do, and never include secrets.
    """

    def __init__(self, message: str, state: ProvisioningState = ProvisioningState.FINISHED) -> None:
        super().__init__(message)
        self.state = state


class InfeasibleError(ProvisioningError):
    """Raised by ``provision`` when the request cannot succeed as it stands (for instance the
    StorageClass parameters are invalid): the claim is not retried for ``retry_interval_max``
    unless its StorageClass is replaced meanwhile. The counterpart of CSI's InvalidArgument.

    Belongs in :mod:`pyprovlib.provisioner` with the rest of the user contract.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message, ProvisioningState.FINISHED)


class IgnoredError(PyprovlibError):
    """Raised by ``provision`` or ``delete`` to decline an object without it counting as a
    failure: another provisioner may handle it, or (on delete) the PV is left alone."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class ProvisionOptions:
    """Everything a provisioner needs to create one volume."""

    storage_class: V1StorageClass
    """The claim's StorageClass (parameters, reclaim policy, mount options, topologies)."""

    pv_name: str
    """The name the PersistentVolume must have (deterministic, so a retry after a crash finds
    the asset it already created)."""

    pvc: V1PersistentVolumeClaim
    """The claim being provisioned."""

    selected_node_name: str | None = None
    """The node the scheduler picked (``volume.kubernetes.io/selected-node``) for
    WaitForFirstConsumer classes; None for Immediate binding."""


class Provisioner(abc.ABC):
    """A storage backend: creates and deletes the asset behind a PersistentVolume.

    Subclass it, and mix in :class:`Qualifier`, :class:`DeletionGuard` or
    :class:`BlockProvisioner` to opt into their behaviour.
    """

    @abc.abstractmethod
    async def provision(self, options: ProvisionOptions) -> V1PersistentVolume:
        """Create the asset and return the PersistentVolume that describes it.

        Return a PV named ``options.pv_name`` with its volume source, capacity and access
        modes; the controller fills in claimRef, storageClassName, reclaim policy, mount
        options, the ``pv.kubernetes.io/provisioned-by`` annotation and the finalizer.
        Must be idempotent: it is called again after errors and after restarts.

        Raise :class:`ProvisioningError` (with a state) on failure, :class:`IgnoredError` to
        leave the claim to someone else. Any other exception is treated as a failure in state
        ``IN_BACKGROUND``, since the backend may have done part of the work.
        """

    @abc.abstractmethod
    async def delete(self, volume: V1PersistentVolume) -> None:
        """Remove the asset behind ``volume``. An asset already gone is success.

        Raise :class:`IgnoredError` to leave the PV in place without an error; any other
        exception is a failed delete, retried with backoff.
        """


class Qualifier(abc.ABC):
    """Lets a provisioner decline claims before any provisioning is attempted."""

    @abc.abstractmethod
    async def should_provision(self, claim: V1PersistentVolumeClaim) -> bool:
        """True when this provisioner should provision ``claim``."""


class DeletionGuard(abc.ABC):
    """Lets a provisioner keep volumes that would otherwise be deleted."""

    @abc.abstractmethod
    async def should_delete(self, volume: V1PersistentVolume) -> bool:
        """True when ``volume`` may be deleted."""


class BlockProvisioner(abc.ABC):
    """Declares whether the provisioner can create raw block volumes (``volumeMode: Block``).
    Provisioners that do not mix this in get only Filesystem claims."""

    @abc.abstractmethod
    def supports_block(self) -> bool:
        """True when block volumes are supported."""


class MountOptionsProvisioner(abc.ABC):
    """Declares whether the provisioner's volumes accept ``mountOptions``.

    Provisioners that do not mix this in are assumed to support them (upstream passes them
    through); those that return False get a ``ProvisioningFailed`` event, as kube's PV
    controller does for in-tree plugins, when a claim's class has mount options.
    """

    @abc.abstractmethod
    def supports_mount_options(self) -> bool:
        """True when PVs of this provisioner may carry mount options."""

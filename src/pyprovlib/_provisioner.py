"""The user contract for provisioning: what a storage backend implements.

Port of sig-storage-lib-external-provisioner's ``Provisioner``, ``Qualifier``, ``DeletionGuard``
and ``BlockProvisioner`` interfaces (v13). Go returns ``(pv, state, err)``; here
:meth:`Provisioner.provision` returns the PersistentVolume and reports failure by raising
:class:`ProvisioningError`, which carries the :class:`ProvisioningState`.

Objects crossing this boundary are kubernetes-asyncio models (``V1PersistentVolumeClaim``,
``V1StorageClass``, ``V1PersistentVolume``) so backends work with the types they know; each is
converted from the controller's cached JSON once per call, and only for a call that is made.
Backends that work on JSON get the JSON form instead and nothing is converted:
:attr:`ProvisionOptions.claim_object` and :attr:`ProvisionOptions.storage_class_object` for
provisioning, :class:`ObjectDeleter` for deletion.
"""

from __future__ import annotations

import abc
import enum
from collections import OrderedDict
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, cast

from kubernetes_asyncio.client import (
    V1PersistentVolume,
    V1PersistentVolumeClaim,
    V1StorageClass,
)

from pyprovlib._errors import PyprovlibError
from pyprovlib.kube._convert import from_model, to_model

__all__ = [
    "BlockProvisioner",
    "DeletionGuard",
    "IgnoredError",
    "InfeasibleError",
    "MountOptionsProvisioner",
    "ObjectDeleter",
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

    Belongs in :mod:`pyprovlib._provisioner` with the rest of the user contract.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message, ProvisioningState.FINISHED)


class IgnoredError(PyprovlibError):
    """Raised by ``provision`` or ``delete`` to decline an object without it counting as a
    failure: another provisioner may handle it, or (on delete) the PV is left alone."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ProvisionOptions:
    """Everything a provisioner needs to create one volume.

    The claim and its StorageClass are kubernetes-asyncio models (:attr:`pvc`,
    :attr:`storage_class`), converted from the controller's cache once, on first access, by
    kubernetes-asyncio's own deserialiser. Their JSON form is there too
    (:attr:`claim_object`, :attr:`storage_class_object`), read-only: a backend that works on
    JSON (the built-in CSI provisioner) reads those and no conversion happens at all.

    Construct it with either form (tests of a provisioner usually pass models)::

        ProvisionOptions(storage_class=V1StorageClass(...), pv_name="pvc-1", pvc=claim)

    Converting a malformed object raises
    :class:`~pyprovlib.kube._convert.ConversionError`; raised from ``provision`` it becomes a
    ``ProvisioningFailed`` event naming the object, and the claim is not retried until it or
    its class changes.
    """

    __slots__ = (
        "_claim",
        "_claim_object",
        "_class",
        "_class_object",
        "pv_name",
        "selected_node_name",
    )

    def __init__(
        self,
        storage_class: V1StorageClass | Mapping[str, Any],
        pv_name: str,
        pvc: V1PersistentVolumeClaim | Mapping[str, Any],
        selected_node_name: str | None = None,
    ) -> None:
        self.pv_name = pv_name
        """The name the PersistentVolume must have (deterministic, so a retry after a crash
        finds the asset it already created)."""
        self.selected_node_name = selected_node_name
        """The node the scheduler picked (``volume.kubernetes.io/selected-node``) for
        WaitForFirstConsumer classes; None for Immediate binding."""
        self._class, self._class_object = _split(storage_class)
        self._claim, self._claim_object = _split(pvc)

    @property
    def storage_class(self) -> V1StorageClass:
        """The claim's StorageClass (parameters, reclaim policy, mount options, topologies)."""
        if self._class is None:
            self._class = _class_model(self.storage_class_object)
        return cast(V1StorageClass, self._class)

    @property
    def pvc(self) -> V1PersistentVolumeClaim:
        """The claim being provisioned."""
        if self._claim is None:
            model: V1PersistentVolumeClaim = to_model(self.claim_object, V1PersistentVolumeClaim)
            self._claim = model
        return cast(V1PersistentVolumeClaim, self._claim)

    @property
    def storage_class_object(self) -> Mapping[str, Any]:
        """The StorageClass as JSON (the API's field names). Do not modify it: it may be the
        controller's cached object."""
        if self._class_object is None:
            self._class_object = MappingProxyType(from_model(self._class))
        return self._class_object

    @property
    def claim_object(self) -> Mapping[str, Any]:
        """The claim as JSON (the API's field names). Do not modify it: it may be the
        controller's cached object."""
        if self._claim_object is None:
            self._claim_object = MappingProxyType(from_model(self._claim))
        return self._claim_object

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ProvisionOptions):
            return NotImplemented
        return (
            self.pv_name == other.pv_name
            and self.selected_node_name == other.selected_node_name
            and dict(self.claim_object) == dict(other.claim_object)
            and dict(self.storage_class_object) == dict(other.storage_class_object)
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        claim_meta = self.claim_object.get("metadata") or {}
        class_meta = self.storage_class_object.get("metadata") or {}
        return (
            f"ProvisionOptions(pv_name={self.pv_name!r}, "
            f"claim={claim_meta.get('namespace')!r}/{claim_meta.get('name')!r}, "
            f"storage_class={class_meta.get('name')!r}, "
            f"selected_node_name={self.selected_node_name!r})"
        )


_CLASS_MODELS: OrderedDict[tuple[str, str, str], V1StorageClass] = OrderedDict()
_CLASS_MODELS_MAX = 128


def _class_model(storage_class: Mapping[str, Any]) -> V1StorageClass:
    """The class as a model, converted once per class version: every claim of a class shares
    one (a process has few classes; the oldest versions are dropped beyond 128)."""
    metadata = storage_class.get("metadata") or {}
    version = metadata.get("resourceVersion")
    if not version:
        fresh: V1StorageClass = to_model(storage_class, V1StorageClass)
        return fresh
    key = (str(metadata.get("name")), str(metadata.get("uid")), str(version))
    cached = _CLASS_MODELS.get(key)
    if cached is not None:
        return cached
    model: V1StorageClass = to_model(storage_class, V1StorageClass)
    _CLASS_MODELS[key] = model
    while len(_CLASS_MODELS) > _CLASS_MODELS_MAX:
        _CLASS_MODELS.popitem(last=False)
    return model


def _split(value: Any) -> tuple[Any, Mapping[str, Any] | None]:
    """(model, None) for a model, (None, read-only mapping) for a JSON mapping."""
    if isinstance(value, Mapping):
        return None, value if isinstance(value, MappingProxyType) else MappingProxyType(value)
    return value, None


class Provisioner(abc.ABC):
    """A storage backend: creates and deletes the asset behind a PersistentVolume.

    Subclass it, and mix in :class:`Qualifier`, :class:`DeletionGuard` or
    :class:`BlockProvisioner` to opt into their behaviour.
    """

    @abc.abstractmethod
    async def provision(self, options: ProvisionOptions) -> V1PersistentVolume | Mapping[str, Any]:
        """Create the asset and return the PersistentVolume that describes it: a
        ``V1PersistentVolume``, or its JSON form as a mapping (what a backend working on
        :attr:`ProvisionOptions.claim_object` returns, to skip a conversion).

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


class ObjectDeleter(abc.ABC):
    """Lets a provisioner that works on JSON (as the built-in CSI provisioner does) delete from
    the PV's JSON form: the controller then calls :meth:`delete_object` instead of
    :meth:`Provisioner.delete`, and converts nothing.

    Implement :meth:`Provisioner.delete` too (for callers holding a model), usually as
    ``await self.delete_object(from_model(volume))``.
    """

    @abc.abstractmethod
    async def delete_object(self, volume: Mapping[str, Any]) -> None:
        """Remove the asset behind the PV ``volume`` (its JSON, the API's field names), with
        the semantics of :meth:`Provisioner.delete`. Do not modify ``volume``: it may be the
        controller's cached object (it is passed read-only)."""

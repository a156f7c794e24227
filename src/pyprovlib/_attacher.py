"""The user contract for attaching volumes to nodes: implement :class:`Attacher` and hand it to
:class:`~pyprovlib.AttachController`, which drives it from VolumeAttachments
the way kubernetes-csi/external-attacher drives a CSI driver's ControllerPublishVolume.

A minimal backend::

    from pyprovlib._attacher import AttachError, Attacher, AttachNode, AttachVolume

    class MyArray(Attacher):
        async def attach(self, volume: AttachVolume, node: AttachNode, readonly: bool,
                         context: Mapping[str, str]) -> dict[str, str]:
            lun = await my_api.map_lun(volume.volume_id, node.node_id, readonly=readonly)
            return {"lun": str(lun)}  # becomes VolumeAttachment.status.attachmentMetadata

        async def detach(self, volume: AttachVolume, node: AttachNode) -> None:
            await my_api.unmap_lun(volume.volume_id, node.node_id)  # must be idempotent

        # Optional: lets the controller repair drift every --reconcile-sync.
        async def list_published(self) -> dict[str, list[str]]:
            return await my_api.mappings()  # {volume_id: [node_id, ...]}

    controller = AttachController(api_client, "my.driver.example.com", MyArray())
    await controller.run()

``attach`` and ``detach`` must be idempotent: the controller calls them again after any error,
after a timeout, and when the reconciler finds an attachment that drifted.

The volume arrives as an :class:`AttachVolume`: the values a backend usually needs, and the PV
spec both as a kubernetes-asyncio ``V1PersistentVolumeSpec`` (``volume.spec``, converted on
first access, once per attach or detach) and as JSON (``volume.spec_object``), the same
convention as :class:`~pyprovlib.ProvisionOptions` and
:class:`~pyprovlib.Resizer`.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from kubernetes_asyncio.client import V1PersistentVolumeSpec

from pyprovlib._errors import PyprovlibError
from pyprovlib.kube._convert import ConversionError, to_model

__all__ = [
    "IN_PROGRESS_CODES",
    "AttachError",
    "AttachNode",
    "AttachVolume",
    "Attacher",
    "GrpcCode",
    "is_final_code",
]


class GrpcCode:
    """The numeric gRPC status codes that matter to attaching (``status.attachError.errorCode``
    carries one of these, as in Kubernetes)."""

    OK: Final = 0
    CANCELLED: Final = 1
    UNKNOWN: Final = 2
    INVALID_ARGUMENT: Final = 3
    DEADLINE_EXCEEDED: Final = 4
    NOT_FOUND: Final = 5
    ALREADY_EXISTS: Final = 6
    PERMISSION_DENIED: Final = 7
    RESOURCE_EXHAUSTED: Final = 8
    FAILED_PRECONDITION: Final = 9
    ABORTED: Final = 10
    OUT_OF_RANGE: Final = 11
    UNIMPLEMENTED: Final = 12
    INTERNAL: Final = 13
    UNAVAILABLE: Final = 14
    DATA_LOSS: Final = 15
    UNAUTHENTICATED: Final = 16


IN_PROGRESS_CODES: Final = frozenset(
    {
        GrpcCode.CANCELLED,
        GrpcCode.DEADLINE_EXCEEDED,
        GrpcCode.UNAVAILABLE,
        GrpcCode.RESOURCE_EXHAUSTED,
        GrpcCode.ABORTED,
    }
)
"""Codes after which the operation may still be running on the backend (external-attacher's
``isFinalError`` is false for them): timeouts, cancellation, a backend going away or busy, and
CSI's "operation pending for this volume"."""


def is_final_code(code: int | None) -> bool:
    """Whether an error with this gRPC ``code`` says nothing is in progress on the backend any
    more (external-resizer's ``IsFinalError``): a code outside :data:`IN_PROGRESS_CODES`.
    Without a code the backend was not asked or cannot say, so it is not final."""
    return code is not None and code not in IN_PROGRESS_CODES


class AttachError(PyprovlibError):
    """An attach or detach that failed. ``message`` is what goes into the VolumeAttachment's
    ``status.attachError``/``detachError`` (never put secrets in it); ``code`` is the gRPC
    status code when there is one (``status...errorCode``).

    ``in_progress`` says the operation may still be running on the backend (by default: the
    code is one of :data:`IN_PROGRESS_CODES`). Either way the controller keeps its finalizers
    and retries with backoff, so an attachment it may have made is never forgotten.
    """

    def __init__(
        self, message: str, *, code: int | None = None, in_progress: bool | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.in_progress = code in IN_PROGRESS_CODES if in_progress is None else in_progress


@dataclass(frozen=True)
class AttachVolume:
    """The volume of a VolumeAttachment, as resolved from its PersistentVolume (or inline spec).

    ``volume_id`` is the PV's ``spec.csi.volumeHandle``; ``pv_name`` is None for an inline
    volume. ``volume_mode`` is ``Filesystem`` or ``Block``; ``fs_type`` falls back to the
    controller's default file system type. ``secrets`` holds the data of the
    ``controllerPublishSecretRef`` Secret; it is excluded from ``repr`` and must never be logged.

    The whole PV spec (or inline spec) is there in two forms: :attr:`spec`, the
    kubernetes-asyncio ``V1PersistentVolumeSpec``, converted on first access and once per
    attach or detach; and :attr:`spec_object`, its JSON form (the API's field names, read-only:
    it may be the controller's cached object), for a backend that works on JSON and so
    converts nothing. The fields above are what most backends need; neither form is converted
    unless read.
    """

    volume_id: str
    driver: str
    pv_name: str | None = None
    volume_attributes: Mapping[str, str] = field(default_factory=dict)
    fs_type: str = ""
    volume_mode: str = "Filesystem"
    access_modes: tuple[str, ...] = ()
    mount_options: tuple[str, ...] = ()
    secrets: Mapping[str, str] = field(default_factory=dict, repr=False)
    spec_object: Mapping[str, Any] = field(default_factory=dict, repr=False)
    """The PV spec (or inline spec) as JSON. Do not modify it."""

    @property
    def is_block(self) -> bool:
        """Whether the volume is consumed as a raw block device."""
        return self.volume_mode == "Block"

    @functools.cached_property
    def spec(self) -> V1PersistentVolumeSpec:
        """The PV spec (or inline spec) as a kubernetes-asyncio ``V1PersistentVolumeSpec``,
        converted from :attr:`spec_object` on first access. Raises
        :class:`~pyprovlib.kube._convert.ConversionError` when the model refuses it."""
        try:
            model: V1PersistentVolumeSpec = to_model(self.spec_object, V1PersistentVolumeSpec)
        except ConversionError as err:
            what = f'PersistentVolume "{self.pv_name}"' if self.pv_name else "inline volume"
            raise ConversionError(f"the spec of {what}: {err}") from err
        return model

    def with_secrets(self, secrets: Mapping[str, str]) -> AttachVolume:
        """A copy holding ``secrets``, sharing :attr:`spec` when it was converted already, so
        one attach converts at most once."""
        copy = dataclasses.replace(self, secrets=secrets)
        if "spec" in vars(self):  # cached_property keeps its value in the instance's dict
            vars(copy)["spec"] = vars(self)["spec"]
        return copy


@dataclass(frozen=True)
class AttachNode:
    """The node of a VolumeAttachment: its Kubernetes ``name`` and the driver's ``node_id``
    (from the node's CSINode object, or the ID remembered on the VolumeAttachment)."""

    name: str
    node_id: str


class Attacher(abc.ABC):
    """A storage backend that can attach volumes to nodes (CSI's ControllerPublishVolume).

    Raise :class:`AttachError` for failures that should reach the VolumeAttachment's status
    with a code; any other exception is reported with its message and retried the same way.
    """

    @abc.abstractmethod
    async def attach(
        self,
        volume: AttachVolume,
        node: AttachNode,
        readonly: bool,
        context: Mapping[str, str],
    ) -> Mapping[str, str]:
        """Make ``volume`` available on ``node``; return the publish context (stored in
        ``status.attachmentMetadata`` and handed to the node plugin). ``context`` is the
        volume context (``spec.csi.volumeAttributes``). Must be idempotent."""

    @abc.abstractmethod
    async def detach(self, volume: AttachVolume, node: AttachNode) -> None:
        """Make ``volume`` unavailable on ``node``. Must succeed when it is not attached."""

    def check(self, volume: AttachVolume) -> None:
        """Raise :class:`AttachError` for a volume this backend can never attach (e.g. an
        access mode it cannot serve). Called before any finalizer is added, so such a
        VolumeAttachment can still be deleted at once; the default accepts every volume."""
        return None

    async def list_published(self) -> Mapping[str, Sequence[str]]:
        """Every volume the backend has attached: ``{volume_id: [node_id, ...]}``. Optional
        (CSI's ListVolumes with LIST_VOLUMES_PUBLISHED_NODES); implementing it turns on the
        reconciler that repairs VolumeAttachments whose status disagrees with the backend."""
        raise NotImplementedError

    @property
    def supports_list_published(self) -> bool:
        """Whether :meth:`list_published` is implemented (overridden by a subclass)."""
        return type(self).list_published is not Attacher.list_published

"""The CSI attach handler: :class:`CSIAttacher`, an :class:`~pyprovlib.Attacher` over a
CSI driver's ControllerPublishVolume / ControllerUnpublishVolume / ListVolumes
(kubernetes-csi/external-attacher's ``pkg/attacher``), and the volume capability it sends.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from pyprovlib._attacher import Attacher, AttachError, AttachNode, AttachVolume
from pyprovlib.csi._connection import GO_STATUS_NAMES, CSICallError, CSIConnection
from pyprovlib.csi._proto.csi import v1

__all__ = [
    "CSIAttacher",
    "UnsupportedAccessModeError",
    "csi_access_mode",
    "has_capabilities",
    "pv_volume_capability",
    "volume_capability",
]

_Caps = v1.ControllerServiceCapabilityRpcType
_Mode = v1.VolumeCapabilityAccessModeMode


class UnsupportedAccessModeError(AttachError):
    """The PV's access modes have no CSI equivalent (e.g. ReadOnlyMany with ReadWriteOnce)."""


def has_capabilities(
    connection: CSIConnection, *required: _Caps, override: bool | None = None
) -> bool:
    """A sidecar's ``supports_*`` setting: ``override`` when given, else whether the driver
    reported every ``required`` controller capability."""
    if override is not None:
        return override
    return all(cap in connection.controller_capabilities for cap in required)


def csi_access_mode(access_modes: Collection[str], single_node_multi_writer: bool) -> _Mode:
    """csi-lib-utils' ``accessmodes.ToCSIAccessMode``: the CSI access mode of a PV's access
    modes, for drivers with or without the SINGLE_NODE_MULTI_WRITER capability."""
    modes = set(access_modes)
    if "ReadWriteOncePod" in modes:
        if len(modes) > 1:
            raise UnsupportedAccessModeError(
                "Kubernetes does not support use of ReadWriteOncePod with other access modes "
                "on the same PersistentVolume"
            )
        if single_node_multi_writer:
            return _Mode.SINGLE_NODE_SINGLE_WRITER
        return _Mode.SINGLE_NODE_WRITER
    if "ReadWriteMany" in modes:
        return _Mode.MULTI_NODE_MULTI_WRITER
    if "ReadOnlyMany" in modes and "ReadWriteOnce" in modes:
        raise UnsupportedAccessModeError(
            "CSI does not support ReadOnlyMany and ReadWriteOnce on the same PersistentVolume"
        )
    if "ReadOnlyMany" in modes:
        return _Mode.MULTI_NODE_READER_ONLY
    if "ReadWriteOnce" in modes:
        if single_node_multi_writer:
            return _Mode.SINGLE_NODE_MULTI_WRITER
        return _Mode.SINGLE_NODE_WRITER
    raise UnsupportedAccessModeError(f"unsupported AccessMode combination: {sorted(modes)}")


def volume_capability(volume: AttachVolume, single_node_multi_writer: bool) -> v1.VolumeCapability:
    """external-attacher's ``GetVolumeCapabilities``: block or mount (file system type and
    mount options) with the access mode of the volume's access modes."""
    return pv_volume_capability(
        volume.access_modes,
        single_node_multi_writer,
        block=volume.is_block,
        fs_type=volume.fs_type,
        mount_flags=volume.mount_options,
    )


def pv_volume_capability(
    access_modes: Collection[str],
    single_node_multi_writer: bool,
    *,
    block: bool,
    fs_type: str,
    mount_flags: Sequence[str],
) -> v1.VolumeCapability:
    """The volume capability the attacher and the resizer send for a PersistentVolume (their
    ``GetVolumeCapabilities``): a block volume, or a mount one with ``fs_type`` and
    ``mount_flags``, with the CSI access mode of ``access_modes`` (:func:`csi_access_mode`,
    which raises :class:`UnsupportedAccessModeError`)."""
    mode = v1.VolumeCapabilityAccessMode(
        mode=csi_access_mode(access_modes, single_node_multi_writer)
    )
    if block:
        return v1.VolumeCapability(block=v1.VolumeCapabilityBlockVolume(), access_mode=mode)
    return v1.VolumeCapability(
        mount=v1.VolumeCapabilityMountVolume(fs_type=fs_type, mount_flags=list(mount_flags)),
        access_mode=mode,
    )


def _attach_error(err: CSICallError) -> AttachError:
    # grpc-go's status error text, which is what upstream stores in attachError.message.
    return AttachError(
        f"rpc error: code = {GO_STATUS_NAMES[err.status]} desc = {err.message}",
        code=int(err.status.value),
    )


class CSIAttacher(Attacher):
    """Attach and detach through a CSI driver's Controller service.

    ``connection`` is an open :class:`~pyprovlib.csi.CSIConnection`; the capability
    flags default to what the driver reported. ``readonly`` is passed to the driver only when it
    has PUBLISH_READONLY ("CO MUST set this field to false if SP does not have the
    PUBLISH_READONLY controller capability"). ``max_entries`` pages ListVolumes (0: no limit).
    ``timeout`` bounds each call (default: the connection's).
    """

    def __init__(
        self,
        connection: CSIConnection,
        *,
        supports_publish_readonly: bool | None = None,
        supports_single_node_multi_writer: bool | None = None,
        supports_list_published_nodes: bool | None = None,
        max_entries: int = 0,
        timeout: float | None = None,
    ) -> None:
        self.connection = connection
        self.supports_publish_readonly = has_capabilities(
            connection, _Caps.PUBLISH_READONLY, override=supports_publish_readonly
        )
        self.supports_single_node_multi_writer = has_capabilities(
            connection, _Caps.SINGLE_NODE_MULTI_WRITER, override=supports_single_node_multi_writer
        )
        self._lists = has_capabilities(
            connection,
            _Caps.LIST_VOLUMES,
            _Caps.LIST_VOLUMES_PUBLISHED_NODES,
            override=supports_list_published_nodes,
        )
        if max_entries < 0:
            raise ValueError(f"max_entries must not be negative, got {max_entries}")
        self.max_entries = max_entries
        self.timeout = timeout

    @property
    def supports_list_published(self) -> bool:
        """True when the driver has LIST_VOLUMES and LIST_VOLUMES_PUBLISHED_NODES."""
        return self._lists

    def check(self, volume: AttachVolume) -> None:
        """Refuse volumes whose access modes have no CSI access mode (before any finalizer)."""
        volume_capability(volume, self.supports_single_node_multi_writer)

    async def attach(
        self,
        volume: AttachVolume,
        node: AttachNode,
        readonly: bool,
        context: Mapping[str, str],
    ) -> Mapping[str, str]:
        """ControllerPublishVolume; returns the driver's publish context."""
        request = v1.ControllerPublishVolumeRequest(
            volume_id=volume.volume_id,
            node_id=node.node_id,
            volume_capability=volume_capability(volume, self.supports_single_node_multi_writer),
            readonly=readonly and self.supports_publish_readonly,
            secrets=dict(volume.secrets),
            volume_context=dict(context),
        )
        try:
            response: v1.ControllerPublishVolumeResponse = await self.connection.call(
                "/csi.v1.Controller/ControllerPublishVolume", request, call_timeout=self.timeout
            )
        except CSICallError as err:
            raise _attach_error(err) from None
        return dict(response.publish_context)

    async def detach(self, volume: AttachVolume, node: AttachNode) -> None:
        """ControllerUnpublishVolume."""
        request = v1.ControllerUnpublishVolumeRequest(
            volume_id=volume.volume_id, node_id=node.node_id, secrets=dict(volume.secrets)
        )
        try:
            await self.connection.call(
                "/csi.v1.Controller/ControllerUnpublishVolume", request, call_timeout=self.timeout
            )
        except CSICallError as err:
            raise _attach_error(err) from None

    async def list_published(self) -> Mapping[str, Sequence[str]]:
        """ListVolumes, every page: ``{volume_id: published node IDs}``."""
        if not self._lists:
            raise NotImplementedError("the CSI driver does not have LIST_VOLUMES_PUBLISHED_NODES")
        published: dict[str, list[str]] = {}
        token = ""
        while True:
            request = v1.ListVolumesRequest(max_entries=self.max_entries, starting_token=token)
            try:
                response: v1.ListVolumesResponse = await self.connection.call(
                    "/csi.v1.Controller/ListVolumes", request, call_timeout=self.timeout
                )
            except CSICallError as err:
                raise AttachError(
                    f"failed to list volumes: {_attach_error(err).message}",
                    code=int(err.status.value),
                ) from None
            for entry in response.entries:
                if entry.volume is None:
                    continue
                nodes = list(entry.status.published_node_ids) if entry.status else []
                published[entry.volume.volume_id] = nodes
            token = response.next_token
            if not token:
                return published

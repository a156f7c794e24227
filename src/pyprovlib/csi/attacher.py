"""The CSI attach handler and the external-attacher sidecar (``python -m pyprovlib.csi.attacher``).

:class:`CSIAttacher` is an :class:`~pyprovlib.attacher.Attacher` over a CSI driver's
ControllerPublishVolume / ControllerUnpublishVolume / ListVolumes (kubernetes-csi/
external-attacher's ``pkg/attacher``). The sidecar connects to the driver, reads its name and
capabilities, and runs an :class:`~pyprovlib.controller.attach.AttachController` with the CSI
handler when the driver has PUBLISH_UNPUBLISH_VOLUME, or with the trivial handler otherwise;
the reconciler runs when the driver has LIST_VOLUMES and LIST_VOLUMES_PUBLISHED_NODES.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Collection, Mapping, Sequence

from prometheus_client import REGISTRY

from pyprovlib._logging import get_logger
from pyprovlib.attacher import Attacher, AttachError, AttachNode, AttachVolume
from pyprovlib.controller.attach import AttachController
from pyprovlib.controller.attach_options import (
    DEFAULT_LEASE_DURATION,
    DEFAULT_RECONCILE_SYNC,
    DEFAULT_RENEW_DEADLINE,
    DEFAULT_RESYNC,
    DEFAULT_RETRY_INTERVAL_MAX,
    DEFAULT_RETRY_INTERVAL_START,
    DEFAULT_RETRY_PERIOD,
    DEFAULT_TIMEOUT,
    DEFAULT_WORKER_THREADS,
    AttachControllerOptions,
    lease_name,
)
from pyprovlib.csi._proto.csi import v1
from pyprovlib.csi._sidecar_controller import SidecarController, check_csi_address
from pyprovlib.csi.connection import (
    GO_STATUS_NAMES,
    ConnectionOptions,
    CSICallError,
    CSIConnection,
    CSIMetrics,
    default_csi_metrics,
)
from pyprovlib.kube.informer import SharedInformerFactory
from pyprovlib.runtime import (
    RuntimeArgumentParser,
    RuntimeContext,
    add_duration_flag,
    add_flag,
    common_parser,
    run,
)

__all__ = [
    "DEFAULT_CSI_ADDRESS",
    "AttacherSidecar",
    "CSIAttacher",
    "UnsupportedAccessModeError",
    "build",
    "build_controller",
    "csi_access_mode",
    "main",
    "parser",
    "volume_capability",
]

log = get_logger(__name__)

DEFAULT_CSI_ADDRESS = "/run/csi/socket"
"""external-attacher's ``--csi-address`` default."""

_Caps = v1.ControllerServiceCapabilityRpcType
_Mode = v1.VolumeCapabilityAccessModeMode


class UnsupportedAccessModeError(AttachError):
    """The PV's access modes have no CSI equivalent (e.g. ReadOnlyMany with ReadWriteOnce)."""


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
    mode = v1.VolumeCapabilityAccessMode(
        mode=csi_access_mode(volume.access_modes, single_node_multi_writer)
    )
    if volume.is_block:
        return v1.VolumeCapability(block=v1.VolumeCapabilityBlockVolume(), access_mode=mode)
    return v1.VolumeCapability(
        mount=v1.VolumeCapabilityMountVolume(
            fs_type=volume.fs_type, mount_flags=list(volume.mount_options)
        ),
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

    ``connection`` is an open :class:`~pyprovlib.csi.connection.CSIConnection`; the capability
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
        caps = connection.controller_capabilities
        self.connection = connection
        self.supports_publish_readonly = (
            _Caps.PUBLISH_READONLY in caps
            if supports_publish_readonly is None
            else supports_publish_readonly
        )
        self.supports_single_node_multi_writer = (
            _Caps.SINGLE_NODE_MULTI_WRITER in caps
            if supports_single_node_multi_writer is None
            else supports_single_node_multi_writer
        )
        self._lists = (
            _Caps.LIST_VOLUMES in caps and _Caps.LIST_VOLUMES_PUBLISHED_NODES in caps
            if supports_list_published_nodes is None
            else supports_list_published_nodes
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


# -- the sidecar ---------------------------------------------------------------------------------


def parser() -> RuntimeArgumentParser:
    """The sidecar's flags: the common ones plus external-attacher's, with its defaults."""
    p = common_parser(
        "csi-attacher",
        "Attaches CSI volumes to nodes: watches VolumeAttachments and calls the driver's "
        "ControllerPublishVolume/ControllerUnpublishVolume (external-attacher).",
        defaults={
            "worker_threads": DEFAULT_WORKER_THREADS,
            "leader_election_lease_duration": DEFAULT_LEASE_DURATION,
            "leader_election_renew_deadline": DEFAULT_RENEW_DEADLINE,
            "leader_election_retry_period": DEFAULT_RETRY_PERIOD,
        },
    )
    group = p.add_argument_group("attacher")
    add_flag(
        p,
        "--csi-address",
        default=DEFAULT_CSI_ADDRESS,
        help="address of the CSI driver socket",
        metavar="ADDRESS",
        group=group,
    )
    add_duration_flag(
        p, "--resync", default=DEFAULT_RESYNC, help="resync interval of the controller", group=group
    )
    add_duration_flag(
        p,
        "--timeout",
        default=DEFAULT_TIMEOUT,
        help="timeout for waiting for attaching or detaching the volume",
        group=group,
    )
    add_duration_flag(
        p,
        "--retry-interval-start",
        default=DEFAULT_RETRY_INTERVAL_START,
        help="initial retry interval of a failed attach or detach; it doubles with each "
        "failure, up to --retry-interval-max",
        group=group,
    )
    add_duration_flag(
        p,
        "--retry-interval-max",
        default=DEFAULT_RETRY_INTERVAL_MAX,
        help="maximum retry interval of a failed attach or detach",
        group=group,
    )
    add_duration_flag(
        p,
        "--reconcile-sync",
        default=DEFAULT_RECONCILE_SYNC,
        help="resync interval of the VolumeAttachment reconciler",
        group=group,
    )
    add_flag(
        p,
        "--default-fstype",
        default="",
        help="file system type of volumes to publish when their source names none",
        metavar="FSTYPE",
        group=group,
    )
    add_flag(
        p,
        "--max-entries",
        default=0,
        type=_non_negative,
        help="max entries per page in ListVolumes calls; 0 means no limit",
        metavar="N",
        group=group,
    )
    return p


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value}")
    return value


class AttacherSidecar(SidecarController[AttachController]):
    """The external-attacher sidecar's controller: a :class:`AttachController` run beside the CSI
    connection it depends on (a lost connection ends :meth:`run`, as upstream exits)."""


def build_controller(
    ctx: RuntimeContext,
    connection: CSIConnection,
    informer_factory: SharedInformerFactory | None = None,
) -> AttachController:
    """The AttachController from the parsed flags, on an open ``connection``: the CSI handler
    when the driver has PUBLISH_UNPUBLISH_VOLUME, the trivial one otherwise. Informers come
    from ``informer_factory`` when given (the caller starts it). Shared by this sidecar and
    ``python -m pyprovlib.csi``."""
    args = ctx.args
    driver = connection.driver_name
    caps = connection.controller_capabilities
    attacher: CSIAttacher | None = None
    if not connection.plugin_capabilities.controller_service:
        ctx.log.info("CSI driver has no Controller service: using the trivial handler")
    elif _Caps.PUBLISH_UNPUBLISH_VOLUME in caps:
        # --timeout per call: the connection may be shared with controllers whose differs.
        attacher = CSIAttacher(connection, max_entries=args.max_entries, timeout=args.timeout)
        ctx.log.info(
            "CSI driver supports ControllerPublishUnpublish: using the CSI handler",
            list_published_nodes=attacher.supports_list_published,
        )
    else:
        ctx.log.info(
            "CSI driver does not support ControllerPublishUnpublish: using the trivial handler"
        )
    options = ctx.options
    return AttachController(
        ctx.api_client,
        driver,
        attacher,
        AttachControllerOptions(
            resync_period=args.resync,
            timeout=args.timeout,
            worker_threads=options.worker_threads,
            retry_interval_start=args.retry_interval_start,
            retry_interval_max=args.retry_interval_max,
            reconcile_sync=args.reconcile_sync,
            default_fs_type=args.default_fstype,
            lease=lease_name(driver),
            **options.leader_election_fields(),
            registry=ctx.registry,
        ),
        informer_factory=informer_factory,
    )


async def build(ctx: RuntimeContext) -> AttacherSidecar:
    """Connect to the driver and build the sidecar from the parsed flags (external-attacher's
    ``main``)."""
    args = ctx.args
    metrics: CSIMetrics = (
        default_csi_metrics() if ctx.registry is REGISTRY else CSIMetrics(ctx.registry)
    )
    check_csi_address(args.csi_address)
    connection = await CSIConnection.open(
        args.csi_address,
        ConnectionOptions(timeout=args.timeout),
        metrics=metrics,
    )
    try:
        controller = build_controller(ctx, connection)
    except BaseException:
        connection.close()
        raise
    return AttacherSidecar(connection, controller)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pyprovlib.csi.attacher``: the external-attacher sidecar."""
    return run(build, argv=argv, parser=parser())


if __name__ == "__main__":
    sys.exit(main())

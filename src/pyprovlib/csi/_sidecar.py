"""The external-provisioner sidecar, ``python -m pyprovlib.csi.provisioner``: flags with
external-provisioner's names and defaults, the CSI connection, and a ProvisionController over
a :class:`~pyprovlib.csi.provisioner.CSIProvisioner`, run by :mod:`pyprovlib.runtime`."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence

from pyprovlib._logging import get_logger
from pyprovlib.controller.options import ProvisionControllerOptions
from pyprovlib.controller.provision import ProvisionController
from pyprovlib.csi._proto.csi import v1
from pyprovlib.csi._sidecar_controller import SidecarController, check_csi_address
from pyprovlib.csi.connection import (
    ConnectionOptions,
    CSIConnection,
)
from pyprovlib.csi.provisioner import CSIProvisioner, CSIProvisionerOptions
from pyprovlib.errors import PyprovlibError
from pyprovlib.kube.informer import SharedInformerFactory
from pyprovlib.kube.workqueue import ItemExponentialFailureRateLimiter
from pyprovlib.runtime import (
    RuntimeArgumentParser,
    RuntimeContext,
    add_bool_flag,
    add_duration_flag,
    add_flag,
    common_parser,
    run,
)

__all__ = [
    "CSIProvisionerController",
    "DriverUnsupportedError",
    "build_controller",
    "build_parser",
    "main",
    "make_controller",
]

PROG = "python -m pyprovlib.csi.provisioner"


class DriverUnsupportedError(PyprovlibError, RuntimeError):
    """The driver cannot provision: no Controller service or no CREATE_DELETE_VOLUME."""


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


def build_parser() -> RuntimeArgumentParser:
    """The runtime's common flags (``--worker-threads`` defaulting to 100, as upstream) plus
    external-provisioner's."""
    parser = common_parser(
        PROG,
        "Provisions PersistentVolumes through a CSI driver's CreateVolume/DeleteVolume "
        "(the Python counterpart of kubernetes-csi/external-provisioner).",
        defaults={"worker_threads": 100},
    )
    group = parser.add_argument_group("CSI provisioner")
    add_flag(
        parser,
        "--csi-address",
        default="/run/csi/socket",
        help="address of the CSI driver socket: unix:///path, /path or host:port",
        metavar="ADDRESS",
        group=group,
    )
    add_flag(
        parser,
        "--volume-name-prefix",
        default="pvc",
        help="prefix of the volume names passed to CreateVolume",
        metavar="PREFIX",
        group=group,
    )
    add_flag(
        parser,
        "--volume-name-uuid-length",
        default=-1,
        type=_int,
        help="claim-UID characters in the volume name, dashes removed (-1: the whole UID)",
        metavar="N",
        group=group,
    )
    add_duration_flag(
        parser,
        "--timeout",
        default=10.0,
        help="timeout of every call to the CSI driver",
        group=group,
    )
    add_duration_flag(
        parser,
        "--retry-interval-start",
        default=1.0,
        help="initial retry interval of a failed provisioning or deletion; it doubles with "
        "each failure up to --retry-interval-max",
        group=group,
    )
    add_duration_flag(
        parser,
        "--retry-interval-max",
        default=300.0,
        help="maximum retry interval of a failed provisioning or deletion",
        group=group,
    )
    add_bool_flag(
        parser,
        "--extra-create-metadata",
        default=False,
        help="pass csi.storage.k8s.io/pvc/name, pvc/namespace and pv/name to CreateVolume",
        group=group,
    )
    add_flag(
        parser,
        "--default-fstype",
        default="",
        help="fsType of filesystem volumes whose class names none (empty: the driver decides)",
        metavar="FSTYPE",
        group=group,
    )
    add_bool_flag(
        parser,
        "--strict-topology",
        default=False,
        help="with a selected node, require exactly the selected node's topology",
        group=group,
    )
    add_bool_flag(
        parser,
        "--immediate-topology",
        default=True,
        help="for Immediate binding, request the topology of all nodes with the driver",
        group=group,
    )
    add_bool_flag(
        parser,
        "--prevent-volume-mode-conversion",
        default=True,
        help="refuse to restore a VolumeSnapshot into a claim whose volumeMode differs from "
        "the snapshot's source volume, unless its VolumeSnapshotContent is annotated "
        "snapshot.storage.kubernetes.io/allow-volume-mode-change=true",
        group=group,
    )
    add_bool_flag(
        parser,
        "--provisioning-finalizer",
        default=True,
        help="hold claims with the pyprovlib.io/provisioning-protection finalizer while their "
        "volume is created, so a claim deleted meanwhile never leaks the volume, even across "
        "a restart (not in upstream; needs patch on persistentvolumeclaims)",
        group=group,
    )
    add_bool_flag(
        parser,
        "--exit-on-connection-loss",
        default=True,
        help="exit when the connection to the driver is lost, so the container restarts "
        "(as upstream); false: log it and reconnect once the driver is ready again",
        group=group,
    )
    return parser


class CSIProvisionerController(SidecarController[ProvisionController]):
    """Runs a ProvisionController, the informers it shares with the provisioner, the sweep of
    stale cloning- and snapshot-source protection finalizers, and watches the CSI connection;
    the runtime's Controller.

    With ``--exit-on-connection-loss`` a lost connection ends :meth:`run` with an error, so the
    process exits non-zero and is restarted.
    """

    def __init__(
        self,
        controller: ProvisionController,
        connection: CSIConnection,
        informer_factory: SharedInformerFactory,
        provisioner: CSIProvisioner,
    ) -> None:
        super().__init__(connection, controller)
        self.provisioner = provisioner
        self.informer_factory = informer_factory
        self._log = get_logger(__name__).bind(driver=connection.driver_name)

    def _start_background(self, tg: asyncio.TaskGroup) -> list[asyncio.Task[None]]:
        return [
            tg.create_task(self._run_informers()),
            tg.create_task(self.provisioner.run_clone_protection()),
        ]

    async def _run_informers(self) -> None:
        # The factory is shared by the controller and the provisioner, so it is ours to run.
        async with asyncio.TaskGroup() as group:
            self.informer_factory.start(group)
            await asyncio.Event().wait()  # until cancelled with the controller


def build_controller(
    ctx: RuntimeContext,
    connection: CSIConnection,
    informer_factory: SharedInformerFactory | None = None,
) -> tuple[ProvisionController, CSIProvisioner, SharedInformerFactory]:
    """The ProvisionController over a CSIProvisioner from the parsed flags, on an open
    ``connection``; informers come from ``informer_factory`` (a new one when None), which the
    caller starts. Shared by this sidecar and ``python -m pyprovlib.csi``."""
    args = ctx.args
    if not connection.plugin_capabilities.controller_service or (
        v1.ControllerServiceCapabilityRpcType.CREATE_DELETE_VOLUME
        not in connection.controller_capabilities
    ):
        raise DriverUnsupportedError(
            f"CSI driver {connection.driver_name} does not support dynamic provisioning: "
            "it reports no CONTROLLER_SERVICE or no CREATE_DELETE_VOLUME capability"
        )
    controller_options = ProvisionControllerOptions(
        threadiness=ctx.options.worker_threads,
        rate_limiter=ItemExponentialFailureRateLimiter(
            args.retry_interval_start, args.retry_interval_max
        ),
        retry_interval_max=args.retry_interval_max,
        provisioning_finalizer=args.provisioning_finalizer,
        **ctx.options.leader_election_fields(),
    )
    factory = informer_factory or SharedInformerFactory(
        ctx.api_client, resync_period=controller_options.resync_period
    )
    provisioner = CSIProvisioner(
        ctx.api_client,
        connection,
        CSIProvisionerOptions(
            volume_name_prefix=args.volume_name_prefix,
            volume_name_uuid_length=args.volume_name_uuid_length,
            default_fstype=args.default_fstype,
            extra_create_metadata=args.extra_create_metadata,
            strict_topology=args.strict_topology,
            immediate_topology=args.immediate_topology,
            prevent_volume_mode_conversion=args.prevent_volume_mode_conversion,
        ),
        informer_factory=factory,
    )
    controller = ProvisionController(
        ctx.api_client,
        connection.driver_name,
        provisioner,
        controller_options,
        informer_factory=factory,
    )
    provisioner.recorder = controller.recorder
    return controller, provisioner, factory


async def make_controller(ctx: RuntimeContext) -> CSIProvisionerController:
    """Connect to the driver (waiting for it, as upstream does), then build the controller."""
    args = ctx.args
    check_csi_address(args.csi_address)
    connection = await CSIConnection.open(
        args.csi_address,
        ConnectionOptions(
            timeout=args.timeout,
            exit_on_connection_loss=args.exit_on_connection_loss,
        ),
    )
    try:
        controller, provisioner, factory = build_controller(ctx, connection)
    except BaseException:
        connection.close()
        raise
    ctx.log.info(
        "CSI provisioner",
        driver=connection.driver_name,
        identity=provisioner.identity,
        csi_address=args.csi_address,
    )
    return CSIProvisionerController(controller, connection, factory, provisioner)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    return run(make_controller, argv=argv, parser=build_parser())

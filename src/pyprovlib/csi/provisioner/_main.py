"""The external-provisioner sidecar, ``python -m pyprovlib.csi.provisioner``: the CSI
connection, a ProvisionController over a
:class:`~pyprovlib.csi.provisioner.CSIProvisioner`, and beside it the
cloning-protection controller, the sweep of stale snapshot-source protection finalizers and,
with ``--enable-capacity``, the capacity controller, run by :mod:`pyprovlib.runtime`
(upstream's ``cmd/csi-provisioner``)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pyprovlib._errors import PyprovlibError
from pyprovlib._logging import get_logger
from pyprovlib.csi._connection import CSIConnection
from pyprovlib.csi._proto.csi import v1
from pyprovlib.csi._sidecar_controller import SidecarController, open_driver
from pyprovlib.csi.provisioner._capacity import (
    CapacitySetup,
    build_capacity_controller,
    resolve_capacity,
)
from pyprovlib.csi.provisioner._controller import CSIProvisioner
from pyprovlib.csi.provisioner._node_deployment import (
    LocalNode,
    check_node_deployment,
    local_node,
    node_deployment,
)
from pyprovlib.csi.provisioner._options import (
    build_parser,
    controller_options,
    provisioner_options,
)
from pyprovlib.kube._informer import SharedInformerFactory, strip_managed_fields
from pyprovlib.kube._workqueue import ItemExponentialFailureRateLimiter
from pyprovlib.runtime import RuntimeContext, run

if TYPE_CHECKING:
    from pyprovlib.controller._provision import ProvisionController

__all__ = [
    "CSIProvisionerController",
    "DriverUnsupportedError",
    "build_controller",
    "main",
    "make_controller",
]


class DriverUnsupportedError(PyprovlibError, RuntimeError):
    """The driver cannot provision: no Controller service or no CREATE_DELETE_VOLUME."""


class CSIProvisionerController(SidecarController["ProvisionController"]):
    """Runs a ProvisionController (with, beside its workers, the cloning-protection controller
    and the sweep of stale snapshot-source protection finalizers: see :func:`build_controller`)
    and the informers it shares with the provisioner, and watches the CSI connection; the
    runtime's Controller.

    With ``--exit-on-connection-loss`` a lost connection ends :meth:`run` with an error, so the
    process exits non-zero and is restarted. ``capacity`` (``--enable-capacity``) holds the
    capacity controller's own API client, closed when :meth:`run` returns.
    """

    def __init__(
        self,
        controller: ProvisionController,
        connection: CSIConnection,
        informer_factory: SharedInformerFactory,
        provisioner: CSIProvisioner,
        capacity: CapacitySetup | None = None,
    ) -> None:
        super().__init__(connection, controller)
        self.provisioner = provisioner
        self.informer_factory = informer_factory
        self.capacity = capacity
        self._log = get_logger(__name__).bind(driver=connection.driver_name)

    async def run(self) -> None:
        """Run until stopped or the connection is lost (see :class:`SidecarController`)."""
        try:
            await super().run()
        finally:
            if self.capacity is not None:
                await self.capacity.close()

    def _start_background(self, tg: asyncio.TaskGroup) -> list[asyncio.Task[None]]:
        return [tg.create_task(self._run_informers())]

    async def _run_informers(self) -> None:
        # The factory is shared by the controller and the provisioner, so it is ours to run.
        async with asyncio.TaskGroup() as group:
            self.informer_factory.start(group)
            await asyncio.Event().wait()  # until cancelled with the controller


def build_controller(
    ctx: RuntimeContext,
    connection: CSIConnection,
    informer_factory: SharedInformerFactory | None = None,
    *,
    capacity: CapacitySetup | None = None,
    node: LocalNode | None = None,
) -> tuple[ProvisionController, CSIProvisioner, SharedInformerFactory]:
    """The ProvisionController over a CSIProvisioner from the parsed flags, on an open
    ``connection``; informers come from ``informer_factory`` (a new one when None), which the
    caller starts. With ``node`` (from :func:`find_local_node`, for ``--node-deployment``) it
    provisions and deletes for that node only. Beside its workers (while it leads) run the
    cloning-protection controller (``--cloning-protection-threads`` workers; for drivers with
    CLONE_VOLUME), the sweep of stale snapshot-source protection finalizers and, with
    ``capacity`` (what :func:`resolve_capacity` found for ``--enable-capacity``), the capacity
    controller, which hears of every volume created or deleted (``provisioner.capacity``).
    Shared by this sidecar and ``python -m pyprovlib.csi``."""
    if not connection.plugin_capabilities.controller_service or (
        v1.ControllerServiceCapabilityRpcType.CREATE_DELETE_VOLUME
        not in connection.controller_capabilities
    ):
        raise DriverUnsupportedError(
            f"CSI driver {connection.driver_name} does not support dynamic provisioning: "
            "it reports no CONTROLLER_SERVICE or no CREATE_DELETE_VOLUME capability"
        )
    # Imported here: the resizer imports this package for its secret helpers, and must not
    # load the provisioning controller with it.
    from pyprovlib.controller._provision import ProvisionController

    options = controller_options(ctx)
    if node is not None:
        options = dataclasses.replace(
            options, node_deployment=node_deployment(ctx.args, node, connection)
        )
    factory = informer_factory or SharedInformerFactory(
        ctx.api_client, resync_period=options.resync_period, transform=strip_managed_fields
    )
    provisioner = CSIProvisioner(
        ctx.api_client,
        connection,
        provisioner_options(ctx.args),
        informer_factory=factory,
        local_node=node,
    )
    controller = ProvisionController(
        ctx.api_client,
        connection.driver_name,
        provisioner,
        options,
        informer_factory=factory,
    )
    provisioner.recorder = controller.recorder
    cloning_protection = provisioner.cloning_protection_controller(
        factory,
        workers=ctx.args.cloning_protection_threads,
        rate_limiter=ItemExponentialFailureRateLimiter(
            ctx.args.retry_interval_start, ctx.args.retry_interval_max
        ),
        registry=ctx.registry,
    )
    if cloning_protection is not None:
        controller.run_beside("cloning-protection", cloning_protection.run)
    controller.run_beside("snapshot-protection-sweep", provisioner.run_snapshot_protection)
    if getattr(ctx.args, "enable_capacity", False) and capacity is None:
        raise ValueError("--enable-capacity: resolve the capacity setup first (resolve_capacity)")
    if capacity is not None:
        capacity_controller = build_capacity_controller(
            ctx,
            connection,
            factory,
            capacity,
            node=None if node is None else node.name,
            node_segment=None if node is None else node.segments,
        )
        # Upstream runs it inside the leader's run, as the cloning-protection controller.
        controller.run_beside("capacity", capacity_controller.run)
        provisioner.capacity = capacity_controller
    return controller, provisioner, factory


async def find_local_node(
    ctx: RuntimeContext, connection: CSIConnection, *, leader_election: bool
) -> LocalNode | None:
    """With ``--node-deployment``: this node (``NODE_NAME``) as the driver describes it
    (``NodeGetInfo``); None without. Raises
    :class:`~pyprovlib.csi.provisioner._node_deployment.NodeDeploymentError` when ``NODE_NAME``
    is missing or ``leader_election`` is on."""
    name = check_node_deployment(ctx.args, leader_election=leader_election)
    if name is None:
        return None
    node = await local_node(connection, name)
    ctx.log.info("node deployment", node=node.name, node_id=node.node_id, topology=node.segments)
    return node


async def make_controller(ctx: RuntimeContext) -> CSIProvisionerController:
    """Connect to the driver (waiting for it, as upstream does), then build the controller."""
    args = ctx.args
    # Before waiting for the driver: a missing NODE_NAME, $NAMESPACE or owner fails at once.
    check_node_deployment(args, leader_election=ctx.options.leader_election)
    capacity = await resolve_capacity(ctx)
    connection = None
    try:
        connection = await open_driver(ctx, exit_on_connection_loss=args.exit_on_connection_loss)
        node = await find_local_node(ctx, connection, leader_election=ctx.options.leader_election)
        controller, provisioner, factory = build_controller(
            ctx, connection, node=node, capacity=capacity
        )
    except BaseException:
        if connection is not None:
            connection.close()
        if capacity is not None:
            await capacity.close()
        raise
    ctx.log.info(
        "CSI provisioner",
        driver=connection.driver_name,
        identity=provisioner.identity,
        csi_address=args.csi_address,
    )
    return CSIProvisionerController(controller, connection, factory, provisioner, capacity)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    return run(make_controller, argv=argv, parser=build_parser())

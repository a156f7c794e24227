"""The external-resizer sidecar, ``python -m pyprovlib.csi.resizer`` (upstream's
``cmd/csi-resizer``): connect to the driver, build the
:class:`~pyprovlib.ResizeController` with the resizer its capabilities call
for and the :class:`~pyprovlib.ModifyController` with its modifier, and run
both on one set of informers under the resizer's one Lease (``external-resizer-<driver>``),
beside the connection, through :mod:`pyprovlib.runtime`. A driver that can neither expand nor
modify volumes is refused at start-up; one that can only modify gets the modify controller
alone, one that can only expand gets a modify controller that tells the users who ask for
another VolumeAttributesClass that the driver cannot apply it (as upstream's newest)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TypeVar

from pyprovlib._modifier import Modifier
from pyprovlib._resizer import Resizer
from pyprovlib.controller._modify import ModifyController
from pyprovlib.controller._resize import ResizeController
from pyprovlib.controller._resize.options import lease_name
from pyprovlib.csi._connection import CSIConnection
from pyprovlib.csi._controller_group import ControllerGroup, GroupOptions
from pyprovlib.csi._sidecar_cli import build_on_driver
from pyprovlib.csi._sidecar_controller import SidecarController
from pyprovlib.csi.resizer._controller import CSIResizer, DriverCannotExpandError, choose_resizer
from pyprovlib.csi.resizer._modifier import CSIModifier, choose_modifier
from pyprovlib.csi.resizer._options import controller_options, modify_controller_options, parser
from pyprovlib.kube._informer import SharedInformerFactory, strip_managed_fields
from pyprovlib.runtime import Controller, RuntimeContext, run

__all__ = [
    "ResizerSidecar",
    "build",
    "build_controller",
    "build_controllers",
    "build_modify_controller",
    "main",
]


class ResizerSidecar(SidecarController[ControllerGroup]):
    """The external-resizer sidecar's controllers (:attr:`resize_controller`,
    :attr:`modify_controller`) run as one beside the CSI connection they depend on (a lost
    connection ends :meth:`run`, as upstream exits)."""

    @property
    def resize_controller(self) -> ResizeController[Resizer] | None:
        """The expansion controller; None for a driver that can only modify volumes."""
        controller = self.controller.controllers.get("resizer")
        return controller if isinstance(controller, ResizeController) else None

    @property
    def modify_controller(self) -> ModifyController[Modifier] | None:
        """The VolumeAttributesClass controller."""
        controller = self.controller.controllers.get("modify")
        return controller if isinstance(controller, ModifyController) else None


BackendT = TypeVar("BackendT", Resizer, Modifier)


def _with_call_timeout(ctx: RuntimeContext, backend: BackendT) -> BackendT:
    """``backend``, given ``--timeout`` per call when it calls the driver: the connection may
    be shared with controllers whose timeout differs."""
    if isinstance(backend, (CSIResizer, CSIModifier)):
        backend.timeout = ctx.args.timeout
    return backend


def build_controller(
    ctx: RuntimeContext,
    connection: CSIConnection,
    informer_factory: SharedInformerFactory | None = None,
) -> ResizeController[Resizer]:
    """The ResizeController from the parsed flags, on an open ``connection``
    (:func:`~pyprovlib.csi.resizer._controller.choose_resizer` picks the resizer, and raises
    :class:`~pyprovlib.csi.resizer.DriverCannotExpandError` for a driver that expands nowhere).
    Informers come from ``informer_factory`` when given (the caller starts it)."""
    resizer = _with_call_timeout(ctx, choose_resizer(connection, ctx.api_client))
    return ResizeController(
        ctx.api_client,
        resizer,
        controller_options(ctx, resizer.name),
        informer_factory=informer_factory,
    )


def build_modify_controller(
    ctx: RuntimeContext,
    connection: CSIConnection,
    informer_factory: SharedInformerFactory | None = None,
) -> ModifyController[Modifier]:
    """The ModifyController from the parsed flags, on an open ``connection``
    (:func:`~pyprovlib.csi.resizer.choose_modifier` picks the modifier)."""
    modifier = _with_call_timeout(ctx, choose_modifier(connection, ctx.api_client))
    return ModifyController(
        ctx.api_client,
        modifier,
        modify_controller_options(ctx, modifier.name),
        informer_factory=informer_factory,
    )


def build_controllers(
    ctx: RuntimeContext,
    connection: CSIConnection,
    informer_factory: SharedInformerFactory | None = None,
    *,
    modify_ctx: RuntimeContext | None = None,
) -> dict[str, Controller]:
    """The sidecar's controllers by name (``resizer``, ``modify``), as upstream's ``main``
    chooses them; raises :class:`~pyprovlib.csi.resizer.DriverCannotExpandError` for a driver
    that can neither expand nor modify volumes. Shared by this sidecar and
    ``python -m pyprovlib.csi``, which builds the modify controller on ``modify_ctx`` (its own
    API client) when given."""
    controllers: dict[str, Controller] = {}
    cannot_expand: DriverCannotExpandError | None = None
    try:
        controllers["resizer"] = build_controller(ctx, connection, informer_factory)
    except DriverCannotExpandError as err:
        cannot_expand = err
    modify = build_modify_controller(modify_ctx or ctx, connection, informer_factory)
    if cannot_expand is not None:
        if not modify.modifier.modify_supported:
            raise DriverCannotExpandError(
                f"{cannot_expand}, nor does it modify volumes (the MODIFY_VOLUME controller "
                "capability)"
            ) from None
        ctx.log.info(
            "the CSI driver cannot expand volumes: modifying only", reason=str(cannot_expand)
        )
    controllers["modify"] = modify
    return controllers


async def build(ctx: RuntimeContext) -> ResizerSidecar:
    """Connect to the driver and build the sidecar from the parsed flags (external-resizer's
    ``main``)."""

    def make(ctx: RuntimeContext, connection: CSIConnection) -> ControllerGroup:
        factory = SharedInformerFactory(
            ctx.api_client, resync_period=ctx.args.resync_period, transform=strip_managed_fields
        )
        # Each controller without leader election of its own: the group holds the one Lease.
        alone = dataclasses.replace(
            ctx, options=dataclasses.replace(ctx.options, leader_election=False)
        )
        controllers = build_controllers(alone, connection, factory)
        return ControllerGroup(
            ctx.api_client,
            factory,
            controllers,
            GroupOptions(
                resync_period=ctx.args.resync_period, **ctx.options.leader_election_fields()
            ),
            role="external resizer",
            lease=lease_name(connection.driver_name),
            log=ctx.log.bind(driver=connection.driver_name),
        )

    connection, group = await build_on_driver(ctx, make)
    sidecar = ResizerSidecar(connection, group)
    resize, modify = sidecar.resize_controller, sidecar.modify_controller
    ctx.log.info(
        "CSI resizer",
        driver=connection.driver_name,
        resizer=type(resize.resizer).__name__ if resize is not None else None,
        modifier=type(modify.modifier).__name__ if modify is not None else None,
        csi_address=ctx.args.csi_address,
    )
    return sidecar


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pyprovlib.csi.resizer``: the external-resizer sidecar."""
    return run(build, argv=argv, parser=parser())

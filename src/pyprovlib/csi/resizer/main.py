"""The external-resizer sidecar, ``python -m pyprovlib.csi.resizer`` (upstream's
``cmd/csi-resizer``): connect to the driver, pick the CSI or the trivial resizer from its
capabilities (refusing to start when it can expand neither way), and run a
:class:`~pyprovlib.controller.resize.ResizeController` beside the connection through
:mod:`pyprovlib.runtime`."""

from __future__ import annotations

from collections.abc import Sequence

from pyprovlib.controller.resize import ResizeController
from pyprovlib.csi._sidecar_cli import build_on_driver
from pyprovlib.csi._sidecar_controller import SidecarController
from pyprovlib.csi.connection import (
    CSIConnection,
)
from pyprovlib.csi.resizer.controller import CSIResizer, choose_resizer
from pyprovlib.csi.resizer.options import controller_options, parser
from pyprovlib.kube.informer import SharedInformerFactory
from pyprovlib.resizer import Resizer
from pyprovlib.runtime import RuntimeContext, run

__all__ = ["ResizerSidecar", "build", "build_controller", "main"]


class ResizerSidecar(SidecarController[ResizeController[Resizer]]):
    """The external-resizer sidecar's controller: a :class:`ResizeController` run beside the CSI
    connection it depends on (a lost connection ends :meth:`run`, as upstream exits)."""


def build_controller(
    ctx: RuntimeContext,
    connection: CSIConnection,
    informer_factory: SharedInformerFactory | None = None,
) -> ResizeController[Resizer]:
    """The ResizeController from the parsed flags, on an open ``connection``
    (:func:`~pyprovlib.csi.resizer.controller.choose_resizer` picks the resizer). Informers
    come from ``informer_factory`` when given (the caller starts it). Shared by this sidecar
    and ``python -m pyprovlib.csi``."""
    resizer = choose_resizer(connection, ctx.api_client)
    if isinstance(resizer, CSIResizer):
        # --timeout per call: the connection may be shared with controllers whose differs.
        resizer.timeout = ctx.args.timeout
    return ResizeController(
        ctx.api_client,
        resizer,
        controller_options(ctx, resizer.name),
        informer_factory=informer_factory,
    )


async def build(ctx: RuntimeContext) -> ResizerSidecar:
    """Connect to the driver and build the sidecar from the parsed flags (external-resizer's
    ``main``)."""
    connection, controller = await build_on_driver(ctx, build_controller)
    ctx.log.info(
        "CSI resizer",
        driver=connection.driver_name,
        resizer=type(controller.resizer).__name__,
        csi_address=ctx.args.csi_address,
    )
    return ResizerSidecar(connection, controller)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pyprovlib.csi.resizer``: the external-resizer sidecar."""
    return run(build, argv=argv, parser=parser())

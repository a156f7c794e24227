"""The external-attacher sidecar, ``python -m pyprovlib.csi.attacher`` (upstream's
``cmd/csi-attacher``): connect to the driver, pick the CSI or the trivial handler from its
capabilities, and run an :class:`~pyprovlib.AttachController` beside the
connection through :mod:`pyprovlib.runtime`."""

from __future__ import annotations

from collections.abc import Sequence

from pyprovlib.controller._attach import AttachController
from pyprovlib.csi._connection import (
    CSIConnection,
)
from pyprovlib.csi._proto.csi import v1
from pyprovlib.csi._sidecar_cli import build_on_driver
from pyprovlib.csi._sidecar_controller import SidecarController
from pyprovlib.csi.attacher._controller import CSIAttacher
from pyprovlib.csi.attacher._options import controller_options, parser
from pyprovlib.kube._informer import SharedInformerFactory
from pyprovlib.runtime import RuntimeContext, run

__all__ = ["AttacherSidecar", "build", "build_controller", "main"]

_Caps = v1.ControllerServiceCapabilityRpcType


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
    return AttachController(
        ctx.api_client,
        driver,
        attacher,
        controller_options(ctx, driver),
        informer_factory=informer_factory,
    )


async def build(ctx: RuntimeContext) -> AttacherSidecar:
    """Connect to the driver and build the sidecar from the parsed flags (external-attacher's
    ``main``)."""
    connection, controller = await build_on_driver(ctx, build_controller)
    return AttacherSidecar(connection, controller)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pyprovlib.csi.attacher``: the external-attacher sidecar."""
    return run(build, argv=argv, parser=parser())

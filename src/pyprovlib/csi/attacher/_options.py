"""The external-attacher sidecar's flags and the options they make (upstream's
``cmd/csi-attacher``): :func:`parser` and :func:`controller_options`, the one place where a flag
becomes an :class:`~pyprovlib.AttachControllerOptions` field."""

from __future__ import annotations

from pyprovlib.controller._attach.options import (
    AttachControllerOptions,
    lease_name,
)
from pyprovlib.csi._sidecar_cli import DEFAULT_CSI_ADDRESS, sidecar_option_fields, sidecar_parser
from pyprovlib.runtime import (
    RuntimeArgumentParser,
    RuntimeContext,
    add_flag,
    attach_controller_options,
)
from pyprovlib.runtime._flag_parser import add_duration_flag
from pyprovlib.runtime._flag_values import parse_non_negative_int

__all__ = ["DEFAULT_CSI_ADDRESS", "controller_options", "parser"]

_DEFAULTS = AttachControllerOptions()


def parser() -> RuntimeArgumentParser:
    """The sidecar's flags: the common ones plus external-attacher's, with its defaults."""
    p, group = sidecar_parser(
        "csi-attacher",
        "Attaches CSI volumes to nodes: watches VolumeAttachments and calls the driver's "
        "ControllerPublishVolume/ControllerUnpublishVolume (external-attacher).",
        title="attacher",
        defaults=_DEFAULTS,
        resync=("--resync", "resync interval of the controller"),
        timeout_help="timeout for waiting for attaching or detaching the volume",
        retried="a failed attach or detach",
    )
    add_duration_flag(
        p,
        "--reconcile-sync",
        default=_DEFAULTS.reconcile_sync,
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
        type=parse_non_negative_int,
        help="max entries per page in ListVolumes calls; 0 means no limit",
        metavar="N",
        group=group,
    )
    return p


def controller_options(ctx: RuntimeContext, driver: str) -> AttachControllerOptions:
    """The AttachController's options from the parsed flags, for the CSI driver ``driver``."""
    args = ctx.args
    return attach_controller_options(
        ctx.options,
        **sidecar_option_fields(ctx, resync_period=args.resync),
        reconcile_sync=args.reconcile_sync,
        default_fs_type=args.default_fstype,
        lease=lease_name(driver),
    )

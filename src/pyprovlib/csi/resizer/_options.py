"""The external-resizer sidecar's flags and the options they make (upstream's
``cmd/csi-resizer``): :func:`parser`, :func:`controller_options` and
:func:`modify_controller_options`, the one place where a flag becomes a
:class:`~pyprovlib.ResizeControllerOptions` or
:class:`~pyprovlib.ModifyControllerOptions` field (the modify controller takes
the resizer's flags, as upstream, and ``--extra-modify-metadata``)."""

from __future__ import annotations

import argparse
import dataclasses

from pyprovlib.controller._modify.options import ModifyControllerOptions
from pyprovlib.controller._resize.options import (
    ResizeControllerOptions,
    lease_name,
)
from pyprovlib.controller._sidecar_options import SidecarControllerOptions
from pyprovlib.csi._sidecar_cli import DEFAULT_CSI_ADDRESS, sidecar_option_fields, sidecar_parser
from pyprovlib.runtime import RuntimeArgumentParser, RuntimeContext, resize_controller_options
from pyprovlib.runtime._flag_parser import add_bool_flag
from pyprovlib.runtime._flag_values import parse_positive_int

__all__ = ["DEFAULT_CSI_ADDRESS", "controller_options", "modify_controller_options", "parser"]

_DEFAULTS = ResizeControllerOptions()


def parser() -> RuntimeArgumentParser:
    """The sidecar's flags: the common ones plus external-resizer's, with its defaults."""
    p, group = sidecar_parser(
        "csi-resizer",
        "Expands and modifies CSI volumes: watches PersistentVolumeClaims whose storage request "
        "grew, or whose VolumeAttributesClass changed, and calls the driver's "
        "ControllerExpandVolume or ControllerModifyVolume (external-resizer).",
        title="resizer",
        defaults=_DEFAULTS,
        resync=("--resync-period", "resync period for cache"),
        timeout_help="timeout of every call to the CSI driver",
        retried="failed volume resize",
    )
    add_bool_flag(
        p,
        "--handle-volume-inuse-error",
        default=_DEFAULTS.handle_volume_in_use_error,
        help="after the driver refused to expand a volume in use, wait until no pod uses it",
        group=group,
    )
    add_bool_flag(
        p,
        "--extra-modify-metadata",
        default=False,
        help="add the claim's name and namespace and the volume's name to the parameters of "
        "every ControllerModifyVolume (csi.storage.k8s.io/pvc/name, csi.storage.k8s.io/pvc/"
        "namespace, csi.storage.k8s.io/pv/name)",
        group=group,
    )
    group.add_argument(
        "--workers",
        dest="worker_threads",
        type=parse_positive_int,
        default=argparse.SUPPRESS,
        metavar="N",
        help="external-resizer's name of --worker-threads: concurrency to process multiple "
        "resize requests",
    )
    return p


def controller_options(ctx: RuntimeContext, resizer_name: str) -> ResizeControllerOptions:
    """The ResizeController's options from the parsed flags, for the resizer ``resizer_name``
    (the CSI driver's name)."""
    args = ctx.args
    return resize_controller_options(
        ctx.options,
        **sidecar_option_fields(ctx, resync_period=args.resync_period),
        handle_volume_in_use_error=args.handle_volume_inuse_error,
        lease=lease_name(resizer_name),
    )


def modify_controller_options(ctx: RuntimeContext, modifier_name: str) -> ModifyControllerOptions:
    """The ModifyController's options from the parsed flags, for the modifier
    ``modifier_name`` (the CSI driver's name): the resizer's (resync, timeout, workers, retry
    intervals, leader election and its Lease, metrics registry) and ``--extra-modify-metadata``."""
    resize = controller_options(ctx, modifier_name)
    return ModifyControllerOptions(
        **{name: getattr(resize, name) for name in _SHARED_FIELDS},
        extra_modify_metadata=bool(ctx.args.extra_modify_metadata),
    )


_SHARED_FIELDS = frozenset(f.name for f in dataclasses.fields(SidecarControllerOptions)) | {
    "resync_period",
    "timeout",
    "workers",
    "retry_interval_start",
    "retry_interval_max",
}

"""The external-resizer sidecar's flags and the options they make (upstream's
``cmd/csi-resizer``): :func:`parser` and :func:`controller_options`, the one place where a flag
becomes a :class:`~pyprovlib.controller.resize_options.ResizeControllerOptions` field."""

from __future__ import annotations

import argparse

from pyprovlib.controller.resize_options import (
    DEFAULT_LEASE_DURATION,
    DEFAULT_RENEW_DEADLINE,
    DEFAULT_RESYNC,
    DEFAULT_RETRY_INTERVAL_MAX,
    DEFAULT_RETRY_INTERVAL_START,
    DEFAULT_RETRY_PERIOD,
    DEFAULT_TIMEOUT,
    DEFAULT_WORKERS,
    ResizeControllerOptions,
    lease_name,
)
from pyprovlib.runtime import (
    RuntimeArgumentParser,
    RuntimeContext,
    add_bool_flag,
    add_duration_flag,
    add_flag,
    common_parser,
    resize_controller_options,
)

__all__ = ["DEFAULT_CSI_ADDRESS", "controller_options", "parser"]

DEFAULT_CSI_ADDRESS = "/run/csi/socket"
"""external-resizer's ``--csi-address`` default."""


def parser() -> RuntimeArgumentParser:
    """The sidecar's flags: the common ones plus external-resizer's, with its defaults."""
    p = common_parser(
        "csi-resizer",
        "Expands CSI volumes: watches PersistentVolumeClaims whose storage request grew and "
        "calls the driver's ControllerExpandVolume (external-resizer).",
        defaults={
            "worker_threads": DEFAULT_WORKERS,
            "leader_election_lease_duration": DEFAULT_LEASE_DURATION,
            "leader_election_renew_deadline": DEFAULT_RENEW_DEADLINE,
            "leader_election_retry_period": DEFAULT_RETRY_PERIOD,
        },
    )
    group = p.add_argument_group("resizer")
    add_flag(
        p,
        "--csi-address",
        default=DEFAULT_CSI_ADDRESS,
        help="address of the CSI driver socket",
        metavar="ADDRESS",
        group=group,
    )
    add_duration_flag(
        p,
        "--resync-period",
        default=DEFAULT_RESYNC,
        help="resync period for cache",
        group=group,
    )
    add_duration_flag(
        p,
        "--timeout",
        default=DEFAULT_TIMEOUT,
        help="timeout of every call to the CSI driver",
        group=group,
    )
    add_duration_flag(
        p,
        "--retry-interval-start",
        default=DEFAULT_RETRY_INTERVAL_START,
        help="initial retry interval of failed volume resize; it doubles with each failure, "
        "up to --retry-interval-max",
        group=group,
    )
    add_duration_flag(
        p,
        "--retry-interval-max",
        default=DEFAULT_RETRY_INTERVAL_MAX,
        help="maximum retry interval of failed volume resize",
        group=group,
    )
    add_bool_flag(
        p,
        "--handle-volume-inuse-error",
        default=True,
        help="after the driver refused to expand a volume in use, wait until no pod uses it",
        group=group,
    )
    group.add_argument(
        "--workers",
        dest="worker_threads",
        type=_positive,
        default=argparse.SUPPRESS,
        metavar="N",
        help="external-resizer's name of --worker-threads: concurrency to process multiple "
        "resize requests",
    )
    return p


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def controller_options(ctx: RuntimeContext, resizer_name: str) -> ResizeControllerOptions:
    """The ResizeController's options from the parsed flags, for the resizer ``resizer_name``
    (the CSI driver's name)."""
    args = ctx.args
    options = ctx.options
    return resize_controller_options(
        options,
        resync_period=args.resync_period,
        timeout=args.timeout,
        retry_interval_start=args.retry_interval_start,
        retry_interval_max=args.retry_interval_max,
        handle_volume_in_use_error=args.handle_volume_inuse_error,
        lease=lease_name(resizer_name),
        registry=ctx.registry,
    )

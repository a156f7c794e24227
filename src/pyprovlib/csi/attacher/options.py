"""The external-attacher sidecar's flags and the options they make (upstream's
``cmd/csi-attacher``): :func:`parser` and :func:`controller_options`, the one place where a flag
becomes an :class:`~pyprovlib.controller.attach_options.AttachControllerOptions` field."""

from __future__ import annotations

import argparse

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
from pyprovlib.runtime import (
    RuntimeArgumentParser,
    RuntimeContext,
    add_duration_flag,
    add_flag,
    attach_controller_options,
    common_parser,
)

__all__ = ["DEFAULT_CSI_ADDRESS", "controller_options", "parser"]

DEFAULT_CSI_ADDRESS = "/run/csi/socket"
"""external-attacher's ``--csi-address`` default."""


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


def controller_options(ctx: RuntimeContext, driver: str) -> AttachControllerOptions:
    """The AttachController's options from the parsed flags, for the CSI driver ``driver``."""
    args = ctx.args
    options = ctx.options
    return attach_controller_options(
        options,
        resync_period=args.resync,
        timeout=args.timeout,
        retry_interval_start=args.retry_interval_start,
        retry_interval_max=args.retry_interval_max,
        reconcile_sync=args.reconcile_sync,
        default_fs_type=args.default_fstype,
        lease=lease_name(driver),
        registry=ctx.registry,
    )

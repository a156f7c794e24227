"""What the CSI sidecars' command lines share, written once: the flags external-attacher and
external-resizer both take from csi-lib-utils' conventions (``--csi-address``, a resync
period, ``--timeout``, ``--retry-interval-start``/``--retry-interval-max``, the Lease
timings), the option fields those flags set, and the connect-then-build step of every
sidecar's ``main``."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from pyprovlib.csi._connection import CSIConnection
from pyprovlib.csi._sidecar_controller import open_driver
from pyprovlib.runtime import RuntimeArgumentParser, RuntimeContext, add_flag, common_parser
from pyprovlib.runtime._flag_parser import ENV_PREFIX, add_duration_flag

if TYPE_CHECKING:
    from pyprovlib.controller._attach.options import AttachControllerOptions
    from pyprovlib.controller._resize.options import ResizeControllerOptions

__all__ = ["DEFAULT_CSI_ADDRESS", "build_on_driver", "sidecar_option_fields", "sidecar_parser"]

DEFAULT_CSI_ADDRESS = "/run/csi/socket"
"""The sidecars' ``--csi-address`` default."""

T = TypeVar("T")


def sidecar_parser(
    prog: str,
    description: str,
    *,
    title: str,
    defaults: AttachControllerOptions | ResizeControllerOptions,
    resync: tuple[str, str],
    timeout_help: str,
    retried: str,
) -> tuple[RuntimeArgumentParser, argparse._ArgumentGroup]:
    """The common flags, then, in the group ``title``, the flags the attacher and the resizer
    share: ``--csi-address``, the resync flag (``resync``: its name and help), ``--timeout``
    and the retry intervals of ``retried`` (what is retried, e.g. "a failed attach or
    detach"). Their defaults are those of the sidecar's controller options (``defaults``, an
    instance with its class's defaults), so a flag and its option cannot disagree; the worker
    count too (``workers``, set by ``--worker-threads``). Returns the parser and the
    group, for the sidecar's own flags."""
    parser = common_parser(
        prog,
        description,
        env_prefix=ENV_PREFIX,
        defaults={
            "worker_threads": defaults.workers,
            "leader_election_lease_duration": defaults.lease_duration,
            "leader_election_renew_deadline": defaults.renew_deadline,
            "leader_election_retry_period": defaults.retry_period,
        },
    )
    group = parser.add_argument_group(title)
    add_flag(
        parser,
        "--csi-address",
        default=DEFAULT_CSI_ADDRESS,
        help="address of the CSI driver socket",
        metavar="ADDRESS",
        group=group,
    )
    resync_flag, resync_help = resync
    add_duration_flag(
        parser, resync_flag, default=defaults.resync_period, help=resync_help, group=group
    )
    add_duration_flag(parser, "--timeout", default=defaults.timeout, help=timeout_help, group=group)
    add_duration_flag(
        parser,
        "--retry-interval-start",
        default=defaults.retry_interval_start,
        help=f"initial retry interval of {retried}; it doubles with each failure, "
        "up to --retry-interval-max",
        group=group,
    )
    add_duration_flag(
        parser,
        "--retry-interval-max",
        default=defaults.retry_interval_max,
        help=f"maximum retry interval of {retried}",
        group=group,
    )
    return parser, group


def sidecar_option_fields(ctx: RuntimeContext, *, resync_period: float) -> dict[str, Any]:
    """The controller option fields the shared flags set (``resync_period`` read from the
    sidecar's own resync flag), and the context's metrics registry."""
    args = ctx.args
    return {
        "resync_period": resync_period,
        "timeout": args.timeout,
        "retry_interval_start": args.retry_interval_start,
        "retry_interval_max": args.retry_interval_max,
        "registry": ctx.registry,
    }


async def build_on_driver(
    ctx: RuntimeContext,
    build: Callable[[RuntimeContext, CSIConnection], T],
    **connection_options: Any,
) -> tuple[CSIConnection, T]:
    """Connect to the driver (:func:`~pyprovlib.csi._sidecar_controller.open_driver`, with
    further ``connection_options``), then ``build(ctx, connection)``; the connection is
    closed again when building fails."""
    connection = await open_driver(ctx, **connection_options)
    try:
        return connection, build(ctx, connection)
    except BaseException:
        connection.close()
        raise

"""Command line of the hostpath CSI driver: the Go hostpathplugin's flags where they overlap
(``--endpoint``, ``--nodeid``, ``--drivername``, ``--statedir``, ``--enable-attach``,
``--maxvolumespernode``, ``--enable-controller-modify-volume``,
``--accepted-mutable-parameter-names``), plus ``--capacity``, ``--max-volume-size``,
``--log-format`` and ``--log-level``. Runs until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Sequence

from pyprovlib.csi.server import CSIServer, unix_socket_path
from pyprovlib.examples._paths import UnsafePathError, validate_base_path
from pyprovlib.examples.csi_hostpath.driver import (
    DEFAULT_MUTABLE_PARAMETERS,
    TIB,
    Driver,
    DriverOptions,
    HostPathController,
    HostPathGroupController,
    HostPathIdentity,
    HostPathNode,
)
from pyprovlib.examples.csi_hostpath.mounter import MOUNT_MODES
from pyprovlib.kube.quantity import parse_quantity
from pyprovlib.runtime.logging import configure_logging, get_logger

__all__ = ["build_parser", "main", "serve"]

log = get_logger("pyprovlib.examples.csi_hostpath")


def _bool(text: str) -> bool:
    # Go's strconv.ParseBool, as the Go driver's flags read it.
    if text in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if text in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    raise argparse.ArgumentTypeError(f"invalid boolean {text!r} (use true or false)")


def _bytes(text: str) -> int:
    try:
        value = parse_quantity(text).value()
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive size")
    return value


def _names(text: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in text.split(",") if name.strip())


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (``--help`` lists the flags)."""
    parser = argparse.ArgumentParser(
        allow_abbrev=False,
        prog="python -m pyprovlib.examples.csi_hostpath",
        description="A hostpath CSI driver (Identity, Controller, Node) on pyprovlib.csi.server.",
    )
    parser.add_argument(
        "--endpoint", default="unix:///tmp/csi.sock", help="CSI endpoint: unix:///abs/path"
    )
    parser.add_argument("--nodeid", required=True, help="this node's id (NodeGetInfo, topology)")
    parser.add_argument(
        "--drivername", default="hostpath.csi.k8s.io", help="name of the driver (GetPluginInfo)"
    )
    parser.add_argument(
        "--statedir",
        default="/csi-data-dir",
        help="directory for the state, volumes and snapshots, kept across restarts",
    )
    parser.add_argument(
        "--enable-attach",
        type=_bool,
        nargs="?",
        const=True,
        default=False,
        help="serve ControllerPublish/Unpublish (PUBLISH_UNPUBLISH_VOLUME)",
    )
    parser.add_argument(
        "--maxvolumespernode", type=int, default=0, help="volume limit reported by NodeGetInfo"
    )
    parser.add_argument(
        "--capacity",
        type=_bytes,
        default=TIB,
        help="total bytes the driver offers (a quantity, e.g. 100Gi; default 1Ti)",
    )
    parser.add_argument(
        "--max-volume-size",
        type=_bytes,
        default=TIB,
        help="largest volume (a quantity; default 1Ti)",
    )
    parser.add_argument(
        "--enable-controller-modify-volume",
        type=_bool,
        nargs="?",
        const=True,
        default=True,
        help="serve ControllerModifyVolume (MODIFY_VOLUME): VolumeAttributesClasses "
        "(default: true; the Go driver's default is false)",
    )
    parser.add_argument(
        "--accepted-mutable-parameter-names",
        type=_names,
        default=DEFAULT_MUTABLE_PARAMETERS,
        metavar="NAMES",
        help="comma-separated mutable parameters (VolumeAttributesClass keys) the driver "
        "accepts; any other is refused as invalid (a claim asking for it shows Infeasible). "
        f"Empty: every key, as the Go driver without the flag (default: "
        f"{','.join(DEFAULT_MUTABLE_PARAMETERS)})",
    )
    parser.add_argument(
        "--mount",
        default="record",
        choices=list(MOUNT_MODES),
        help="node staging and publishing: 'record' creates and records the directories "
        "only (unprivileged: csi-sanity, sidecar tests); 'bind' bind-mounts the volume there, "
        "as a node plugin for a real kubelet (needs root) (default: record)",
    )
    parser.add_argument("--log-format", default="auto", choices=["auto", "json", "console"])
    parser.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"]
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    return parser


async def serve(options: DriverOptions, endpoint: str, stop: asyncio.Event | None = None) -> None:
    """Serve the driver on ``endpoint`` until ``stop`` is set (or SIGTERM/SIGINT)."""
    driver = await Driver.open(options)
    services = [
        HostPathIdentity(options),
        HostPathController(driver),
        HostPathGroupController(driver),
        HostPathNode(driver),
    ]
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, stop.set)
    async with CSIServer(services, endpoint):
        log.info(
            "hostpath CSI driver serving",
            driver=options.drivername,
            node=options.nodeid,
            statedir=options.statedir,
        )
        await stop.wait()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.version:
        print(DriverOptions().vendor_version)
        return 0
    try:
        unix_socket_path(args.endpoint)
        statedir = validate_base_path(os.path.abspath(args.statedir), "--statedir")
    except (ValueError, UnsafePathError) as err:
        parser.error(str(err))
    if not args.nodeid.strip():
        parser.error("--nodeid must not be empty")
    configure_logging(args.log_format, args.log_level)
    options = DriverOptions(
        drivername=args.drivername,
        nodeid=args.nodeid,
        statedir=statedir,
        enable_attach=args.enable_attach,
        max_volumes_per_node=args.maxvolumespernode,
        capacity=args.capacity,
        max_volume_size=args.max_volume_size,
        mount=args.mount,
        enable_controller_modify_volume=args.enable_controller_modify_volume,
        accepted_mutable_parameter_names=args.accepted_mutable_parameter_names,
    )
    try:
        asyncio.run(serve(options, args.endpoint))
    except OSError as err:
        log.error("hostpath CSI driver failed", error=str(err))
        return 1
    return 0

"""Command line of the hostpath CSI driver: the Go hostpathplugin's flags where they overlap
(``--endpoint``, ``--nodeid``, ``--drivername``, ``--statedir``, ``--enable-attach``,
``--maxvolumespernode``, ``--enable-controller-modify-volume``,
``--accepted-mutable-parameter-names``), plus ``--capacity``, ``--max-volume-size``,
``--log-format`` and ``--log-level``, on :mod:`pyprovlib.runtime`'s parser: ``--help`` shows
each default and environment variable (``PYPROVLIB_<FLAG>``; ``--endpoint`` also reads
``CSI_ENDPOINT`` and ``--nodeid`` ``KUBE_NODE_NAME``, the variables upstream's manifests set).
An endpoint whose directory is missing or a state directory that cannot be made ends in one
line naming the flag, the path and the fix. Runs until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Callable, Sequence

from pyprovlib.csi._server import CSIServer, unix_socket_path
from pyprovlib.examples._paths import UnsafePathError, validate_base_path
from pyprovlib.examples.csi_hostpath._driver import (
    DEFAULT_MUTABLE_PARAMETERS,
    TIB,
    Driver,
    DriverOptions,
    HostPathController,
    HostPathGroupController,
    HostPathIdentity,
    HostPathNode,
)
from pyprovlib.examples.csi_hostpath._mounter import MOUNT_MODES
from pyprovlib.kube._quantity import parse_quantity
from pyprovlib.runtime._flag_parser import (
    ENV_PREFIX,
    RuntimeArgumentParser,
    add_bool_flag,
    add_flag,
    add_version_flag,
)
from pyprovlib.runtime._flag_values import parse_non_negative_int
from pyprovlib.runtime._flags import add_logging_flags
from pyprovlib.runtime._logging import configure_logging, get_logger

__all__ = ["PROG", "build_parser", "main", "serve"]

PROG = "python -m pyprovlib.examples.csi_hostpath"
"""The program's name in usage lines and errors."""

log = get_logger("pyprovlib.examples.csi_hostpath")


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


def _endpoint(text: str) -> str:
    try:
        unix_socket_path(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def _choice(choices: Sequence[str]) -> Callable[[str], str]:
    def convert(text: str) -> str:
        if text not in choices:
            raise argparse.ArgumentTypeError(
                f"invalid choice {text!r} (choose from {', '.join(choices)})"
            )
        return text

    return convert


def build_parser() -> RuntimeArgumentParser:
    """The argument parser (``--help`` lists the flags, their defaults and variables)."""
    parser = RuntimeArgumentParser(
        prog=PROG,
        description="A hostpath CSI driver (Identity, Controller, Node) on pyprovlib.csi._server.",
        env_prefix=ENV_PREFIX,
        version=DriverOptions().vendor_version,
    )
    add_version_flag(parser)
    driver = parser.add_argument_group("CSI driver")
    add_flag(
        parser,
        "--endpoint",
        default="unix:///tmp/csi.sock",
        type=_endpoint,
        help="CSI endpoint: unix:///abs/path (its directory must exist)",
        extra_env=("CSI_ENDPOINT",),
        metavar="ENDPOINT",
        group=driver,
    )
    add_flag(
        parser,
        "--nodeid",
        default="",
        help="this node's id (NodeGetInfo, topology); required",
        extra_env=("KUBE_NODE_NAME",),
        metavar="ID",
        default_text="none",
        group=driver,
    )
    add_flag(
        parser,
        "--drivername",
        default="hostpath.csi.k8s.io",
        help="name of the driver (GetPluginInfo)",
        metavar="NAME",
        group=driver,
    )
    add_flag(
        parser,
        "--statedir",
        default="/csi-data-dir",
        help="directory for the state, volumes and snapshots, kept across restarts (made when "
        "missing)",
        metavar="DIR",
        group=driver,
    )
    add_bool_flag(
        parser,
        "--enable-attach",
        default=False,
        help="serve ControllerPublish/Unpublish (PUBLISH_UNPUBLISH_VOLUME)",
        group=driver,
    )
    add_flag(
        parser,
        "--maxvolumespernode",
        default=0,
        type=parse_non_negative_int,
        help="volume limit reported by NodeGetInfo (0: none)",
        metavar="N",
        group=driver,
    )
    add_flag(
        parser,
        "--capacity",
        default=TIB,
        type=_bytes,
        help="total bytes the driver offers (a quantity, e.g. 100Gi); GetCapacity reports what "
        "the volumes leave of it, at most the free space of --statedir",
        metavar="QUANTITY",
        default_text="1Ti",
        group=driver,
    )
    add_flag(
        parser,
        "--max-volume-size",
        default=TIB,
        type=_bytes,
        help="largest volume (a quantity)",
        metavar="QUANTITY",
        default_text="1Ti",
        group=driver,
    )
    add_bool_flag(
        parser,
        "--enable-controller-modify-volume",
        default=True,
        help="serve ControllerModifyVolume (MODIFY_VOLUME): VolumeAttributesClasses (the Go "
        "driver's default is false)",
        group=driver,
    )
    add_flag(
        parser,
        "--accepted-mutable-parameter-names",
        default=DEFAULT_MUTABLE_PARAMETERS,
        type=_names,
        help="comma-separated mutable parameters (VolumeAttributesClass keys) the driver "
        "accepts; any other is refused as invalid (a claim asking for it shows Infeasible). "
        "Empty: every key, as the Go driver without the flag",
        metavar="NAMES",
        default_text=",".join(DEFAULT_MUTABLE_PARAMETERS),
        group=driver,
    )
    add_flag(
        parser,
        "--mount",
        default="record",
        type=_choice(MOUNT_MODES),
        help="node staging and publishing: 'record' creates and records the directories only "
        "(unprivileged: csi-sanity, sidecar tests); 'bind' bind-mounts the volume there, as a "
        "node plugin for a real kubelet (needs root)",
        metavar="{" + ",".join(MOUNT_MODES) + "}",
        group=driver,
    )
    add_logging_flags(parser, parser.add_argument_group("process"))
    return parser


def _fail(message: str) -> int:
    """One line naming the program, the flag and the fix: a usage problem (status 2)."""
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return 2


def _check_endpoint(endpoint: str) -> str | None:
    """Why the socket cannot be made at ``endpoint``, or None."""
    directory = unix_socket_path(endpoint).parent
    if not directory.is_dir():
        what = "is not a directory" if directory.exists() else "does not exist"
        return (
            f"--endpoint {endpoint}: the socket's directory {directory} {what}; create it "
            "(in a pod: the volume shared with the sidecars) or choose another path"
        )
    return None


def _prepare_statedir(statedir: str) -> str | None:
    """Make ``statedir`` if missing; why it cannot be used, or None."""
    try:
        os.makedirs(statedir, mode=0o750, exist_ok=True)
    except FileExistsError:
        return f"--statedir {statedir}: exists and is not a directory; name a directory"
    except OSError as err:
        reason = os.strerror(err.errno).lower() if err.errno else str(err)
        return (
            f"--statedir {statedir}: cannot make the directory ({reason}); name a directory "
            "this process can create and write to"
        )
    if not os.access(statedir, os.W_OK | os.X_OK):
        return f"--statedir {statedir}: not writable by this process; fix its permissions"
    return None


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
    if not args.nodeid.strip():
        return _fail("--nodeid is required (or KUBE_NODE_NAME): this node's id")
    try:
        statedir = validate_base_path(os.path.abspath(args.statedir), "--statedir")
    except (ValueError, UnsafePathError) as err:
        return _fail(str(err))
    problem = _check_endpoint(args.endpoint) or _prepare_statedir(statedir)
    if problem is not None:
        return _fail(problem)
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
        log.error(
            "hostpath CSI driver failed",
            error=str(err),
            endpoint=args.endpoint,
            statedir=statedir,
        )
        return 1
    return 0

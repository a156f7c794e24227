"""Command line of ``python -m pyprovlib.examples.rbd``: flags, the start-up check that the
``rbd`` program exists, the provisioner, and the ProvisionController run by
:mod:`pyprovlib.runtime`."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from kubernetes_asyncio.client import ApiClient

from pyprovlib.controller._options import ProvisionControllerOptions
from pyprovlib.controller._provision import ProvisionController
from pyprovlib.examples._cli import (
    deprecated_controller_options,
    provision_controller,
    provisioner_parser,
    run_checked,
)
from pyprovlib.examples.rbd._provisioner import DEFAULT_PROVISIONER_NAME, RBDProvisioner
from pyprovlib.examples.rbd._rbd_cli import (
    DEFAULT_BINARY,
    DEFAULT_TIMEOUT,
    RbdBinaryNotFoundError,
    RbdRunner,
)
from pyprovlib.runtime import CommonOptions, RuntimeArgumentParser, RuntimeContext, add_flag
from pyprovlib.runtime._flag_parser import add_duration_flag

__all__ = [
    "build_parser",
    "check_arguments",
    "controller_options",
    "main",
    "make_controller",
    "make_provisioner",
]


def build_parser() -> RuntimeArgumentParser:
    """The parser: the runtime's common flags plus the RBD flags."""
    parser, group = provisioner_parser(
        "python -m pyprovlib.examples.rbd",
        "Provisions Ceph RBD PersistentVolumes: each claim becomes an RBD image created with "
        "the rbd command (the in-tree kubernetes.io/rbd provisioner's behaviour).",
        title="RBD provisioner",
        default_name=DEFAULT_PROVISIONER_NAME,
        # One Deployment serves the cluster; replicas must not provision the same claim.
        leader_election=True,
    )
    add_flag(
        parser,
        "--rbd-binary",
        default=DEFAULT_BINARY,
        help="the rbd program (from ceph-common), a name looked up in PATH or a path",
        metavar="PATH",
        group=group,
    )
    add_duration_flag(
        parser,
        "--rbd-timeout",
        default=DEFAULT_TIMEOUT,
        help="how long rbd waits to reach the monitors and for each monitor or OSD operation "
        "(--client_mount_timeout, --rados_mon_op_timeout, --rados_osd_op_timeout); each rbd "
        "command is killed after three times this plus 5s",
        group=group,
    )
    return parser


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Reject unusable settings (exits with a usage error), including a missing ``rbd``."""
    if not args.provisioner_name:
        parser.error("--provisioner-name must not be empty")
    if args.rbd_timeout <= 0:
        parser.error("--rbd-timeout must be positive")
    try:
        RbdRunner(args.rbd_binary, timeout=args.rbd_timeout).resolve_binary()
    except RbdBinaryNotFoundError as err:
        parser.error(str(err))


def make_provisioner(args: argparse.Namespace, api_client: ApiClient) -> RBDProvisioner:
    """The provisioner the parsed flags describe."""
    return RBDProvisioner(api_client, RbdRunner(args.rbd_binary, timeout=args.rbd_timeout))


def controller_options(options: CommonOptions) -> ProvisionControllerOptions:
    """Deprecated alias of :func:`pyprovlib.runtime.provision_controller_options`, kept for one
    release."""
    return deprecated_controller_options(__name__, options)


def make_controller(ctx: RuntimeContext) -> ProvisionController:
    """The runtime's controller factory."""
    args = ctx.args
    provisioner = make_provisioner(args, ctx.api_client)
    ctx.log.info(
        "RBD provisioner",
        provisioner=args.provisioner_name,
        rbd=provisioner.runner.resolve_binary(),
        rbd_timeout=args.rbd_timeout,
    )
    return provision_controller(ctx, provisioner)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    return run_checked(build_parser(), check_arguments, make_controller, argv)

"""Command line of ``python -m pyprovlib.examples.nfs``: flags (or NFS_SERVER / NFS_PATH in the
environment, as upstream), the provisioner they describe, and the ProvisionController run by
:mod:`pyprovlib.runtime`."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from kubernetes_asyncio.client import ApiClient

from pyprovlib.controller._options import ProvisionControllerOptions
from pyprovlib.controller._provision import ProvisionController
from pyprovlib.examples._cli import (
    add_dir_mode_flag,
    deprecated_controller_options,
    provision_controller,
    provisioner_parser,
    run_checked,
)
from pyprovlib.examples._paths import UnsafePathError, validate_base_path
from pyprovlib.examples.nfs._provisioner import (
    DEFAULT_DIR_MODE,
    DEFAULT_MOUNT_PATH,
    DEFAULT_PROVISIONER_NAME,
    NFSProvisioner,
)
from pyprovlib.runtime import (
    CommonOptions,
    RuntimeArgumentParser,
    RuntimeContext,
    add_flag,
)

__all__ = ["build_parser", "controller_options", "main", "make_controller", "make_provisioner"]


def build_parser() -> RuntimeArgumentParser:
    """The parser: the runtime's common flags plus the NFS flags."""
    parser, group = provisioner_parser(
        "python -m pyprovlib.examples.nfs",
        "Provisions NFS PersistentVolumes as subdirectories of one NFS export, which is "
        "mounted into this provisioner's container.",
        title="NFS provisioner",
        default_name=DEFAULT_PROVISIONER_NAME,
        # One Deployment serves the cluster; replicas must not provision the same claim.
        leader_election=True,
    )
    add_flag(
        parser,
        "--nfs-server",
        default="",
        help="NFS server (host name or IP) written into every PV; required",
        extra_env=("NFS_SERVER",),
        metavar="HOST",
        group=group,
    )
    add_flag(
        parser,
        "--nfs-path",
        default="",
        help="path of the export on the NFS server; PVs point at subdirectories of it; required",
        extra_env=("NFS_PATH",),
        metavar="PATH",
        group=group,
    )
    add_flag(
        parser,
        "--nfs-mount-path",
        default=DEFAULT_MOUNT_PATH,
        help="where the export is mounted inside this container; volume directories are "
        "created and removed there",
        extra_env=("NFS_MOUNT_PATH",),
        metavar="PATH",
        group=group,
    )
    add_dir_mode_flag(parser, group, DEFAULT_DIR_MODE)
    return parser


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Reject missing or unusable settings (exits with a usage error)."""
    if not args.nfs_server:
        parser.error("--nfs-server (or NFS_SERVER) is required")
    if not args.nfs_path:
        parser.error("--nfs-path (or NFS_PATH) is required")
    if not args.provisioner_name:
        parser.error("--provisioner-name must not be empty")
    try:
        if args.nfs_path != "/":
            validate_base_path(args.nfs_path, "--nfs-path")
        validate_base_path(args.nfs_mount_path, "--nfs-mount-path")
    except UnsafePathError as err:
        parser.error(str(err))


def make_provisioner(args: argparse.Namespace, api_client: ApiClient) -> NFSProvisioner:
    """The provisioner the parsed flags describe."""
    return NFSProvisioner(
        api_client, args.nfs_server, args.nfs_path, args.nfs_mount_path, dir_mode=args.dir_mode
    )


def controller_options(options: CommonOptions) -> ProvisionControllerOptions:
    """Deprecated alias of :func:`pyprovlib.runtime.provision_controller_options`, kept for one
    release."""
    return deprecated_controller_options(__name__, options)


def make_controller(ctx: RuntimeContext) -> ProvisionController:
    """The runtime's controller factory."""
    args = ctx.args
    ctx.log.info(
        "NFS provisioner",
        provisioner=args.provisioner_name,
        server=args.nfs_server,
        export=args.nfs_path,
        mount=args.nfs_mount_path,
    )
    provisioner = make_provisioner(args, ctx.api_client)
    controller = provision_controller(ctx, provisioner)
    # The class of each deleted volume from the controller's cache, not a GET per volume.
    provisioner.read_classes_from(controller.class_informer)
    return controller


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    return run_checked(build_parser(), check_arguments, make_controller, argv)

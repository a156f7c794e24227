"""Command line of ``python -m pyprovlib.examples.hostpath``: flags, the provisioner they
describe, and the ProvisionController (beside a ResizeController that explains on claims asking
for more that hostpath volumes cannot grow, unless ``--resize-events=false``) run by
:mod:`pyprovlib.runtime` (or the ``--demo``)."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence

from kubernetes_asyncio.client import ApiClient

from pyprovlib.controller._options import (
    DEFAULT_NODE_DEPLOYMENT_BASE_DELAY,
    DEFAULT_NODE_DEPLOYMENT_IMMEDIATE_BINDING,
    DEFAULT_NODE_DEPLOYMENT_MAX_DELAY,
    NodeDeployment,
    ProvisionControllerOptions,
    in_cluster_namespace,
)
from pyprovlib.controller._resize.options import ResizeControllerOptions
from pyprovlib.examples._cli import (
    add_dir_mode_flag,
    deprecated_controller_options,
    parse_checked,
    parse_mode,
    provision_controller,
    provisioner_parser,
)
from pyprovlib.examples.hostpath._helper_pod import (
    DEFAULT_HELPER_IMAGE,
    DEFAULT_HELPER_TIMEOUT,
    HelperPodDirectories,
)
from pyprovlib.examples.hostpath._provisioner import (
    DEFAULT_DIR_MODE,
    DEFAULT_PROVISIONER_NAME,
    HostPathProvisioner,
    NodeHostPathProvisioner,
)
from pyprovlib.examples.hostpath._resize import HostPathResizeController, HostPathResizer
from pyprovlib.runtime import (
    CommonOptions,
    CompositeController,
    Controller,
    RuntimeArgumentParser,
    RuntimeContext,
    add_flag,
    resize_controller_options,
    run,
)
from pyprovlib.runtime._flag_parser import add_bool_flag, add_duration_flag

__all__ = [
    "MODES",
    "build_parser",
    "controller_options",
    "main",
    "make_controller",
    "make_provisioner",
    "make_resize_controller",
    "node_deployment",
    "parse_mode",
    "resize_options",
]

MODES = ("node", "helper-pod")
"""How the provisioner reaches the node's disk."""


def _mode_choice(text: str) -> str:
    if text not in MODES:
        raise argparse.ArgumentTypeError(f"must be one of {', '.join(MODES)}, got {text!r}")
    return text


def build_parser() -> RuntimeArgumentParser:
    """The parser: the runtime's common flags plus the hostpath flags."""
    parser, group = provisioner_parser(
        "python -m pyprovlib.examples.hostpath",
        "Provisions local PersistentVolumes as directories <basePath>/<pv name> on the node "
        "the scheduler picked (StorageClass volumeBindingMode: WaitForFirstConsumer).",
        title="hostpath provisioner",
        default_name=DEFAULT_PROVISIONER_NAME,
    )
    add_flag(
        parser,
        "--mode",
        default="node",
        type=_mode_choice,
        help="'node': run as a DaemonSet, one per node, creating directories locally (the "
        "host's basePath mounted at the same path): node deployment, each instance "
        "provisioning the claims of its own node; 'helper-pod': one provisioner for the "
        "cluster launching a short-lived pod on the node",
        metavar="|".join(MODES),
        group=group,
    )
    add_flag(
        parser,
        "--node-name",
        default="",
        help="node mode: the node this provisioner serves (from the downward API "
        "spec.nodeName); it takes only claims whose selected node is this one",
        extra_env=("NODE_NAME",),
        metavar="NODE",
        group=group,
    )
    add_bool_flag(
        parser,
        "--node-deployment-immediate-binding",
        default=DEFAULT_NODE_DEPLOYMENT_IMMEDIATE_BINDING,
        help="node mode: also serve classes with volumeBindingMode Immediate; the instances "
        "compete for each claim and the first to set its selected node makes the directory "
        "on its node (as external-provisioner's flag)",
        group=group,
    )
    add_duration_flag(
        parser,
        "--node-deployment-base-delay",
        default=DEFAULT_NODE_DEPLOYMENT_BASE_DELAY,
        help="node mode: how long an instance waits at most before trying to own an Immediate "
        "claim the first time (random, so instances spread out)",
        group=group,
    )
    add_duration_flag(
        parser,
        "--node-deployment-max-delay",
        default=DEFAULT_NODE_DEPLOYMENT_MAX_DELAY,
        help="node mode: the longest wait before trying to own an Immediate claim after lost races",
        group=group,
    )
    add_dir_mode_flag(parser, group, DEFAULT_DIR_MODE)
    add_flag(
        parser,
        "--helper-image",
        default=DEFAULT_HELPER_IMAGE,
        help="helper-pod mode: image of the helper pods (needs mkdir, rm, find and mv)",
        metavar="IMAGE",
        group=group,
    )
    add_duration_flag(
        parser,
        "--helper-timeout",
        default=DEFAULT_HELPER_TIMEOUT,
        help="helper-pod mode: how long to wait for a helper pod to finish before reporting "
        "a failure (the controller retries, reusing the pod)",
        group=group,
    )
    add_flag(
        parser,
        "--helper-namespace",
        default="",
        help="helper-pod mode: namespace of the helper pods; empty means the provisioner's "
        "own namespace (POD_NAMESPACE, the service account's namespace, else default)",
        metavar="NAMESPACE",
        default_text="the provisioner's namespace",
        group=group,
    )
    add_flag(
        parser,
        "--helper-service-account",
        default="",
        help="helper-pod mode: service account of the helper pods (they need no API access; "
        "empty means the namespace's default account)",
        metavar="NAME",
        group=group,
    )
    add_bool_flag(
        parser,
        "--provisioning-finalizer",
        default=True,
        help="hold claims with the pyprovlib.io/provisioning-protection finalizer while their "
        "directory is created, so a claim deleted meanwhile (a helper pod still pending, the "
        "provisioner restarted) never leaks the directory or a helper pod: the provisioner "
        "finishes and removes both before the claim goes (needs patch on "
        "persistentvolumeclaims)",
        group=group,
    )
    add_bool_flag(
        parser,
        "--resize-events",
        default=True,
        help="also run a resize controller that answers a claim of a hostpath class asking for "
        "more storage with a VolumeResizeFailed event saying hostpath volumes cannot be "
        "expanded (in node mode each instance answers for the volumes of its own node; in "
        "helper-pod mode it shares --leader-election, with its own Lease "
        "external-resizer-<provisioner name>)",
        group=group,
    )
    group.add_argument(
        "--demo",
        action="store_true",
        help="run a self-contained demo: an in-memory API server, a temporary basePath and "
        "three claims going Pending -> Bound through the real controller, then one deleted "
        "again; ignores the Kubernetes flags (default: false)",
    )
    return parser


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Reject flag combinations that cannot work (exits with a usage error)."""
    if args.demo:
        return
    if args.mode == "node":
        if not args.node_name:
            parser.error("--mode=node needs --node-name (or NODE_NAME from the downward API)")
        if args.leader_election:
            parser.error(
                "--mode=node runs one provisioner per node, each for its own node: turn "
                "--leader-election off (leader election is for --mode=helper-pod)"
            )
    if not args.provisioner_name:
        parser.error("--provisioner-name must not be empty")


def make_provisioner(args: argparse.Namespace, api_client: ApiClient) -> HostPathProvisioner:
    """The provisioner the parsed flags describe."""
    if args.mode == "node":
        return NodeHostPathProvisioner(api_client, args.node_name, dir_mode=args.dir_mode)
    directories = HelperPodDirectories(
        api_client,
        args.helper_namespace or in_cluster_namespace(),
        image=args.helper_image,
        timeout=args.helper_timeout,
        dir_mode=args.dir_mode,
        service_account=args.helper_service_account or None,
    )
    return HostPathProvisioner(api_client, directories)


def node_deployment(args: argparse.Namespace) -> NodeDeployment | None:
    """Node mode's :class:`~pyprovlib.controller.NodeDeployment` (None in helper-pod
    mode): the claims whose selected node is ``--node-name``, Immediate claims competed for,
    and the volumes whose node affinity matches that Node's labels."""
    if args.mode != "node":
        return None
    return NodeDeployment(
        node_name=args.node_name,
        immediate_binding=args.node_deployment_immediate_binding,
        base_delay=args.node_deployment_base_delay,
        max_delay=args.node_deployment_max_delay,
    )


def controller_options(options: CommonOptions) -> ProvisionControllerOptions:
    """Deprecated alias of :func:`pyprovlib.runtime.provision_controller_options`, kept for one
    release."""
    return deprecated_controller_options(__name__, options)


def resize_options(options: CommonOptions) -> ResizeControllerOptions:
    """Resize controller options from the runtime's common flags: the process's leader
    election settings (the Lease is the resizer's own, ``external-resizer-<name>``), and no
    Pod informer (nothing is ever expanded, so no in-use handling)."""
    return resize_controller_options(options, handle_volume_in_use_error=False)


def make_resize_controller(
    args: argparse.Namespace, api_client: ApiClient, options: CommonOptions
) -> HostPathResizeController:
    """The resize controller the parsed flags describe: in node mode it answers only for the
    volumes of ``--node-name``, so one instance per node never sends a claim two events."""
    node = args.node_name if args.mode == "node" else None
    return HostPathResizeController(
        api_client, HostPathResizer(args.provisioner_name, node), resize_options(options)
    )


def make_controller(ctx: RuntimeContext) -> Controller:
    """The runtime's controller factory: the ProvisionController, with the resize controller
    beside it unless ``--resize-events=false``."""
    args = ctx.args
    ctx.log.info(
        "hostpath provisioner",
        provisioner=args.provisioner_name,
        mode=args.mode,
        node=args.node_name or None,
        resize_events=args.resize_events,
    )
    provision = provision_controller(
        ctx,
        make_provisioner(args, ctx.api_client),
        provisioning_finalizer=args.provisioning_finalizer,
        node_deployment=node_deployment(args),
    )
    if not args.resize_events:
        return provision
    return CompositeController(provision, make_resize_controller(args, ctx.api_client, ctx.options))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    parser = build_parser()
    args_list, args = parse_checked(parser, check_arguments, argv)
    if args.demo:
        from pyprovlib.examples.hostpath._demo import run_demo

        return asyncio.run(run_demo(dir_mode=args.dir_mode))
    return run(make_controller, argv=args_list, parser=parser)

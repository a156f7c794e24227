"""The CSI provisioner's settings: :class:`CSIProvisionerOptions` (what shapes Provision and
Delete) and the sidecar's flags with external-provisioner's names and defaults
(``cmd/csi-provisioner``), turned into those options and the ProvisionController's in one
place, so a flag and an option cannot disagree."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Final

from pyprovlib.controller._options import (
    DEFAULT_NODE_DEPLOYMENT_BASE_DELAY,
    DEFAULT_NODE_DEPLOYMENT_IMMEDIATE_BINDING,
    DEFAULT_NODE_DEPLOYMENT_MAX_DELAY,
    ProvisionControllerOptions,
)
from pyprovlib.kube._workqueue import (
    ItemExponentialFailureRateLimiter,
    default_controller_rate_limiter,
)
from pyprovlib.runtime import (
    RuntimeArgumentParser,
    RuntimeContext,
    add_flag,
    common_parser,
    provision_controller_options,
)
from pyprovlib.runtime._flag_parser import ENV_PREFIX, add_bool_flag, add_duration_flag
from pyprovlib.runtime._flag_values import (
    parse_int,
    parse_non_negative_int,
    parse_positive_int,
    parse_qps,
)

__all__ = [
    "PROG",
    "CSIProvisionerOptions",
    "build_parser",
    "controller_options",
    "provisioner_options",
]

PROG: Final = "python -m pyprovlib.csi.provisioner"
"""The program name the sidecar's ``--help`` shows."""


@dataclass(frozen=True)
class CSIProvisionerOptions:
    """external-provisioner's flags that shape Provision and Delete, with their defaults."""

    volume_name_prefix: str = "pvc"
    """``--volume-name-prefix``: prefix of the name passed to CreateVolume."""
    volume_name_uuid_length: int = -1
    """``--volume-name-uuid-length``: claim-UID characters kept in the name (-1: all)."""
    default_fstype: str = ""
    """``--default-fstype``: fsType when the class names none ('' leaves it to the driver)."""
    extra_create_metadata: bool = False
    """``--extra-create-metadata``: pass the claim and PV names as CreateVolume parameters."""
    strict_topology: bool = False
    """``--strict-topology``: with a selected node, require exactly its topology."""
    immediate_topology: bool = True
    """``--immediate-topology``: for Immediate binding without allowedTopologies, request the
    topology of all nodes with the driver."""
    clean_up_deleted_claims: bool = True
    """Delete volumes whose claim was deleted while they were created in the background
    (instead of saving a PV for a claim that no longer exists)."""
    controller_publish_readonly: bool = False
    """``--controller-publish-readonly``: mark the PV of a claim whose only access mode is
    ReadOnlyMany read-only (``spec.csi.readOnly``), so the attacher publishes it read-only
    (ControllerPublishVolume's ``readonly``, for drivers with PUBLISH_READONLY)."""
    prevent_volume_mode_conversion: bool = True
    """``--prevent-volume-mode-conversion``: refuse to restore a snapshot into a claim whose
    volumeMode differs from the snapshot's source volume unless the VolumeSnapshotContent is
    annotated ``snapshot.storage.kubernetes.io/allow-volume-mode-change: "true"`` (upstream's
    default since v4.0.0)."""


def build_parser() -> RuntimeArgumentParser:
    """The runtime's common flags (``--worker-threads`` defaulting to 100, as upstream) plus
    external-provisioner's."""
    parser = common_parser(
        PROG,
        "Provisions PersistentVolumes through a CSI driver's CreateVolume/DeleteVolume "
        "(the Python counterpart of kubernetes-csi/external-provisioner).",
        env_prefix=ENV_PREFIX,
        defaults={"worker_threads": 100, "leader_election_retry_period": 5.0},
    )
    group = parser.add_argument_group("CSI provisioner")
    add_flag(
        parser,
        "--csi-address",
        default="/run/csi/socket",
        help="address of the CSI driver socket: unix:///path, /path or host:port",
        metavar="ADDRESS",
        group=group,
    )
    add_flag(
        parser,
        "--volume-name-prefix",
        default="pvc",
        help="prefix of the volume names passed to CreateVolume",
        metavar="PREFIX",
        group=group,
    )
    add_flag(
        parser,
        "--volume-name-uuid-length",
        default=-1,
        type=parse_int,
        help="claim-UID characters in the volume name, dashes removed (-1: the whole UID)",
        metavar="N",
        group=group,
    )
    add_duration_flag(
        parser,
        "--timeout",
        default=10.0,
        help="timeout of every call to the CSI driver",
        group=group,
    )
    add_duration_flag(
        parser,
        "--retry-interval-start",
        default=1.0,
        help="initial retry interval of a failed provisioning or deletion; it doubles with "
        "each failure up to --retry-interval-max",
        group=group,
    )
    add_duration_flag(
        parser,
        "--retry-interval-max",
        default=300.0,
        help="maximum retry interval of a failed provisioning or deletion",
        group=group,
    )
    add_bool_flag(
        parser,
        "--extra-create-metadata",
        default=False,
        help="pass csi.storage.k8s.io/pvc/name, pvc/namespace and pv/name to CreateVolume",
        group=group,
    )
    add_flag(
        parser,
        "--default-fstype",
        default="",
        help="fsType of filesystem volumes whose class names none (empty: the driver decides)",
        metavar="FSTYPE",
        group=group,
    )
    add_bool_flag(
        parser,
        "--strict-topology",
        default=False,
        help="with a selected node, require exactly the selected node's topology",
        group=group,
    )
    add_bool_flag(
        parser,
        "--immediate-topology",
        default=True,
        help="for Immediate binding, request the topology of all nodes with the driver",
        group=group,
    )
    add_bool_flag(
        parser,
        "--prevent-volume-mode-conversion",
        default=True,
        help="refuse to restore a VolumeSnapshot into a claim whose volumeMode differs from "
        "the snapshot's source volume, unless its VolumeSnapshotContent is annotated "
        "snapshot.storage.kubernetes.io/allow-volume-mode-change=true",
        group=group,
    )
    add_bool_flag(
        parser,
        "--controller-publish-readonly",
        default=False,
        help="mark the PV of a claim whose only access mode is ReadOnlyMany read-only "
        "(spec.csi.readOnly), so ControllerPublishVolume publishes it read-only",
        group=group,
    )
    add_flag(
        parser,
        "--cloning-protection-threads",
        default=1,
        type=parse_positive_int,
        help="workers removing the cloning-protection finalizer from source claims once no "
        "clone of them is in flight",
        metavar="N",
        group=group,
    )
    add_bool_flag(
        parser,
        "--provisioning-finalizer",
        default=True,
        help="hold claims with the pyprovlib.io/provisioning-protection finalizer while their "
        "volume is created, so a claim deleted meanwhile never leaks the volume, even across "
        "a restart (not in upstream; needs patch on persistentvolumeclaims)",
        group=group,
    )
    _add_capacity_flags(parser)
    add_bool_flag(
        parser,
        "--node-deployment",
        default=False,
        help="run beside the CSI driver on every node (a DaemonSet, NODE_NAME from the "
        "downward API): provision only claims whose selected node is this one, delete only "
        "volumes of this node's topology (from NodeGetInfo); needs --leader-election=false",
        group=group,
    )
    add_bool_flag(
        parser,
        "--node-deployment-immediate-binding",
        default=DEFAULT_NODE_DEPLOYMENT_IMMEDIATE_BINDING,
        help="with --node-deployment, compete for claims of Immediate classes: the instance "
        "that sets the selected-node annotation first provisions",
        group=group,
    )
    add_duration_flag(
        parser,
        "--node-deployment-base-delay",
        default=DEFAULT_NODE_DEPLOYMENT_BASE_DELAY,
        help="with --node-deployment, how long an instance waits at most before trying to own "
        "an Immediate claim the first time (random, so instances spread out)",
        group=group,
    )
    add_duration_flag(
        parser,
        "--node-deployment-max-delay",
        default=DEFAULT_NODE_DEPLOYMENT_MAX_DELAY,
        help="with --node-deployment, the longest wait before trying to own an Immediate "
        "claim after lost races (the wait doubles from the base delay)",
        group=group,
    )
    add_bool_flag(
        parser,
        "--exit-on-connection-loss",
        default=True,
        help="exit when the connection to the driver is lost, so the container restarts "
        "(as upstream); false: log it and reconnect once the driver is ready again",
        group=group,
    )
    return parser


def _ownerref_level(text: str) -> int:
    value = parse_int(text)
    if value < -1:
        raise argparse.ArgumentTypeError(f"must be -1 or more, got {value}")
    return value


def _add_capacity_flags(parser: RuntimeArgumentParser) -> None:
    """external-provisioner's storage capacity flags, with its defaults."""
    group = parser.add_argument_group("storage capacity")
    add_bool_flag(
        parser,
        "--enable-capacity",
        default=False,
        help="publish CSIStorageCapacity objects with the capacity the driver's GetCapacity "
        "reports, one per StorageClass of the driver and topology segment, in the namespace "
        "$NAMESPACE, owned by what runs the pod $POD_NAME (see --capacity-ownerref-level)",
        group=group,
    )
    add_flag(
        parser,
        "--capacity-threads",
        default=1,
        type=parse_positive_int,
        help="workers writing CSIStorageCapacity objects",
        metavar="N",
        group=group,
    )
    add_duration_flag(
        parser,
        "--capacity-poll-interval",
        default=60.0,
        help="how often every object is refreshed with a new GetCapacity (volumes created or "
        "deleted refresh theirs at once)",
        group=group,
    )
    add_bool_flag(
        parser,
        "--capacity-for-immediate-binding",
        default=False,
        help="also publish capacity for classes with volumeBindingMode Immediate (the "
        "scheduler does not need it)",
        group=group,
    )
    add_flag(
        parser,
        "--capacity-ownerref-level",
        default=1,
        type=_ownerref_level,
        help="owner of the objects, counted up from the pod $POD_NAME: -1 no owner, 0 the pod, "
        "1 its StatefulSet or DaemonSet (or ReplicaSet), 2 the Deployment, ...",
        metavar="LEVEL",
        group=group,
    )
    add_flag(
        parser,
        "--kube-api-capacity-qps",
        default=1.0,
        type=parse_qps,
        help="queries per second of the capacity controller's writes (0 disables the limit)",
        metavar="QPS",
        group=group,
    )
    add_flag(
        parser,
        "--kube-api-capacity-burst",
        default=5,
        type=parse_non_negative_int,
        help="burst of the capacity controller's writes above --kube-api-capacity-qps",
        metavar="N",
        group=group,
    )


def provisioner_options(args: argparse.Namespace) -> CSIProvisionerOptions:
    """The CSIProvisioner's options from the parsed flags."""
    return CSIProvisionerOptions(
        volume_name_prefix=args.volume_name_prefix,
        volume_name_uuid_length=args.volume_name_uuid_length,
        default_fstype=args.default_fstype,
        extra_create_metadata=args.extra_create_metadata,
        strict_topology=args.strict_topology,
        immediate_topology=args.immediate_topology,
        prevent_volume_mode_conversion=args.prevent_volume_mode_conversion,
        controller_publish_readonly=args.controller_publish_readonly,
    )


def controller_options(ctx: RuntimeContext) -> ProvisionControllerOptions:
    """The ProvisionController's options from the parsed flags: worker threads, retry
    intervals, the provisioning finalizer and leader election — and, as external-provisioner
    sets them, no failure thresholds (a claim or a delete is retried for as long as it fails,
    with the retry interval's backoff) and PVs saved by the queue store with client-go's
    default controller rate limiter."""
    args = ctx.args
    return provision_controller_options(
        ctx.options,
        rate_limiter=ItemExponentialFailureRateLimiter(
            args.retry_interval_start, args.retry_interval_max
        ),
        retry_interval_max=args.retry_interval_max,
        provisioning_finalizer=args.provisioning_finalizer,
        failed_provision_threshold=0,
        failed_delete_threshold=0,
        create_provisioned_pv_limiter=default_controller_rate_limiter(),
    )

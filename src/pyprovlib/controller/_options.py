"""Options of the :class:`~pyprovlib.ProvisionController`, carrying
sig-storage-lib-external-provisioner's defaults (``controller.go``'s ``Default*`` constants)
in one frozen dataclass that validates itself.

Go configures the controller with option functions (``Threadiness(8)``, ``AddFinalizer(true)``);
here they are fields: ``ProvisionControllerOptions(workers=8, add_finalizer=True)``.
Durations are seconds (floats).
"""

from __future__ import annotations

import os
import types
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from kubernetes_asyncio.client import V1PersistentVolumeClaim

from pyprovlib._errors import InvalidOptionsError
from pyprovlib.controller._metrics import ProvisionMetrics
from pyprovlib.controller._renamed import renamed_field
from pyprovlib.kube._backoff import Backoff
from pyprovlib.kube._workqueue import RateLimiter

__all__ = [
    "DEFAULT_ADD_FINALIZER",
    "DEFAULT_CREATE_PROVISIONED_PV_INTERVAL",
    "DEFAULT_CREATE_PROVISIONED_PV_RETRY_COUNT",
    "DEFAULT_EXPONENTIAL_BACKOFF_ON_ERROR",
    "DEFAULT_FAILED_DELETE_THRESHOLD",
    "DEFAULT_FAILED_PROVISION_THRESHOLD",
    "DEFAULT_LEADER_ELECTION",
    "DEFAULT_LEASE_DURATION",
    "DEFAULT_METRICS_ADDRESS",
    "DEFAULT_METRICS_PATH",
    "DEFAULT_METRICS_PORT",
    "DEFAULT_NODE_DEPLOYMENT_BASE_DELAY",
    "DEFAULT_NODE_DEPLOYMENT_IMMEDIATE_BINDING",
    "DEFAULT_NODE_DEPLOYMENT_MAX_DELAY",
    "DEFAULT_PROVISIONING_FINALIZER",
    "DEFAULT_RENEW_DEADLINE",
    "DEFAULT_RESYNC_PERIOD",
    "DEFAULT_RETRY_INTERVAL_MAX",
    "DEFAULT_RETRY_PERIOD",
    "DEFAULT_THREADINESS",
    "DEFAULT_WORKERS",
    "Backoff",
    "CapacityCheck",
    "InvalidOptionsError",
    "NodeDeployment",
    "ProvisionControllerOptions",
    "VolumeNameHook",
    "in_cluster_namespace",
    "provisioned_volume_name",
]

DEFAULT_RESYNC_PERIOD: Final = 15 * 60.0
"""How often informers replay every object to the handlers (``DefaultResyncPeriod``)."""
DEFAULT_WORKERS: Final = 4
"""Claim workers and volume workers, each (upstream's ``DefaultThreadiness``)."""
DEFAULT_THREADINESS: Final = DEFAULT_WORKERS
"""Deprecated name of :data:`DEFAULT_WORKERS`."""
DEFAULT_EXPONENTIAL_BACKOFF_ON_ERROR: Final = True
"""Retry failures with 15 s..1000 s exponential backoff; otherwise a flat 15 s."""
DEFAULT_CREATE_PROVISIONED_PV_RETRY_COUNT: Final = 5
"""Attempts to save a provisioned PV before the asset is deleted again."""
DEFAULT_CREATE_PROVISIONED_PV_INTERVAL: Final = 10.0
"""Seconds between those attempts (linear backoff)."""
DEFAULT_FAILED_PROVISION_THRESHOLD: Final = 15
"""Failed provisioning attempts after which a claim is given up (0: never)."""
DEFAULT_FAILED_DELETE_THRESHOLD: Final = 15
"""Failed deletions after which a volume is given up (0: never)."""
DEFAULT_LEADER_ELECTION: Final = True
"""Run only while holding the lease, so two replicas never provision the same claim."""
DEFAULT_LEASE_DURATION: Final = 15.0
"""How long a lease is valid without renewal."""
DEFAULT_RENEW_DEADLINE: Final = 10.0
"""How long the leader keeps trying to renew before giving up leadership."""
DEFAULT_RETRY_PERIOD: Final = 2.0
"""Pause between leader-election attempts."""
DEFAULT_METRICS_PORT: Final = 0
"""0: the controller serves no metrics itself (pyprovlib.runtime usually does)."""
DEFAULT_METRICS_ADDRESS: Final = "0.0.0.0"  # noqa: S104 - upstream's default: all interfaces
"""Address of the controller's own metrics server, when a port is set."""
DEFAULT_METRICS_PATH: Final = "/metrics"
"""Path of the controller's own metrics endpoint."""
DEFAULT_ADD_FINALIZER: Final = False
"""Whether provisioned PVs carry ``external-provisioner.volume.kubernetes.io/finalizer``."""
DEFAULT_PROVISIONING_FINALIZER: Final = False
"""Whether claims carry ``pyprovlib.io/provisioning-protection`` while their volume is created
(not in upstream: off by default, on in the CSI sidecar)."""
DEFAULT_RETRY_INTERVAL_MAX: Final = 5 * 60.0
"""How long a claim whose provisioning was infeasible waits before it is tried again."""

DEFAULT_NODE_DEPLOYMENT_IMMEDIATE_BINDING: Final = True
"""Node deployment: instances compete for claims with Immediate binding
(``--node-deployment-immediate-binding``)."""
DEFAULT_NODE_DEPLOYMENT_BASE_DELAY: Final = 20.0
"""Node deployment: the initial wait before trying to own an Immediate claim
(``--node-deployment-base-delay``)."""
DEFAULT_NODE_DEPLOYMENT_MAX_DELAY: Final = 60.0
"""Node deployment: the longest wait before trying to own an Immediate claim
(``--node-deployment-max-delay``)."""
CapacityCheck = Callable[[Mapping[str, Any], Mapping[str, Any]], Awaitable[bool]]
"""``check(claim, storage_class)`` (the cached JSON dicts): whether this node has room for the
claim now. A node deployment asks it before taking an Immediate claim (upstream's
``checkCapacity``); an exception counts as "yes", so provisioning surfaces the problem."""

VolumeNameHook = Callable[[V1PersistentVolumeClaim], str]
"""Names the PV provisioned for a claim (upstream's ``VolumeNameHook``). It must be
deterministic: after a crash the same claim must get the same name, so the asset created
before the crash is found again instead of a second one being created."""


def provisioned_volume_name(claim: V1PersistentVolumeClaim) -> str:
    """The default :data:`VolumeNameHook`: ``pvc-<claim uid>``."""
    uid = claim.metadata.uid if claim.metadata is not None else None
    if not uid:
        raise ValueError("the claim has no metadata.uid; a PV name cannot be derived from it")
    return f"pvc-{uid}"


def in_cluster_namespace() -> str:
    """The namespace the controller runs in: ``$POD_NAMESPACE``, else the service account's
    namespace file, else ``default`` (upstream's ``getInClusterNamespace``)."""
    from pyprovlib.kube._config import service_account_namespace

    return os.environ.get("POD_NAMESPACE", "").strip() or service_account_namespace() or "default"


@dataclass(frozen=True)
class NodeDeployment:
    """Distributed provisioning: one controller per node, each provisioning only the claims
    whose selected node (``volume.kubernetes.io/selected-node``) is its own and deleting only
    the volumes its node can reach (external-provisioner's ``--node-deployment``).

    A claim of a ``WaitForFirstConsumer`` class waits for the scheduler to select a node. With
    ``immediate_binding``, instances compete for claims of an ``Immediate`` class: each waits
    a random delay (at most ``base_delay`` the first time, growing exponentially with jitter
    up to ``max_delay`` after each lost race), gives up early when another node took the claim,
    and then, when its node fits the class's ``allowedTopologies`` (and ``capacity_check``
    says yes), sets the selected-node annotation to its node under optimistic concurrency: one
    instance wins, the others see the claim taken.

    Every instance must run (a DaemonSet), so leader election must be off.
    """

    node_name: str
    """This instance's node (``NODE_NAME`` from the downward API's ``spec.nodeName``)."""
    immediate_binding: bool = DEFAULT_NODE_DEPLOYMENT_IMMEDIATE_BINDING
    """Compete for claims whose class binds Immediately."""
    base_delay: float = DEFAULT_NODE_DEPLOYMENT_BASE_DELAY
    """Seconds: the longest first wait before trying to own an Immediate claim."""
    max_delay: float = DEFAULT_NODE_DEPLOYMENT_MAX_DELAY
    """Seconds: the longest wait after lost races."""
    topology: Mapping[str, str] | None = None
    """This node's topology segment (label key to value). Volumes whose node affinity does not
    match it are another node's to delete; a class's ``allowedTopologies`` must match it for
    this node to take an Immediate claim. None: the labels of the Node ``node_name``, read
    once when first needed (needs ``get`` on nodes) — what the scheduler matches a volume's
    node affinity against. The CSI sidecar passes the segment ``NodeGetInfo`` reports."""
    capacity_check: CapacityCheck | None = None
    """Asked before taking an Immediate claim; None: always room."""

    def __post_init__(self) -> None:
        _check(
            isinstance(self.node_name, str) and bool(self.node_name),
            f"NodeDeployment needs the node's name (NODE_NAME), got {self.node_name!r}",
        )
        _check(self.base_delay >= 0, f"base_delay must be >= 0, got {self.base_delay}")
        _check(
            self.max_delay >= self.base_delay,
            f"max_delay ({self.max_delay}) must be >= base_delay ({self.base_delay})",
        )
        if self.topology is not None:
            object.__setattr__(self, "topology", types.MappingProxyType(dict(self.topology)))


@renamed_field("threadiness", "workers")
@dataclass(frozen=True)
class ProvisionControllerOptions:
    """Every option of upstream's ``ProvisionController``, with its default.

    Saving provisioned PVs: by default the blocking *backoff store* makes
    ``create_provisioned_pv_retry_count`` attempts ``create_provisioned_pv_interval`` apart and
    deletes the asset if all fail. ``create_provisioned_pv_backoff`` replaces that schedule;
    ``create_provisioned_pv_limiter`` selects the *queue store* instead, which saves PVs in the
    background and retries forever. These three are mutually exclusive, as upstream.
    """

    resync_period: float = DEFAULT_RESYNC_PERIOD
    """Informer resync period; failed claims and volumes are retried at least this often."""
    workers: int = DEFAULT_WORKERS
    """Claim workers and volume workers, each (``--worker-threads``; upstream's
    ``Threadiness``). ``threadiness=`` still works, with a DeprecationWarning."""
    exponential_backoff_on_error: bool = DEFAULT_EXPONENTIAL_BACKOFF_ON_ERROR
    """Back off exponentially (15 s to 1000 s) between retries; else a flat 15 s."""
    rate_limiter: RateLimiter | None = None
    """Rate limiter of the claim and volume queues; overrides ``exponential_backoff_on_error``.
    As upstream, one instance serves both queues."""
    create_provisioned_pv_retry_count: int | None = None
    """Attempts to save a PV (default 5). Deprecated upstream in favour of the limiter."""
    create_provisioned_pv_interval: float | None = None
    """Seconds between save attempts (default 10). Deprecated upstream too."""
    create_provisioned_pv_backoff: Backoff | None = None
    """A custom save schedule instead of retry count + interval."""
    create_provisioned_pv_limiter: RateLimiter | None = None
    """Save PVs in background workers retried with this limiter (the queue store)."""
    failed_provision_threshold: int = DEFAULT_FAILED_PROVISION_THRESHOLD
    """Failures after which a claim is given up; 0 retries forever. Claims whose volume may
    still be being created in the background (``IN_BACKGROUND``) are never given up."""
    failed_delete_threshold: int = DEFAULT_FAILED_DELETE_THRESHOLD
    """Failures after which a volume's deletion is given up; 0 retries forever."""
    leader_election: bool = DEFAULT_LEADER_ELECTION
    """Run the control loops only while holding the lease."""
    leader_election_namespace: str | None = None
    """Namespace of the lease; default: :func:`in_cluster_namespace`."""
    lease_duration: float = DEFAULT_LEASE_DURATION
    """Lease duration in seconds."""
    renew_deadline: float = DEFAULT_RENEW_DEADLINE
    """Renew deadline in seconds."""
    retry_period: float = DEFAULT_RETRY_PERIOD
    """Leader-election retry period in seconds."""
    metrics_port: int = DEFAULT_METRICS_PORT
    """Serve metrics on this port (0: do not serve them from the controller)."""
    metrics_address: str = DEFAULT_METRICS_ADDRESS
    """Address to serve metrics on."""
    metrics_path: str = DEFAULT_METRICS_PATH
    """HTTP path of the metrics endpoint."""
    metrics: ProvisionMetrics | None = None
    """The collectors to update (upstream's ``MetricsInstance``); default: the process-wide
    ones in prometheus_client's default registry."""
    additional_provisioner_names: tuple[str, ...] = ()
    """Other provisioner names this controller also acts for (migration, renames)."""
    add_finalizer: bool = DEFAULT_ADD_FINALIZER
    """Protect Delete-policy PVs with ``external-provisioner.volume.kubernetes.io/finalizer``
    until their asset is deleted."""
    provisioning_finalizer: bool = DEFAULT_PROVISIONING_FINALIZER
    """Put ``pyprovlib.io/provisioning-protection`` on a claim before its volume is first
    requested and take it off once the claim is bound (or provisioning failed for good), so a
    claim deleted meanwhile waits until its volume is created and deleted again — even across a
    restart of the controller (upstream's open issue kubernetes-csi/external-provisioner#486).
    Needs ``patch`` on persistentvolumeclaims."""
    retry_interval_max: float = DEFAULT_RETRY_INTERVAL_MAX
    """How long a claim whose provisioning failed as infeasible waits before the next try
    (unless its StorageClass is replaced meanwhile)."""
    provision_timeout: float | None = None
    """Limit on one provisioning attempt in seconds (None: unlimited)."""
    deletion_timeout: float | None = None
    """Limit on one deletion attempt in seconds (None: unlimited)."""
    volume_name_hook: VolumeNameHook = field(default=provisioned_volume_name)
    """Names the PV of a claim; default ``pvc-<claim uid>``."""
    node_deployment: NodeDeployment | None = None
    """Run as one of many instances, one per node (see :class:`NodeDeployment`); needs
    ``leader_election=False``. None: one controller for the cluster."""

    def __post_init__(self) -> None:
        names: object = self.additional_provisioner_names
        if isinstance(names, str):
            raise InvalidOptionsError(
                "additional_provisioner_names must be a sequence of names, not a single string"
            )
        object.__setattr__(
            self, "additional_provisioner_names", tuple(self.additional_provisioner_names)
        )
        _check(self.resync_period >= 0, f"resync_period must be >= 0, got {self.resync_period}")
        _check(self.workers >= 1, f"workers must be at least 1, got {self.workers}")
        _check(
            self.failed_provision_threshold >= 0,
            f"failed_provision_threshold must be >= 0, got {self.failed_provision_threshold}",
        )
        _check(
            self.failed_delete_threshold >= 0,
            f"failed_delete_threshold must be >= 0, got {self.failed_delete_threshold}",
        )
        if self.create_provisioned_pv_retry_count is not None:
            _check(
                self.create_provisioned_pv_retry_count >= 1,
                "create_provisioned_pv_retry_count must be at least 1, got "
                f"{self.create_provisioned_pv_retry_count}",
            )
        if self.create_provisioned_pv_interval is not None:
            _check(
                self.create_provisioned_pv_interval >= 0,
                "create_provisioned_pv_interval must be >= 0, got "
                f"{self.create_provisioned_pv_interval}",
            )
        linear = (
            self.create_provisioned_pv_retry_count is not None
            or self.create_provisioned_pv_interval is not None
        )
        chosen = [
            name
            for name, on in (
                ("create_provisioned_pv_retry_count/interval", linear),
                ("create_provisioned_pv_backoff", self.create_provisioned_pv_backoff is not None),
                ("create_provisioned_pv_limiter", self.create_provisioned_pv_limiter is not None),
            )
            if on
        ]
        _check(
            len(chosen) <= 1,
            f"{' and '.join(chosen)} cannot be used together: choose one way to save PVs",
        )
        for name in ("lease_duration", "renew_deadline", "retry_period", "retry_interval_max"):
            value = getattr(self, name)
            _check(value > 0, f"{name} must be > 0, got {value}")
        if self.leader_election:
            # client-go's NewLeaderElector checks these too.
            _check(
                self.lease_duration > self.renew_deadline,
                f"lease_duration ({self.lease_duration}) must be greater than renew_deadline "
                f"({self.renew_deadline})",
            )
            _check(
                self.renew_deadline > 1.2 * self.retry_period,
                f"renew_deadline ({self.renew_deadline}) must be greater than 1.2 x "
                f"retry_period ({self.retry_period})",
            )
        _check(
            0 <= self.metrics_port <= 65535,
            f"metrics_port must be between 0 and 65535, got {self.metrics_port}",
        )
        _check(
            self.metrics_path.startswith("/"),
            f"metrics_path must start with '/', got {self.metrics_path!r}",
        )
        for name in ("provision_timeout", "deletion_timeout"):
            value = getattr(self, name)
            _check(value is None or value > 0, f"{name} must be > 0 or None, got {value}")
        _check(callable(self.volume_name_hook), "volume_name_hook must be callable")
        _check(
            self.node_deployment is None or not self.leader_election,
            "node_deployment runs one controller on every node, each for its own node: set "
            "leader_election=False (a shared lease would let only one node provision)",
        )
        for extra in self.additional_provisioner_names:
            _check(
                isinstance(extra, str) and bool(extra),
                f"additional_provisioner_names must hold non-empty strings, got {extra!r}",
            )

    @property
    def pv_backoff(self) -> Backoff:
        """The schedule the backoff store uses (meaningless with the queue store)."""
        if self.create_provisioned_pv_backoff is not None:
            return self.create_provisioned_pv_backoff
        return Backoff(
            duration=(
                DEFAULT_CREATE_PROVISIONED_PV_INTERVAL
                if self.create_provisioned_pv_interval is None
                else self.create_provisioned_pv_interval
            ),
            factor=1.0,
            steps=(
                DEFAULT_CREATE_PROVISIONED_PV_RETRY_COUNT
                if self.create_provisioned_pv_retry_count is None
                else self.create_provisioned_pv_retry_count
            ),
        )


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise InvalidOptionsError(message)

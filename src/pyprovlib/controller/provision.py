"""The ProvisionController: dynamic provisioning and deletion of PersistentVolumes for a
:class:`~pyprovlib.provisioner.Provisioner` — sig-storage-lib-external-provisioner's
``controller.go`` (v13) on asyncio.

Claims flow in from a shared informer, keyed by UID; volumes keyed by name. A claim annotated
for this provisioner (``volume.kubernetes.io/storage-provisioner``, or the beta annotation) is
provisioned once its StorageClass is known (and, for ``WaitForFirstConsumer``, once the
scheduler picked a node); the PV the provisioner returns gets its claimRef, class, reclaim
policy, mount options, ``pv.kubernetes.io/provisioned-by`` and optionally the protection
finalizer, and is saved through a volume store. A Released PV with the Delete policy that this
provisioner created is deleted: first the asset, then the PV (with a UID precondition), then
the finalizer.

Differences from upstream, each on purpose:

- Claims whose provisioning may still run in the background (``IN_BACKGROUND``) are retried
  beyond ``failed_provision_threshold``: giving up on them could leak a volume.
- A claim waiting out an infeasible error is re-queued for the time remaining instead of
  failing every retry, so the wait neither burns the failure budget nor spins.
- The PV is deleted with a UID precondition, so a PV recreated under the same name is never
  deleted by mistake.
- v13 hands the provisioner the selected node's name only, so no Node object is fetched.
- Checks kube-controller-manager does for in-tree plugins are done here too: a claim with a
  selector, an invalid storage request or (for provisioners declaring
  :class:`MountOptionsProvisioner` without support) a class with mountOptions gets a
  ``ProvisioningFailed`` event instead of a call to the provisioner.
"""

from __future__ import annotations

import asyncio
import copy
import socket
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, Final

import structlog
from kubernetes_asyncio.client import (
    ApiClient,
    V1PersistentVolume,
    V1PersistentVolumeClaim,
)

from pyprovlib._logging import get_logger
from pyprovlib.controller._errors import describe_user_error, is_user_bug, log_user_bug
from pyprovlib.controller._lifecycle import ControllerLifecycle, LeaderElectionLostError
from pyprovlib.controller.claim_protection import (
    FINALIZER_PROVISIONING,
    ClaimProtection,
    add_provisioning_finalizer,
    is_deleting,
    only_protection_changed,
    remove_provisioning_finalizer,
)
from pyprovlib.controller.expectations import VolumeExpectations
from pyprovlib.controller.metrics import ProvisionMetrics, default_metrics
from pyprovlib.controller.options import ProvisionControllerOptions, provisioned_volume_name
from pyprovlib.controller.volume_store import (
    DEFAULT_STORE_THREADINESS,
    BackoffStore,
    QueueStore,
    VolumeStore,
    event_target,
)
from pyprovlib.errors import PyprovlibError
from pyprovlib.kube.clock import Clock
from pyprovlib.kube.convert import ConversionError, from_model, to_model
from pyprovlib.kube.errors import ApiException, is_conflict, is_not_found
from pyprovlib.kube.events import EventRecorder
from pyprovlib.kube.informer import SharedInformer, SharedInformerFactory
from pyprovlib.kube.objects import (
    Obj,
    annotations_of,
    finalizers_of,
    meta,
    name_of,
    namespace_of,
    uid_of,
)
from pyprovlib.kube.quantity import parse_storage_size
from pyprovlib.kube.resources import (
    PERSISTENT_VOLUME_CLAIMS,
    PERSISTENT_VOLUMES,
    STORAGE_CLASSES,
)
from pyprovlib.kube.rest import ResourceClient
from pyprovlib.kube.store import UID_INDEX, DeletedFinalStateUnknown, deletion_handling_key
from pyprovlib.kube.workqueue import (
    BucketRateLimiter,
    ItemExponentialFailureRateLimiter,
    MaxOfRateLimiter,
    RateLimiter,
    RateLimitingQueue,
)
from pyprovlib.provisioner import (
    BlockProvisioner,
    DeletionGuard,
    IgnoredError,
    InfeasibleError,
    MountOptionsProvisioner,
    Provisioner,
    ProvisioningError,
    ProvisioningState,
    ProvisionOptions,
    Qualifier,
)
from pyprovlib.redaction import scrub_text

__all__ = [
    "ANN_ALPHA_SELECTED_NODE",
    "ANN_BETA_STORAGE_CLASS",
    "ANN_BETA_STORAGE_PROVISIONER",
    "ANN_DYNAMICALLY_PROVISIONED",
    "ANN_MIGRATED_TO",
    "ANN_SELECTED_NODE",
    "ANN_STORAGE_PROVISIONER",
    "FINALIZER_PROVISIONING",
    "FINALIZER_PV",
    "ClassNotFoundError",
    "InfeasibleError",
    "LeaderElectionLostError",
    "MountOptionsProvisioner",
    "ProvisionController",
    "SlowSet",
    "add_finalizer",
    "claim_is_block",
    "claim_reference",
    "claim_wants_provisioning",
    "complete_volume",
    "desired_finalizers",
    "get_claim_class",
    "is_infeasible_error",
    "is_provisioner_for_volume",
    "remove_finalizer",
    "volume_should_delete",
]

log = get_logger(__name__)

ANN_DYNAMICALLY_PROVISIONED: Final = "pv.kubernetes.io/provisioned-by"
"""Set on every provisioned PV to the provisioner name; deletion keys on it."""
ANN_MIGRATED_TO: Final = "pv.kubernetes.io/migrated-to"
"""Names the CSI driver an in-tree PV was migrated to; deletion honours it too."""
ANN_BETA_STORAGE_PROVISIONER: Final = "volume.beta.kubernetes.io/storage-provisioner"
"""Set by the PV controller on claims it wants provisioned (deprecated form)."""
ANN_STORAGE_PROVISIONER: Final = "volume.kubernetes.io/storage-provisioner"
"""Set by the PV controller on claims it wants provisioned."""
ANN_SELECTED_NODE: Final = "volume.kubernetes.io/selected-node"
"""Set by the scheduler on WaitForFirstConsumer claims: the node the pod goes to."""
ANN_ALPHA_SELECTED_NODE: Final = "volume.alpha.kubernetes.io/selected-node"
"""The Kubernetes 1.11 form of :data:`ANN_SELECTED_NODE`."""
ANN_BETA_STORAGE_CLASS: Final = "volume.beta.kubernetes.io/storage-class"
"""The pre-``spec.storageClassName`` way of naming a claim's class."""
FINALIZER_PV: Final = "external-provisioner.volume.kubernetes.io/finalizer"
"""Keeps a Delete-policy PV around until its asset is deleted (with ``add_finalizer``)."""

EVENT_NORMAL: Final = "Normal"
EVENT_WARNING: Final = "Warning"
WAIT_FOR_FIRST_CONSUMER: Final = "WaitForFirstConsumer"
EVENT_FLUSH_TIMEOUT: Final = 5.0
"""Seconds a graceful stop waits for pending events to be written."""
STORE_DRAIN_TIMEOUT: Final = 10.0
"""Seconds a graceful stop spends on a last attempt to save PVs the queue store holds."""

# --------------------------------------------------------------------------------------------
# Errors and extension points
# --------------------------------------------------------------------------------------------


class ClassNotFoundError(PyprovlibError, LookupError):
    """The StorageClass a claim names is not (yet) known."""

    def __init__(self, class_name: str) -> None:
        super().__init__(
            f'StorageClass "{class_name}" not found: create it, or correct the claim\'s '
            "storageClassName"
        )
        self.class_name = class_name


class _DelayRetryError(PyprovlibError):
    """A claim still waits out an infeasible error (upstream's ``DelayRetryError``)."""

    def __init__(self, key: str, remaining: float) -> None:
        super().__init__(
            f"skipping volume provisioning for pvc {key}, because provisioning previously "
            "failed with infeasible error"
        )
        self.remaining = remaining


class _StopProvisionError(PyprovlibError):
    """Provisioning is impossible or done; the claim must not be retried (``errStopProvision``)."""


_STOP = _StopProvisionError("stop provisioning")
_SAVED = _StopProvisionError("the volume's PersistentVolume exists")

"""Like :data:`_STOP`, but the claim's PV exists: its provisioning-protection finalizer stays
until the claim is bound."""


def is_infeasible_error(err: BaseException) -> bool:
    """True for :class:`InfeasibleError` and for a gRPC ``INVALID_ARGUMENT`` status (a CSI
    driver refusing the request), also when it is the cause or context of the error raised
    (``raise ProvisioningError(...) from None`` still records the gRPC error as context)."""
    seen: set[int] = set()
    pending: list[BaseException] = [err]
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, InfeasibleError):
            return True
        status = getattr(current, "status", None)
        if type(current).__name__ == "GRPCError" and getattr(status, "name", "") == (
            "INVALID_ARGUMENT"
        ):
            return True
        pending.extend(e for e in (current.__cause__, current.__context__) if e is not None)
    return False


# --------------------------------------------------------------------------------------------
# Pure decisions over the JSON dicts (upstream's helpers; unit-tested on their own)
# --------------------------------------------------------------------------------------------


def _spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    spec = obj.get("spec")
    return spec if (type(spec) is dict or isinstance(spec, Mapping)) else {}


def _status_phase(obj: Mapping[str, Any]) -> str:
    status = obj.get("status")
    phase = status.get("phase") if (type(status) is dict or isinstance(status, Mapping)) else None
    return phase if isinstance(phase, str) else ""


def get_claim_class(claim: Mapping[str, Any]) -> str:
    """The claim's class: the beta annotation if present, else ``spec.storageClassName``
    (upstream's ``GetPersistentVolumeClaimClass``); '' for none."""
    ann = annotations_of(claim).get(ANN_BETA_STORAGE_CLASS)
    if isinstance(ann, str):
        return ann
    name = _spec(claim).get("storageClassName")
    return name if isinstance(name, str) else ""


def claim_is_block(claim: Mapping[str, Any]) -> bool:
    """True when the claim asks for a raw block volume (``volumeMode: Block``)."""
    return _spec(claim).get("volumeMode") == "Block"


def _known(name: object, names: Collection[str]) -> bool:
    return isinstance(name, str) and bool(name) and name in names


def _requested_provisioner(claim: Mapping[str, Any]) -> object:
    """The provisioner a claim's storage-provisioner annotation names (GA, else beta)."""
    annotations = annotations_of(claim)
    provisioner = annotations.get(ANN_STORAGE_PROVISIONER)
    if provisioner is None:
        provisioner = annotations.get(ANN_BETA_STORAGE_PROVISIONER)
    return provisioner


def claim_wants_provisioning(
    claim: Mapping[str, Any],
    storage_class: Mapping[str, Any] | None,
    names: Collection[str],
) -> bool:
    """Whether ``claim`` asks one of ``names`` to provision it (upstream's ``shouldProvision``
    minus the Qualifier): not bound yet, the storage-provisioner annotation (GA, else beta)
    names one of ``names``, and for a ``WaitForFirstConsumer`` class a node was selected.

    ``storage_class`` is the claim's class from the cache, None when it does not exist, which
    raises :class:`ClassNotFoundError` for a claim meant for us.
    """
    if _spec(claim).get("volumeName"):
        return False
    if not _known(_requested_provisioner(claim), names):
        return False
    annotations = annotations_of(claim)
    if storage_class is None:
        raise ClassNotFoundError(get_claim_class(claim))
    if storage_class.get("volumeBindingMode") == WAIT_FOR_FIRST_CONSUMER:
        # The PV controller only annotates such claims once a node is selected, but a
        # provisioner may have removed the node again to have the scheduler pick another.
        return bool(annotations.get(ANN_SELECTED_NODE))
    return True


def is_provisioner_for_volume(volume: Mapping[str, Any], names: Collection[str]) -> bool:
    """Whether a PV is this provisioner's to manage (upstream's ``isProvisionerForVolume``):
    provisioned by one of ``names`` (or migrated to one), or, when statically created, a CSI
    volume of one of ``names`` or an in-tree volume migrated to one."""
    annotations = annotations_of(volume)
    migrated = annotations.get(ANN_MIGRATED_TO)
    if ANN_DYNAMICALLY_PROVISIONED in annotations:
        return _known(annotations.get(ANN_DYNAMICALLY_PROVISIONED), names) or _known(
            migrated, names
        )
    csi = _spec(volume).get("csi")
    if isinstance(csi, Mapping):
        return _known(csi.get("driver"), names)
    return _known(migrated, names)


def volume_should_delete(volume: Mapping[str, Any], add_finalizer: bool) -> bool:
    """Upstream's ``shouldDelete`` without the DeletionGuard: Released, reclaim policy Delete,
    and not already being deleted — except that with ``add_finalizer`` a PV being deleted but
    still holding our finalizer must still have its asset deleted."""
    deleting = meta(volume).get("deletionTimestamp") is not None
    if add_finalizer:
        if deleting and FINALIZER_PV not in finalizers_of(volume):
            return False
    elif deleting:
        return False
    if _status_phase(volume) != "Released":
        return False
    return _spec(volume).get("persistentVolumeReclaimPolicy") == "Delete"


def add_finalizer(finalizers: list[str] | None, finalizer: str) -> tuple[list[str], bool]:
    """``finalizers`` with ``finalizer`` appended (a new list), and whether it was added."""
    current = list(finalizers or [])
    if finalizer in current:
        return current, False
    return [*current, finalizer], True


def remove_finalizer(finalizers: list[str] | None, finalizer: str) -> tuple[list[str] | None, bool]:
    """``finalizers`` without ``finalizer`` (a new list, None when empty), and whether it was
    there. The input is not modified."""
    original = list(finalizers or [])
    kept = [f for f in original if f != finalizer]
    return (kept or None), len(kept) != len(original)


def desired_finalizers(volume: Mapping[str, Any], add_finalizer_enabled: bool) -> list[str] | None:
    """The finalizers ``volume`` should have under upstream's ``handleProtectionFinalizer``, or
    None when they are right as they are: add ours to a Bound, Delete-policy PV not being
    deleted (with ``add_finalizer``); remove it when the option is off or the policy is Retain
    or Recycle."""
    finalizers = finalizers_of(volume)
    policy = _spec(volume).get("persistentVolumeReclaimPolicy")
    deleting = meta(volume).get("deletionTimestamp") is not None
    if (
        add_finalizer_enabled
        and policy == "Delete"
        and not deleting
        and _status_phase(volume) == "Bound"
    ):
        updated, changed = add_finalizer(finalizers, FINALIZER_PV)
        return updated if changed else None
    if not add_finalizer_enabled or policy in ("Retain", "Recycle"):
        removed, changed = remove_finalizer(finalizers, FINALIZER_PV)
        return (removed or []) if changed else None
    return None


def claim_reference(claim: Mapping[str, Any]) -> Obj:
    """An ObjectReference to ``claim`` with its UID and resourceVersion (``ref.GetReference``)."""
    ref: Obj = {
        "kind": "PersistentVolumeClaim",
        "apiVersion": "v1",
        "namespace": namespace_of(claim),
        "name": name_of(claim),
        "uid": uid_of(claim),
    }
    rv = meta(claim).get("resourceVersion")
    if rv:
        ref["resourceVersion"] = str(rv)
    return ref


def complete_volume(
    volume: Obj,
    *,
    claim: Mapping[str, Any],
    storage_class: Mapping[str, Any],
    add_finalizer_enabled: bool,
) -> Obj:
    """Fill in what the controller owns on a provisioned PV (modifies and returns ``volume``):
    claimRef, ``pv.kubernetes.io/provisioned-by`` (the class's provisioner), storageClassName,
    the finalizer with ``add_finalizer``, and — where the provisioner left them empty — the
    class's reclaim policy (Delete by default) and mount options."""
    metadata = volume.setdefault("metadata", {})
    spec = volume.setdefault("spec", {})
    spec["claimRef"] = claim_reference(claim)
    if add_finalizer_enabled:
        finalizers, _ = add_finalizer(metadata.get("finalizers"), FINALIZER_PV)
        metadata["finalizers"] = finalizers
    annotations = metadata.get("annotations")
    if not isinstance(annotations, dict):
        annotations = metadata["annotations"] = {}
    annotations[ANN_DYNAMICALLY_PROVISIONED] = str(storage_class.get("provisioner", ""))
    spec["storageClassName"] = get_claim_class(claim)
    if not spec.get("persistentVolumeReclaimPolicy"):
        spec["persistentVolumeReclaimPolicy"] = storage_class.get("reclaimPolicy") or "Delete"
    mount_options = storage_class.get("mountOptions")
    if not spec.get("mountOptions") and mount_options:
        spec["mountOptions"] = list(mount_options)
    return volume


# --------------------------------------------------------------------------------------------
# The slow set of infeasible claims (csi-lib-utils' slowset)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _SlowEntry:
    since: float
    class_uid: str


class SlowSet:
    """Claims whose provisioning failed as infeasible, each held for ``retry_interval_max``
    seconds from when it was added (expired entries are dropped on access)."""

    def __init__(self, retry_interval_max: float, clock: Clock) -> None:
        self.retry_interval_max = retry_interval_max
        self._clock = clock
        self._entries: dict[str, _SlowEntry] = {}

    def add(self, key: str, class_uid: str) -> None:
        """Hold ``key`` from now on."""
        self._entries[key] = _SlowEntry(self._clock.monotonic(), class_uid)

    def remove(self, key: str) -> None:
        """Stop holding ``key``."""
        self._entries.pop(key, None)

    def class_uid(self, key: str) -> str | None:
        """The StorageClass UID recorded for ``key``, if it is held."""
        self._expire(key)
        entry = self._entries.get(key)
        return entry.class_uid if entry else None

    def time_remaining(self, key: str) -> float:
        """Seconds ``key`` is still held (0 when it is not)."""
        self._expire(key)
        entry = self._entries.get(key)
        if entry is None:
            return 0.0
        return max(0.0, entry.since + self.retry_interval_max - self._clock.monotonic())

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.time_remaining(key) > 0

    def _expire(self, key: str) -> None:
        entry = self._entries.get(key)
        if entry is not None and self._clock.monotonic() >= entry.since + self.retry_interval_max:
            del self._entries[key]


# --------------------------------------------------------------------------------------------
# The controller
# --------------------------------------------------------------------------------------------


def _claim_target(claim: Obj) -> Obj:
    return event_target(claim, "PersistentVolumeClaim")


def _default_volume_name(claim: Obj) -> str:
    """:func:`~pyprovlib.controller.options.provisioned_volume_name` on the claim's dict."""
    uid = uid_of(claim)
    if not uid:
        raise ValueError("the claim has no metadata.uid; a PV name cannot be derived from it")
    return f"pvc-{uid}"


def _claim_key(claim: Mapping[str, Any]) -> str:
    return f"{namespace_of(claim)}/{name_of(claim)}"


def _source_kind(claim: Mapping[str, Any]) -> str:
    source = _spec(claim).get("dataSource")
    kind = source.get("kind") if isinstance(source, Mapping) else None
    return kind if isinstance(kind, str) else ""


def _describe(err: BaseException) -> str:
    if isinstance(err, ApiException):
        return f"{err.status} {err.reason}".strip()
    if is_user_bug(err):
        # The type says what the bare message does not; the text may quote anything.
        return scrub_text(describe_user_error(err))
    text = str(err)
    return text or type(err).__name__


def _storage_request(claim: Mapping[str, Any]) -> object:
    resources = _spec(claim).get("resources")
    requests = (
        resources.get("requests")
        if (type(resources) is dict or isinstance(resources, Mapping))
        else None
    )
    return (
        requests.get("storage")
        if (type(requests) is dict or isinstance(requests, Mapping))
        else None
    )


class ProvisionController(ControllerLifecycle):
    """Provisions PersistentVolumes for claims and deletes them when released, on behalf of
    ``provisioner`` for claims naming ``provisioner_name`` (upstream's ``ProvisionController``).

    ``client`` is a kubernetes-asyncio ``ApiClient``. Informers come from ``informer_factory``
    when given — the caller then starts it, as upstream does with custom informers — or from a
    factory the controller owns and starts. :meth:`run` runs everything until cancelled or
    :meth:`stop`; it can be called once.
    """

    def __init__(
        self,
        client: ApiClient,
        provisioner_name: str,
        provisioner: Provisioner,
        options: ProvisionControllerOptions | None = None,
        *,
        informer_factory: SharedInformerFactory | None = None,
        clock: Clock | None = None,
    ) -> None:
        if not provisioner_name:
            raise ValueError("provisioner_name must not be empty")
        self.provisioner_name = provisioner_name
        self.provisioner = provisioner
        self.options = options or ProvisionControllerOptions()
        super().__init__(
            client,
            self.options,
            role="provisioner",
            lease_name=provisioner_name.replace("/", "-"),
            log=log.bind(provisioner=provisioner_name),
            informer_factory=informer_factory,
            clock=clock,
        )
        self.metrics: ProvisionMetrics = self.options.metrics or default_metrics()
        self._names = frozenset((provisioner_name, *self.options.additional_provisioner_names))
        host = socket.gethostname()
        self.component = f"{provisioner_name}_{self.id}"
        self.recorder = EventRecorder(client, self.component, host=host, clock=self._clock)
        self._claims_client = ResourceClient(client, PERSISTENT_VOLUME_CLAIMS)
        self._volumes_client = ResourceClient(client, PERSISTENT_VOLUMES)

        limiter = self._queue_rate_limiter()
        self.claim_queue: RateLimitingQueue[str] = RateLimitingQueue(
            "claims", limiter, clock=self._clock
        )
        self.volume_queue: RateLimitingQueue[str] = RateLimitingQueue(
            "volumes", limiter, clock=self._clock
        )

        self.claim_informer: SharedInformer = self.informer_factory.informer_for(
            PERSISTENT_VOLUME_CLAIMS
        )
        self.claim_informer.add_event_handler(
            on_add=self._enqueue_claim,
            on_update=self._claim_updated,
            # A worker finds the claim gone and forgets what it remembered of it; a claim
            # being provisioned is in claims-in-progress, so it is still processed.
            on_delete=self._enqueue_deleted_claim,
        )
        self.volume_informer: SharedInformer = self.informer_factory.informer_for(
            PERSISTENT_VOLUMES
        )
        self.volume_informer.add_event_handler(
            on_add=self._enqueue_volume,
            on_update=lambda _old, new: self._enqueue_volume(new),
            on_delete=self._forget_volume,
        )
        self.class_informer: SharedInformer = self.informer_factory.informer_for(STORAGE_CLASSES)

        self.slow_set = SlowSet(self.options.retry_interval_max, self._clock)
        # Upstream's claimsInProgress: claims whose volume may still be being created.
        self._claims_in_progress: dict[str, Obj] = {}
        # What this process wrote that its caches may not show yet: one object per concern.
        self._volume_expectations = VolumeExpectations()
        self._protection = ClaimProtection()
        # The model of each StorageClass version handed to the provisioner: converted once per
        # version, not once per claim (like Go, every claim of a class sees the one cached
        # object; user code must not modify it).
        self.volume_store: VolumeStore
        if self.options.create_provisioned_pv_limiter is not None:
            self._log.debug("saving PVs to the API server in the background")
            self.volume_store = QueueStore(
                client,
                self.options.create_provisioned_pv_limiter,
                self.claim_informer.store,
                self.recorder,
                clock=self._clock,
            )
        else:
            self._log.debug("saving PVs to the API server with blocking retries")
            self.volume_store = BackoffStore(
                client, self.recorder, self.options.pv_backoff, provisioner, clock=self._clock
            )

    # -- lifecycle -----------------------------------------------------------------------------

    def _queue_rate_limiter(self) -> RateLimiter:
        if self.options.rate_limiter is not None:
            return self.options.rate_limiter
        max_delay = 1000.0 if self.options.exponential_backoff_on_error else 15.0
        return MaxOfRateLimiter(
            ItemExponentialFailureRateLimiter(15.0, max_delay),
            BucketRateLimiter(10.0, 100, clock=self._clock),
        )

    def stop(self) -> None:
        """Stop gracefully: no new work is taken, operations in flight finish, pending events
        are written, then :meth:`run` returns (and releases the lease)."""
        super().stop()

    def claims_in_progress(self) -> frozenset[str]:
        """UIDs of claims whose volume may still be being created in the background."""
        return frozenset(self._claims_in_progress)

    def _work_queues(self) -> tuple[RateLimitingQueue[str], ...]:
        return (self.claim_queue, self.volume_queue)

    async def run(self) -> None:
        """Run until cancelled or :meth:`stop`. With leader election, the control loops run only
        while this instance holds the lease; losing it raises :class:`LeaderElectionLostError`
        (upstream exits the process)."""
        with self._running():
            self._log.info("starting provisioner controller", component=self.component)
            failure: Exception | None = None
            async with asyncio.TaskGroup() as tg:
                background = [
                    tg.create_task(self.recorder.run(), name="events"),
                    tg.create_task(
                        self.volume_store.run(DEFAULT_STORE_THREADINESS), name="volume-store"
                    ),
                ]
                if self.options.metrics_port > 0:
                    background.append(tg.create_task(self._serve_metrics(), name="metrics"))
                try:
                    await self._run_elected()
                except Exception as err:  # re-raised as is below, not as an ExceptionGroup
                    failure = err
                else:
                    # Graceful tail: PVs still queued get a last chance, events get written.
                    await self.volume_store.drain(STORE_DRAIN_TIMEOUT)
                    if not await self.recorder.flush(EVENT_FLUSH_TIMEOUT):
                        self._log.warning("not every event could be written before stopping")
                for task in background:
                    task.cancel()
            if failure is not None:
                raise failure
        self._log.info("provisioner controller stopped", component=self.component)

    async def _run_controller(self) -> None:
        """Informers, then workers, until stop (upstream's ``run`` closure)."""
        async with asyncio.TaskGroup() as tg:
            informers = tg.create_task(self._run_informers(), name="informers")
            async with self.claim_queue, self.volume_queue:
                caches = (self.claim_informer, self.volume_informer, self.class_informer)
                if await self._wait_for_sync(caches):
                    self._synced = True
                    workers = [
                        tg.create_task(
                            self._worker(self.claim_queue, self._process_claim, drain=False)
                        )
                        for _ in range(self.options.threadiness)
                    ] + [
                        tg.create_task(
                            self._worker(self.volume_queue, self._process_volume, drain=False)
                        )
                        for _ in range(self.options.threadiness)
                    ]
                    self._log.info("started provisioner controller", component=self.component)
                    await self._stop_requested.wait()
                    self._synced = False
                    self.claim_queue.shut_down()
                    self.volume_queue.shut_down()
                    # Workers finish the item in hand and take no other.
                    await asyncio.gather(*workers)
            informers.cancel()

    async def _serve_metrics(self) -> None:
        from aiohttp import web
        from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

        registry = self.metrics.registry or REGISTRY

        async def handle(_: web.Request) -> web.Response:
            return web.Response(
                body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
            )

        app = web.Application()
        app.router.add_get(self.options.metrics_path, handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            site = web.TCPSite(runner, self.options.metrics_address, self.options.metrics_port)
            await site.start()
            self._log.info(
                "serving metrics",
                address=f"{self.options.metrics_address}:{self.options.metrics_port}",
                path=self.options.metrics_path,
            )
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    # -- handlers ----------------------------------------------------------------------------

    def _enqueue_claim(self, obj: Obj) -> None:
        uid = uid_of(obj)
        if uid:
            self.claim_queue.add(uid)

    def _claim_updated(self, old: Obj, new: Obj) -> None:
        if self.options.provisioning_finalizer and only_protection_changed(old, new):
            # Our own finalizer PATCH echoing back: the worker that wrote it already acted on
            # this claim's state (a sync costs more than this comparison).
            return
        self._enqueue_claim(new)

    def _enqueue_deleted_claim(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        last = obj.obj if isinstance(obj, DeletedFinalStateUnknown) else obj
        # A claim in progress is in the queue already and keeps its retry timing (upstream
        # does nothing here); any other is synced once more, to forget it.
        if uid_of(last) not in self._claims_in_progress:
            self._enqueue_claim(last)

    def _enqueue_volume(self, obj: Obj) -> None:
        name = name_of(obj)
        if name:
            self.volume_queue.add(name)

    def _forget_volume(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        try:
            key = deletion_handling_key(obj)
        except ValueError:
            return
        self.volume_queue.forget(key)
        # The worker finds the PV gone and settles the expectations about it.
        self.volume_queue.add(key)

    # -- claims ------------------------------------------------------------------------------

    def _deadline(self, timeout: float | None) -> float | None:
        return None if timeout is None else asyncio.get_running_loop().time() + timeout

    async def _process_claim(self, key: str) -> None:
        logger = self._log.bind(claim_uid=key)
        try:
            await self._sync_claim_handler(key, self._deadline(self.options.provision_timeout))
        except _DelayRetryError as err:
            logger.debug("claim waits out an infeasible error", retry_in=err.remaining)
            self.claim_queue.add_after(key, err.remaining)
        except Exception as err:  # every failure is retried through the queue
            self._handle_claim_error(key, err, logger)
        else:
            self.claim_queue.forget(key)
            # Provisioning succeeded or the claim is not ours: nothing runs in the background.
            if self._claims_in_progress.pop(key, None) is not None and not (
                self.claim_informer.store.by_index(UID_INDEX, key)
            ):
                self._protection.forget(key)  # it was deleted while in progress

    def _handle_claim_error(
        self, key: str, err: Exception, logger: structlog.typing.FilteringBoundLogger
    ) -> None:
        failures = self.claim_queue.num_requeues(key)
        threshold = self.options.failed_provision_threshold
        error = _describe(err)
        if threshold == 0 or failures < threshold:
            logger.info("retrying syncing claim", failures=failures, error=error)
            self.claim_queue.add_rate_limited(key)
        elif key in self._claims_in_progress:
            # Upstream gives up here and may leak the volume being created; keep going.
            logger.warning(
                "claim failed too often but may be provisioned in the background; retrying",
                failures=failures,
                threshold=threshold,
                error=error,
            )
            self.claim_queue.add_rate_limited(key)
        else:
            # Done but not forgotten: the failure count stays until the claim changes.
            logger.error(
                "giving up syncing claim", failures=failures, threshold=threshold, error=error
            )

    async def _sync_claim_handler(self, key: str, deadline: float | None) -> None:
        found = self.claim_informer.store.by_index(UID_INDEX, key)
        if found:
            claim = found[0]
        else:
            in_progress = self._claims_in_progress.get(key)
            if in_progress is None:
                self._log.debug("claim in work queue no longer exists", claim_uid=key)
                self.slow_set.remove(key)
                self._protection.forget(key)
                return
            claim = in_progress
        await self.sync_claim(claim, deadline)

    def _storage_class(self, name: str) -> Obj | None:
        return self.class_informer.store.get_by_key(name)

    def _unpreparable(
        self, claim: Obj, err: Exception, logger: Any
    ) -> tuple[ProvisioningState, Exception]:
        """Report a claim that cannot be provisioned as it is (malformed, or a broken volume
        name hook): an event and an error log, never a crash."""
        message = f"cannot provision claim {_claim_key(claim)}: {_describe(err)}"
        if is_user_bug(err):
            log_user_bug(logger, "cannot prepare provisioning", err)
        else:
            logger.error("cannot prepare provisioning", error=_describe(err))
        self.recorder.event(_claim_target(claim), EVENT_WARNING, "ProvisioningFailed", message)
        return ProvisioningState.FINISHED, err

    def _delay_if_recently_infeasible(self, claim: Obj) -> None:
        key = uid_of(claim)
        recorded = self.slow_set.class_uid(key)
        if recorded is None:
            return
        current = self._storage_class(get_claim_class(claim))
        if current is None:
            return
        if recorded != uid_of(current):
            # The class was replaced: its new parameters may well work.
            self.slow_set.remove(key)
            return
        remaining = self.slow_set.time_remaining(key)
        if remaining > 0:
            raise _DelayRetryError(key, remaining)

    async def should_provision(self, claim: Obj) -> bool:
        """Whether ``claim`` should be provisioned now (upstream's ``shouldProvision``);
        raises :class:`ClassNotFoundError` when it is ours but its class is unknown."""
        if _spec(claim).get("volumeName"):
            return False
        if isinstance(self.provisioner, Qualifier):
            model = to_model(claim, V1PersistentVolumeClaim)
            if not await self.provisioner.should_provision(model):
                return False
        return claim_wants_provisioning(
            claim, self._storage_class(get_claim_class(claim)), self._names
        )

    async def sync_claim(self, claim: Obj, deadline: float | None = None) -> None:
        """Provision ``claim`` if it should be; raises when the claim must be retried."""
        if self._protection.is_protected(claim):
            if await self._sync_protected_claim(claim, deadline):
                return
        else:
            # The cache shows our removal now (this claim's, not any claim's: see issue 20).
            self._protection.seen_without_finalizer(uid_of(claim))
            if self.options.provisioning_finalizer and is_deleting(claim):
                # Its volume was never requested (the finalizer would be on it), or it was and
                # the claim was released: either way nothing is left to do.
                return
        self._delay_if_recently_infeasible(claim)
        class_name = get_claim_class(claim)
        source = _source_kind(claim)
        try:
            should = await self.should_provision(claim)
        except ClassNotFoundError as err:
            self.metrics.provision_failed(class_name, source)
            self.recorder.event(_claim_target(claim), EVENT_WARNING, "ProvisioningFailed", str(err))
            raise
        except Exception as err:
            self.metrics.provision_failed(class_name, source)
            if is_user_bug(err):
                log_user_bug(
                    self._log.bind(claim=_claim_key(claim), **{"class": class_name}),
                    "the provisioner's should_provision raised an unexpected exception",
                    err,
                )
            raise
        if not should:
            return
        start = self._clock.monotonic()
        state, error = await self.provision_claim_operation(claim, deadline)
        if error is None:
            self.metrics.provision_succeeded(class_name, source, self._clock.monotonic() - start)
        else:
            self.metrics.provision_failed(class_name, source)
        uid = uid_of(claim)
        if error is None or state is ProvisioningState.FINISHED:
            self._claims_in_progress.pop(uid, None)
            if error is not None and error is not _SAVED and self._protection.is_protected(claim):
                # Nothing is being created for the claim any more: let it be deleted freely.
                await self._release_claim(claim, "provisioning ended without a volume")
            if error is None or isinstance(error, _StopProvisionError):
                return
            raise error
        if state is ProvisioningState.IN_BACKGROUND:
            self._log.info("provisioning in the background; claim kept in progress", claim_uid=uid)
            self._claims_in_progress[uid] = claim
        # NO_CHANGE keeps whatever the previous attempt left in claims-in-progress.
        raise error

    async def provision_claim_operation(
        self, claim: Obj, deadline: float | None = None, *, undo: bool = False
    ) -> tuple[ProvisioningState, Exception | None]:
        """One provisioning attempt (upstream's ``provisionClaimOperation``). Returns the state
        the backend is in and None on success, a stop marker when the claim must not be retried,
        or the error to retry on.

        With ``undo`` (a deleted claim whose volume may have been created meanwhile) the volume
        is finished and then deleted with ``provisioner.delete`` instead of saved as a PV."""
        class_name = get_claim_class(claim)
        claim_key = _claim_key(claim)
        logger = self._log.bind(claim=claim_key, **{"class": class_name})

        try:
            if self.options.volume_name_hook is provisioned_volume_name:
                pv_name = _default_volume_name(claim)  # reads only the uid: no model needed
            else:
                pv_name = self.options.volume_name_hook(to_model(claim, V1PersistentVolumeClaim))
            if not isinstance(pv_name, str) or not pv_name:
                raise ValueError(f"the volume name hook returned {pv_name!r}")
        except Exception as err:  # malformed claim or broken hook: report, never crash
            return self._unpreparable(claim, err, logger)
        logger = logger.bind(pv=pv_name)

        # A previous attempt may have finished meanwhile: the PV name is deterministic.
        if (
            self._volume_expectations.saved_not_seen(pv_name)
            or self.volume_informer.store.get_by_key(pv_name) is not None
        ):
            logger.debug("PersistentVolume already exists, skipping")
            return ProvisioningState.FINISHED, _SAVED

        refusal = self._refuse_claim(claim)
        if refusal is not None:
            self.recorder.event(_claim_target(claim), EVENT_WARNING, "ProvisioningFailed", refusal)
            logger.error("failed to provision volume", reason=refusal)
            return ProvisioningState.FINISHED, _STOP

        storage_class = self._storage_class(class_name)
        if storage_class is None:
            # Fixable by creating the class: retry.
            return ProvisioningState.FINISHED, ClassNotFoundError(class_name)
        class_provisioner = storage_class.get("provisioner")
        if not _known(class_provisioner, self._names):
            # The class changed since the claim was annotated, or names another provisioner.
            logger.error(
                "unknown provisioner requested in claim's StorageClass",
                requested=class_provisioner,
            )
            return ProvisioningState.FINISHED, _STOP

        mount_options = storage_class.get("mountOptions")
        if (
            mount_options
            and isinstance(self.provisioner, MountOptionsProvisioner)
            and not self.provisioner.supports_mount_options()
        ):
            message = (
                "Mount options are not supported by the provisioner but StorageClass "
                f'"{class_name}" has mount options {list(mount_options)}: remove them from '
                "the class, or use a class without them"
            )
            self.recorder.event(_claim_target(claim), EVENT_WARNING, "ProvisioningFailed", message)
            return ProvisioningState.FINISHED, ProvisioningError(message)

        if (
            self.options.provisioning_finalizer
            and not undo
            and not self._protection.is_protected(claim)
        ):
            protected = await self._protect_claim(claim, logger)
            if protected is None:
                return ProvisioningState.FINISHED, _STOP
            if isinstance(protected, Exception):
                return ProvisioningState.FINISHED, protected
            claim = protected

        annotations = annotations_of(claim)
        selected = annotations.get(ANN_SELECTED_NODE) or annotations.get(ANN_ALPHA_SELECTED_NODE)
        # The cached dicts: the options convert them to models only if the provisioner asks.
        options = ProvisionOptions(
            storage_class=storage_class,
            pv_name=pv_name,
            pvc=claim,
            selected_node_name=selected or None,
        )

        self.recorder.event(
            _claim_target(claim),
            EVENT_NORMAL,
            "Provisioning",
            f'External provisioner is provisioning volume for claim "{claim_key}"'
            if not undo
            else f'External provisioner is finishing the volume of deleted claim "{claim_key}" '
            "to delete it",
        )
        try:
            async with asyncio.timeout_at(deadline):
                result = await self.provisioner.provision(options)
        except IgnoredError as err:
            logger.info("volume provision ignored", reason=err.reason)
            return ProvisioningState.FINISHED, _STOP
        except ConversionError as err:
            # The claim or its class could not be read as a model: nothing was created with
            # it, and only a change to the object can fix that.
            message = f'claim "{claim_key}" or its StorageClass "{class_name}" is malformed: {err}'
            logger.error("cannot provision volume", error=message)
            self.recorder.event(_claim_target(claim), EVENT_WARNING, "ProvisioningFailed", message)
            return ProvisioningState.FINISHED, err
        except ProvisioningError as err:
            if is_infeasible_error(err):
                return self._infeasible(claim, storage_class, err, logger)
            return await self._provision_error(claim, class_name, err.state, err, logger)
        except TimeoutError as err:
            timeout = ProvisioningError(
                f"provisioning did not finish within {self.options.provision_timeout}s; the "
                "backend may still be creating the volume",
                ProvisioningState.IN_BACKGROUND,
            )
            timeout.__cause__ = err
            return await self._provision_error(
                claim, class_name, ProvisioningState.IN_BACKGROUND, timeout, logger
            )
        except Exception as err:  # unknown failure: the backend may have done part of the work
            if is_infeasible_error(err):
                return self._infeasible(claim, storage_class, err, logger)
            return await self._provision_error(
                claim, class_name, ProvisioningState.IN_BACKGROUND, err, logger
            )

        try:
            if isinstance(result, Mapping):
                volume = copy.deepcopy(dict(result))
            elif isinstance(result, V1PersistentVolume):
                volume = from_model(result)
            else:
                raise ConversionError(
                    f"the provisioner returned {type(result).__name__}, not a "
                    "V1PersistentVolume or its JSON mapping"
                )
        except ConversionError as err:
            # The asset may exist: keep retrying so a fixed provisioner finishes it.
            return await self._provision_error(
                claim, class_name, ProvisioningState.IN_BACKGROUND, err, logger
            )
        volume.setdefault("apiVersion", "v1")
        volume.setdefault("kind", "PersistentVolume")
        volume_meta = volume.setdefault("metadata", {})
        if not volume_meta.get("name"):
            volume_meta["name"] = pv_name
        elif volume_meta["name"] != pv_name:
            logger.warning(
                "the provisioner named the PV differently from options.pv_name; after a crash "
                "its asset will not be found again",
                returned=volume_meta["name"],
            )
        complete_volume(
            volume,
            claim=claim,
            storage_class=storage_class,
            add_finalizer_enabled=self.options.add_finalizer,
        )
        if undo:
            return await self._undo_volume(claim, volume, deadline, logger)
        logger.info("volume provisioned")
        # Before the save: the informer may show the PV before store_volume returns.
        self._volume_expectations.expect_saved(name_of(volume))
        try:
            await self.volume_store.store_volume(claim, volume)
        except Exception as err:  # the store reported and cleaned up; retry from scratch
            self._volume_expectations.save_failed(name_of(volume))
            return ProvisioningState.FINISHED, err
        return ProvisioningState.FINISHED, None

    def _refuse_claim(self, claim: Obj) -> str | None:
        """Why this claim cannot be provisioned by us at all, or None."""
        if claim_is_block(claim) and not (
            isinstance(self.provisioner, BlockProvisioner) and self.provisioner.supports_block()
        ):
            return f"{self.provisioner_name} does not support block volume provisioning"
        if _spec(claim).get("selector") is not None:
            return (
                "claim Selector is not supported: dynamically provisioned volumes cannot match "
                "a label selector; remove spec.selector from the claim"
            )
        # kube-apiserver refuses such claims; a cache can still hold one (another server, a
        # relaxed validator), and a volume of no size must never reach the provisioner.
        request = _storage_request(claim)
        if request is None:
            return (
                f"claim {_claim_key(claim)} has no spec.resources.requests.storage; "
                "set the size the volume should have"
            )
        try:
            size = parse_storage_size(request, what="storage request")
        except ValueError as err:
            return f"claim {_claim_key(claim)} has an invalid {err}"
        if size == 0:
            return (
                f"claim {_claim_key(claim)} requests {request!r} of storage; "
                "the request must be greater than zero"
            )
        return None

    def _infeasible(
        self,
        claim: Obj,
        storage_class: Obj,
        err: Exception,
        logger: structlog.typing.FilteringBoundLogger,
    ) -> tuple[ProvisioningState, Exception | None]:
        logger.info("detected infeasible volume provisioning request", error=_describe(err))
        self.slow_set.add(uid_of(claim), uid_of(storage_class))
        self.recorder.event(
            _claim_target(claim),
            EVENT_WARNING,
            "ProvisioningFailed",
            "Volume provisioning failed with infeasible error. Retries will be delayed. "
            f"{_describe(err)}",
        )
        return ProvisioningState.FINISHED, err

    async def _provision_error(
        self,
        claim: Obj,
        class_name: str,
        state: ProvisioningState,
        err: Exception,
        logger: structlog.typing.FilteringBoundLogger,
    ) -> tuple[ProvisioningState, Exception | None]:
        """Upstream's ``provisionVolumeErrorHandling``: event, and rescheduling when asked."""
        message = f'failed to provision volume with StorageClass "{class_name}": {_describe(err)}'
        self.recorder.event(_claim_target(claim), EVENT_WARNING, "ProvisioningFailed", message)
        if is_user_bug(err):
            log_user_bug(
                logger,
                "provisioning failed: the provisioner raised an unexpected exception",
                err,
                state=state.name,
            )
        else:
            logger.info("provisioning failed", state=state.name, error=_describe(err))
        if state is ProvisioningState.RESCHEDULE:
            if ANN_SELECTED_NODE in annotations_of(claim):
                # The selected node cannot host the volume: let the scheduler pick again.
                try:
                    await self._reschedule(claim)
                except Exception as update_err:  # retried as if the state were FINISHED
                    logger.info("volume rescheduling failed", error=_describe(update_err))
                    return ProvisioningState.FINISHED, err
                logger.info("volume rescheduled", error=_describe(err))
                return ProvisioningState.FINISHED, _STOP
            # Nothing to reschedule without a selected node.
            state = ProvisioningState.FINISHED
        return state, err

    async def _reschedule(self, claim: Obj) -> None:
        """Remove the selected-node annotation (an update guarded by resourceVersion)."""
        # With its type: items of the initial LIST come without kind and apiVersion.
        updated = copy.deepcopy(_claim_target(claim))
        annotations = updated.get("metadata", {}).get("annotations") or {}
        annotations.pop(ANN_SELECTED_NODE, None)
        result = await self._claims_client.replace(updated)
        # The cache would otherwise hand out the old claim until the watch catches up.
        store = self.claim_informer.store
        if store.get_by_key(_claim_key(result)) is not None:
            store.update(result)

    # -- provisioning protection (``provisioning_finalizer``) ---------------------------------

    async def _protect_claim(
        self, claim: Obj, logger: structlog.typing.FilteringBoundLogger
    ) -> Obj | Exception | None:
        """Put the provisioning-protection finalizer on ``claim`` before its volume is
        requested. Returns the claim as saved; None when it is gone or was replaced (nothing to
        provision); the error to retry on when the write failed (nothing is requested
        unprotected)."""
        try:
            saved = await add_provisioning_finalizer(self._claims_client, claim)
        except ApiException as err:
            if is_not_found(err) or is_conflict(err):
                logger.info("claim is gone or was replaced; not provisioning", status=err.status)
                return None
            # 422 when the claim is being deleted (no new finalizers then): the retry sees the
            # deletionTimestamp and leaves the claim alone.
            logger.info("cannot add the provisioning-protection finalizer", error=_describe(err))
            return ProvisioningError(
                f"cannot add finalizer {FINALIZER_PROVISIONING} to claim {_claim_key(claim)}: "
                f"{_describe(err)}",
                ProvisioningState.FINISHED,
            )
        self._protection.added(uid_of(claim))
        return saved

    async def _release_claim(self, claim: Obj, why: str) -> None:
        """Remove the provisioning-protection finalizer from ``claim``. A failure raises (the
        claim is retried); a claim already gone counts as released."""
        try:
            await remove_provisioning_finalizer(self._claims_client, claim)
        except ApiException as err:
            if not is_conflict(err):  # 409: the name belongs to a recreated claim now
                raise
        self._protection.released(claim)
        self._log.debug(
            "removed the provisioning-protection finalizer", claim=_claim_key(claim), why=why
        )

    async def _sync_protected_claim(self, claim: Obj, deadline: float | None) -> bool:
        """A claim carrying the provisioning-protection finalizer: release it once bound; finish
        and delete the volume of a deleted one. Returns False when the claim is to be provisioned
        as usual."""
        if not _known(_requested_provisioner(claim), self._names):
            return True  # another provisioner's claim (and finalizer)
        if _spec(claim).get("volumeName"):
            uid = uid_of(claim)
            if not self._protection.released_while_bound(uid):  # else: predates our removal
                await self._release_claim(claim, "claim is bound")
                self._protection.mark_released_while_bound(uid)
            return True
        if not is_deleting(claim):
            return False
        if self._protection.was_cleaned_up(uid_of(claim)):
            # A deleting claim never gets a finalizer back: this version predates our release.
            return True
        if isinstance(self.provisioner, Qualifier):
            model = to_model(claim, V1PersistentVolumeClaim)
            if not await self.provisioner.should_provision(model):
                return True  # the instance the claim qualifies for cleans up
        await self._clean_up_deleted_claim(claim, deadline)
        return True

    async def _clean_up_deleted_claim(self, claim: Obj, deadline: float | None) -> None:
        """The claim was deleted before it was bound, while its volume may have been (or still
        be being) created: with a saved PV there is nothing to do (reclaiming the released PV
        deletes the volume); otherwise ask the provisioner for the volume again — provisioning
        is idempotent by PV name, so this finishes the one already started — and delete it
        (with a Retain class: save its PV instead). Then release the claim. Raises to retry."""
        uid = uid_of(claim)
        claim_key = _claim_key(claim)
        logger = self._log.bind(claim=claim_key)
        try:
            pv_name = self.options.volume_name_hook(to_model(claim, V1PersistentVolumeClaim))
        except Exception as err:  # no name now means no volume could be requested before
            logger.warning("cannot name the volume of a deleted claim", error=_describe(err))
            await self._release_claim(claim, "claim cannot be provisioned")
            return
        if await self._volume_saved(pv_name):
            await self._release_claim(claim, "claim deleted after its PV was saved")
            return
        class_name = get_claim_class(claim)
        storage_class = self._storage_class(class_name)
        if storage_class is None:
            message = (
                f"claim {claim_key} was deleted while its volume may have been being created, "
                f'but StorageClass "{class_name}" is gone, so the volume cannot be finished and '
                "deleted: recreate the class, or remove the finalizer "
                f"{FINALIZER_PROVISIONING} from the claim to let it go (a volume created "
                "meanwhile would then leak)"
            )
            logger.error("cannot clean up after a deleted claim", reason=message)
            self.recorder.event(
                _claim_target(claim), EVENT_WARNING, "ProvisioningCleanupFailed", message
            )
            self._claims_in_progress[uid] = claim
            raise ClassNotFoundError(class_name)
        undo = (storage_class.get("reclaimPolicy") or "Delete") == "Delete"
        logger.info("claim deleted before it was bound; finishing its volume", delete=undo)
        state, error = await self.provision_claim_operation(claim, deadline, undo=undo)
        if error is None or state is ProvisioningState.FINISHED:
            self._claims_in_progress.pop(uid, None)
            await self._release_claim(claim, "volume of the deleted claim dealt with")
            if error is not None and not isinstance(error, _StopProvisionError):
                logger.info(
                    "provisioning for the deleted claim ended without a volume",
                    error=_describe(error),
                )
            return
        # The volume may still be being created: keep trying, however often it fails.
        self._claims_in_progress[uid] = claim
        raise error

    async def _volume_saved(self, pv_name: str) -> bool:
        """Whether the PV ``pv_name`` exists or will be saved — asked of the API server when the
        caches do not show it, as a volume is about to be deleted otherwise."""
        if self._volume_expectations.saved_not_seen(
            pv_name
        ) or self.volume_informer.store.get_by_key(pv_name):
            return True
        if isinstance(self.volume_store, QueueStore) and self.volume_store.is_pending(pv_name):
            return True
        try:
            await self._volumes_client.get(pv_name)
        except ApiException as err:
            if is_not_found(err):
                return False
            raise
        return True

    async def _undo_volume(
        self,
        claim: Obj,
        volume: Obj,
        deadline: float | None,
        logger: structlog.typing.FilteringBoundLogger,
    ) -> tuple[ProvisioningState, Exception | None]:
        """Delete the volume just provisioned for a deleted claim (``provisioner.delete`` on the
        PV that would have been saved)."""
        pv_name = name_of(volume)
        try:
            model = to_model(volume, V1PersistentVolume)
            if isinstance(self.provisioner, DeletionGuard) and not (
                await self.provisioner.should_delete(model)
            ):
                raise ProvisioningError(
                    f"the provisioner's should_delete refuses volume {pv_name}",
                    ProvisioningState.IN_BACKGROUND,
                )
            async with asyncio.timeout_at(deadline):
                await self.provisioner.delete(model)
        except IgnoredError as err:
            logger.info("the provisioner leaves the volume of the deleted claim", reason=err.reason)
            return ProvisioningState.FINISHED, _STOP
        except Exception as err:  # the volume exists: retry until it is deleted
            message = (
                f"claim {_claim_key(claim)} was deleted while its volume {pv_name} was being "
                f"created; deleting the volume failed (will retry): {_describe(err)}"
            )
            if is_user_bug(err):
                log_user_bug(logger, "cannot delete the volume of a deleted claim", err)
            else:
                logger.warning("cannot delete the volume of a deleted claim", error=_describe(err))
            self.recorder.event(
                _claim_target(claim), EVENT_WARNING, "ProvisioningCleanupFailed", message
            )
            failure = ProvisioningError(message, ProvisioningState.IN_BACKGROUND)
            failure.__cause__ = err
            return ProvisioningState.IN_BACKGROUND, failure
        logger.info("deleted the volume of a deleted claim", pv=pv_name)
        return ProvisioningState.FINISHED, _STOP

    # -- volumes -----------------------------------------------------------------------------

    async def _process_volume(self, key: str) -> None:
        logger = self._log.bind(pv=key)
        try:
            await self._sync_volume_handler(key, self._deadline(self.options.deletion_timeout))
        except Exception as err:  # every failure is retried through the queue
            failures = self.volume_queue.num_requeues(key)
            threshold = self.options.failed_delete_threshold
            if threshold == 0 or failures < threshold:
                logger.info("retrying syncing volume", failures=failures, error=_describe(err))
                self.volume_queue.add_rate_limited(key)
            else:
                logger.error(
                    "giving up syncing volume",
                    failures=failures,
                    threshold=threshold,
                    error=_describe(err),
                )
        else:
            self.volume_queue.forget(key)

    async def _sync_volume_handler(self, key: str, deadline: float | None) -> None:
        volume = self.volume_informer.store.get_by_key(key)
        self._volume_expectations.observed(key, volume)
        if volume is None:
            return  # already deleted
        await self.sync_volume(volume, deadline)

    async def sync_volume(self, volume: Obj, deadline: float | None = None) -> None:
        """Keep the finalizer right and delete the volume if it should be (``syncVolume``)."""
        if not is_provisioner_for_volume(volume, self._names):
            return
        volume = await self._handle_protection_finalizer(volume)
        if await self.should_delete(volume):
            start = self._clock.monotonic()
            class_name = str(_spec(volume).get("storageClassName") or "")
            try:
                await self.delete_volume_operation(volume, deadline)
            except Exception:
                self.metrics.delete_failed(class_name)
                raise
            self.metrics.delete_succeeded(class_name, self._clock.monotonic() - start)

    async def _handle_protection_finalizer(self, volume: Obj) -> Obj:
        wanted = desired_finalizers(volume, self.options.add_finalizer)
        if wanted is None:
            return volume
        name = name_of(volume)
        try:
            return await self._patch_finalizers(volume, wanted)
        except ApiException as err:
            raise RuntimeError(
                f"failed to set finalizers {wanted} on PersistentVolume {name}: {_describe(err)}"
            ) from err

    async def _patch_finalizers(self, volume: Obj, finalizers: list[str]) -> Obj:
        # A merge patch carrying resourceVersion: a concurrent change answers 409 and the
        # volume is re-read through the queue instead of being overwritten.
        body = {
            "metadata": {
                "finalizers": finalizers or None,
                "resourceVersion": meta(volume).get("resourceVersion"),
            }
        }
        return await self._volumes_client.patch(name_of(volume), body)

    async def should_delete(self, volume: Obj) -> bool:
        """Whether the volume's asset should be deleted now (``shouldDelete``)."""
        if not volume_should_delete(volume, self.options.add_finalizer):
            return False
        if isinstance(self.provisioner, DeletionGuard):
            model = to_model(volume, V1PersistentVolume)
            try:
                return await self.provisioner.should_delete(model)
            except Exception as err:
                if is_user_bug(err):
                    log_user_bug(
                        self._log.bind(pv=name_of(volume)),
                        "the provisioner's should_delete raised an unexpected exception",
                        err,
                    )
                raise
        return True

    async def delete_volume_operation(self, volume: Obj, deadline: float | None = None) -> None:
        """Delete the asset, then the PV, then our finalizer (``deleteVolumeOperation``).
        Raises when it must be retried."""
        name = name_of(volume)
        logger = self._log.bind(pv=name)
        if not self._volume_expectations.is_asset_deleted(volume):
            model = to_model(volume, V1PersistentVolume)
            try:
                async with asyncio.timeout_at(deadline):
                    await self.provisioner.delete(model)
            except IgnoredError as err:
                logger.info("volume deletion ignored", reason=err.reason)
                return
            except Exception as err:  # reported on the PV and retried
                if isinstance(err, TimeoutError):
                    message = (
                        "deleting the volume did not finish within "
                        f"{self.options.deletion_timeout}s"
                    )
                else:
                    message = _describe(err)
                if is_user_bug(err):
                    log_user_bug(logger, "volume deletion failed", err)
                else:
                    logger.warning("volume deletion failed", error=message)
                self.recorder.event(
                    event_target(volume, "PersistentVolume"),
                    EVENT_WARNING,
                    "VolumeFailedDelete",
                    message,
                )
                raise
            # Updates of the PV racing with its deletion must not delete the asset twice.
            self._volume_expectations.asset_deleted(volume)
            logger.info("volume deleted")

        try:
            remaining = await self._volumes_client.delete(
                name, preconditions={"uid": uid_of(volume)}
            )
        except ApiException as err:
            if is_not_found(err):
                return
            if is_conflict(err):
                # Another PV now has this name: ours is gone, and that one is not ours to delete.
                logger.info("PersistentVolume was replaced meanwhile; leaving the new one")
                return
            logger.info("failed to delete PersistentVolume", error=_describe(err))
            raise

        if self.options.add_finalizer and remaining is not None:
            finalizers, changed = remove_finalizer(finalizers_of(remaining), FINALIZER_PV)
            if changed:
                try:
                    await self._patch_finalizers(remaining, finalizers or [])
                except ApiException as err:
                    if not is_not_found(err):
                        logger.info("failed to remove finalizer", error=_describe(err))
                        raise
        logger.info("PersistentVolume deleted")

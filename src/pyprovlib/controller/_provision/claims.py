"""The claim side of the provisioning controller (upstream's ``syncClaim``,
``shouldProvision`` and ``provisionClaimOperation``): decide whether a claim is ours to
provision now, refuse what cannot be provisioned (block volumes without support, selectors,
a bad size, mount options), call the provisioner, complete the PV it returns and hand it to the
volume store, and turn each failure into an event, a retry, a reschedule or a stop.

Invariants:

- A claim is provisioned at most once per PV name: a PV saved (even if the cache does not show
  it yet, see
  :class:`~pyprovlib.controller._provision.expectations.VolumeExpectations`) ends
  provisioning for good.
- A claim whose volume may still be being created in the background stays in
  :attr:`ClaimSync.in_progress`
  and is retried beyond the failure threshold, deleted or not, so its volume is never
  leaked.
- User code receives kubernetes-asyncio models, each call converting the claim (or PV) it is
  given once; nothing is converted for a call that is not made (no Qualifier, the default
  volume name hook, a provisioner reading only
  :attr:`~pyprovlib.ProvisionOptions.claim_object`).
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Mapping
from dataclasses import dataclass

import structlog
from kubernetes_asyncio.client import V1PersistentVolume, V1PersistentVolumeClaim

from pyprovlib._provisioner import (
    BlockProvisioner,
    IgnoredError,
    MountOptionsProvisioner,
    ProvisioningError,
    ProvisioningState,
    ProvisionOptions,
    Qualifier,
)
from pyprovlib.controller._errors import DelayRetryError, is_user_bug, log_user_bug
from pyprovlib.controller._options import provisioned_volume_name
from pyprovlib.controller._provision.attempt import Outcome, ProvisionAttempt
from pyprovlib.controller._provision.context import ProvisionContext
from pyprovlib.controller._provision.decisions import (
    ANN_ALPHA_SELECTED_NODE,
    ANN_SELECTED_NODE,
    EVENT_NORMAL,
    EVENT_WARNING,
    claim_key,
    claim_refusal,
    claim_target,
    claim_wants_provisioning,
    complete_volume,
    default_volume_name,
    get_claim_class,
    is_known,
    requested_provisioner,
    source_kind,
)
from pyprovlib.controller._provision.errors import (
    ClassNotFoundError,
    describe,
    is_infeasible_error,
)
from pyprovlib.controller._provision.expectations import VolumeExpectations
from pyprovlib.controller._provision.node_deployment import NodeOwnership
from pyprovlib.controller._provision.protected_claims import ClaimFinalizer
from pyprovlib.controller._provision.protection import (
    FINALIZER_PROVISIONING,
    ClaimProtection,
    is_deleting,
)
from pyprovlib.controller._provision.slowset import SlowSet
from pyprovlib.controller._volume_store import VolumeStore
from pyprovlib.kube._convert import ConversionError, copy_json, from_model, to_model
from pyprovlib.kube._objects import Obj, annotations_of, name_of, spec_of, uid_of
from pyprovlib.kube._store import UID_INDEX
from pyprovlib.kube._workqueue import RateLimitingQueue

__all__ = ["ClaimSync"]


@dataclass(frozen=True, slots=True)
class _Plan:
    """What an attempt asks the provisioner for: the PV's name and the claim's class."""

    pv_name: str
    storage_class: Obj
    logger: structlog.typing.FilteringBoundLogger


class ClaimSync:
    """Processes the keys (claim UIDs) of the claim queue.

    ``in_progress`` is upstream's ``claimsInProgress``: claims (by UID) whose volume may still
    be being created in the background, kept with the last version seen so a claim deleted
    meanwhile is still processed. Only workers read or write it; the claim-deleted handler
    reads it to leave such a claim's queue timing alone.
    """

    def __init__(
        self,
        ctx: ProvisionContext,
        queue: RateLimitingQueue[str],
        expectations: VolumeExpectations,
        volume_store: VolumeStore,
        node: NodeOwnership | None = None,
    ) -> None:
        self._ctx = ctx
        self._expectations = expectations
        self._volume_store = volume_store
        self.queue = queue
        self.in_progress: dict[str, Obj] = {}
        self.protection = ClaimProtection()
        self._finalizer = ClaimFinalizer(ctx, self.protection, expectations, volume_store)
        self.slow_set = SlowSet(ctx.options.retry_interval_max, ctx.clock)
        self.node = node
        """With a node deployment, which claims are this node's (and the race for them)."""

    # -- the queue -----------------------------------------------------------------------------

    async def process(self, key: str) -> None:
        """Sync the claim with UID ``key``, retrying failures through the queue (upstream's
        ``processNextClaimWorkItem``)."""
        logger = self._ctx.log.bind(claim_uid=key)
        try:
            await self._sync_handler(key, self._ctx.deadline(self._ctx.options.provision_timeout))
        except DelayRetryError as err:
            logger.debug("claim waits out an infeasible error", retry_in=err.delay)
            self.queue.add_after(key, err.delay)
        except Exception as err:  # every failure is retried through the queue
            self._handle_error(key, err, logger)
        else:
            self.queue.forget(key)
            # Provisioning succeeded or the claim is not ours: nothing runs in the background.
            if self.in_progress.pop(key, None) is not None and not (
                self._ctx.claims.by_index(UID_INDEX, key)
            ):
                self.protection.forget(key)  # it was deleted while in progress

    def _handle_error(
        self, key: str, err: Exception, logger: structlog.typing.FilteringBoundLogger
    ) -> None:
        failures = self.queue.num_requeues(key)
        threshold = self._ctx.options.failed_provision_threshold
        error = describe(err)
        if threshold == 0 or failures < threshold:
            logger.info("retrying syncing claim", failures=failures, error=error)
            self.queue.add_rate_limited(key)
        elif key in self.in_progress:
            # Upstream gives up here and may leak the volume being created; keep going.
            logger.warning(
                "claim failed too often but may be provisioned in the background; retrying",
                failures=failures,
                threshold=threshold,
                error=error,
            )
            self.queue.add_rate_limited(key)
        else:
            # Done but not forgotten: the failure count stays until the claim changes.
            logger.error(
                "giving up syncing claim", failures=failures, threshold=threshold, error=error
            )

    async def _sync_handler(self, key: str, deadline: float | None) -> None:
        found = self._ctx.claims.by_index(UID_INDEX, key)
        if found:
            claim = found[0]
        else:
            in_progress = self.in_progress.get(key)
            if in_progress is None:
                self._ctx.log.debug("claim in work queue no longer exists", claim_uid=key)
                self.slow_set.remove(key)
                self.protection.forget(key)
                if self.node is not None:
                    self.node.forget(key)
                return
            claim = in_progress
        await self.sync_claim(claim, deadline)

    # -- one claim -----------------------------------------------------------------------------

    def _delay_if_recently_infeasible(self, claim: Obj) -> None:
        key = uid_of(claim)
        recorded = self.slow_set.class_uid(key)
        if recorded is None:
            return
        current = self._ctx.storage_class(get_claim_class(claim))
        if current is None:
            return
        if recorded != uid_of(current):
            # The class was replaced: its new parameters may well work.
            self.slow_set.remove(key)
            return
        remaining = self.slow_set.time_remaining(key)
        if remaining > 0:
            raise DelayRetryError(
                f"skipping volume provisioning for pvc {key}, because provisioning previously "
                "failed with infeasible error",
                remaining,
            )

    async def should_provision(self, claim: Obj) -> bool:
        """Whether ``claim`` should be provisioned now (upstream's ``shouldProvision``);
        raises :class:`ClassNotFoundError` when it is ours but its class is unknown."""
        if spec_of(claim).get("volumeName"):
            return False
        if self.node is not None:
            return await self._should_provision_on_node(claim, self.node)
        if isinstance(self._ctx.provisioner, Qualifier):
            model = to_model(claim, V1PersistentVolumeClaim)
            if not await self._ctx.provisioner.should_provision(model):
                return False
        return claim_wants_provisioning(
            claim, self._ctx.storage_class(get_claim_class(claim)), self._ctx.names
        )

    async def _should_provision_on_node(self, claim: Obj, node: NodeOwnership) -> bool:
        # Ours at all first, then this node's (which may start the race for an Immediate
        # claim), then the Qualifier: it sees only claims this node owns.
        storage_class = self._ctx.storage_class(get_claim_class(claim))
        if not claim_wants_provisioning(claim, storage_class, self._ctx.names):
            return False
        assert storage_class is not None  # claim_wants_provisioning raised otherwise
        if not await node.owns(claim, storage_class):
            return False
        if isinstance(self._ctx.provisioner, Qualifier):
            model = to_model(claim, V1PersistentVolumeClaim)
            return await self._ctx.provisioner.should_provision(model)
        return True

    async def sync_claim(self, claim: Obj, deadline: float | None = None) -> None:
        """Provision ``claim`` if it should be; raises when the claim must be retried."""
        if self.protection.is_protected(claim):
            if await self._sync_protected_claim(claim, deadline):
                return
        else:
            # The cache shows our removal now (this claim's, not any claim's: see issue 20).
            self.protection.seen_without_finalizer(uid_of(claim))
            if self._ctx.options.provisioning_finalizer and is_deleting(claim):
                # Its volume was never requested (the finalizer would be on it), or it was and
                # the claim was released: either way nothing is left to do.
                return
        self._delay_if_recently_infeasible(claim)
        if not await self._counted_should_provision(claim):
            return
        start = self._ctx.clock.monotonic()
        attempt = await self.provision_claim_operation(claim, deadline)
        if attempt.outcome is Outcome.PROVISIONED:
            self._ctx.metrics.provision_succeeded(
                get_claim_class(claim), source_kind(claim), self._ctx.clock.monotonic() - start
            )
        else:
            self._ctx.metrics.provision_failed(get_claim_class(claim), source_kind(claim))
        await self._settle(claim, attempt)

    async def _counted_should_provision(self, claim: Obj) -> bool:
        """:meth:`should_provision`, its failures counted and reported."""
        class_name = get_claim_class(claim)
        try:
            return await self.should_provision(claim)
        except ClassNotFoundError as err:
            self._ctx.metrics.provision_failed(class_name, source_kind(claim))
            self._ctx.recorder.event(
                claim_target(claim), EVENT_WARNING, "ProvisioningFailed", str(err)
            )
            raise
        except Exception as err:
            self._ctx.metrics.provision_failed(class_name, source_kind(claim))
            if is_user_bug(err):
                log_user_bug(
                    self._ctx.log.bind(claim=claim_key(claim), **{"class": class_name}),
                    "the provisioner's should_provision raised an unexpected exception",
                    err,
                )
            raise

    async def _settle(self, claim: Obj, attempt: ProvisionAttempt) -> None:
        """Keep or drop the claim from :attr:`in_progress` after ``attempt``, release it when
        nothing is being created for it any more, and raise the error to retry on."""
        uid = uid_of(claim)
        if attempt.finished:
            self.in_progress.pop(uid, None)
            if not attempt.left_volume and self.protection.is_protected(claim):
                # Nothing is being created for the claim any more: let it be deleted freely.
                await self._finalizer.release(claim, "provisioning ended without a volume")
        elif attempt.state is ProvisioningState.IN_BACKGROUND:
            self._ctx.log.info(
                "provisioning in the background; claim kept in progress", claim_uid=uid
            )
            self.in_progress[uid] = claim
        # NO_CHANGE keeps whatever the previous attempt left in claims-in-progress.
        if attempt.error is not None:
            raise attempt.error

    # -- a claim carrying the provisioning-protection finalizer ----------------------------------

    async def _sync_protected_claim(self, claim: Obj, deadline: float | None) -> bool:
        """A claim carrying the provisioning-protection finalizer: release it once bound; finish
        and delete the volume of a deleted one. Returns False when the claim is to be provisioned
        as usual."""
        if not is_known(requested_provisioner(claim), self._ctx.names):
            return True  # another provisioner's claim (and finalizer)
        if spec_of(claim).get("volumeName"):
            uid = uid_of(claim)
            if not self.protection.released_while_bound(uid):  # else: predates our removal
                await self._finalizer.release(claim, "claim is bound")
                self.protection.mark_released_while_bound(uid)
            return True
        if not is_deleting(claim):
            return False
        if self.protection.was_cleaned_up(uid_of(claim)):
            # A deleting claim never gets a finalizer back: this version predates our release.
            return True
        if isinstance(self._ctx.provisioner, Qualifier):
            model = to_model(claim, V1PersistentVolumeClaim)
            if not await self._ctx.provisioner.should_provision(model):
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
        logger = self._ctx.log.bind(claim=claim_key(claim))
        try:
            pv_name = self.volume_name(claim)
        except Exception as err:  # no name now means no volume could be requested before
            logger.warning("cannot name the volume of a deleted claim", error=describe(err))
            await self._finalizer.release(claim, "claim cannot be provisioned")
            return
        if await self._finalizer.volume_saved(pv_name):
            await self._finalizer.release(claim, "claim deleted after its PV was saved")
            return
        storage_class = self._class_for_clean_up(claim, logger)
        delete = (storage_class.get("reclaimPolicy") or "Delete") == "Delete"
        logger.info("claim deleted before it was bound; finishing its volume", delete=delete)
        if delete:
            attempt = await self.provision_and_delete(claim, deadline)
        else:
            attempt = await self.provision_claim_operation(claim, deadline)
        if attempt.finished:
            self.in_progress.pop(uid, None)
            await self._finalizer.release(claim, "volume of the deleted claim dealt with")
            if attempt.error is not None:
                logger.info(
                    "provisioning for the deleted claim ended without a volume",
                    error=describe(attempt.error),
                )
            return
        # The volume may still be being created: keep trying, however often it fails.
        self.in_progress[uid] = claim
        if attempt.error is not None:
            raise attempt.error

    def _class_for_clean_up(self, claim: Obj, logger: structlog.typing.FilteringBoundLogger) -> Obj:
        """The deleted claim's StorageClass; without it the volume cannot be finished, so the
        claim stays in progress and is retried."""
        class_name = get_claim_class(claim)
        storage_class = self._ctx.storage_class(class_name)
        if storage_class is not None:
            return storage_class
        message = (
            f"claim {claim_key(claim)} was deleted while its volume may have been being "
            f'created, but StorageClass "{class_name}" is gone, so the volume cannot be '
            "finished and deleted: recreate the class, or remove the finalizer "
            f"{FINALIZER_PROVISIONING} from the claim to let it go (a volume created "
            "meanwhile would then leak)"
        )
        logger.error("cannot clean up after a deleted claim", reason=message)
        self._ctx.recorder.event(
            claim_target(claim), EVENT_WARNING, "ProvisioningCleanupFailed", message
        )
        self.in_progress[uid_of(claim)] = claim
        raise ClassNotFoundError(class_name)

    # -- one provisioning attempt (upstream's provisionClaimOperation) --------------------------

    async def provision_claim_operation(
        self, claim: Obj, deadline: float | None = None
    ) -> ProvisionAttempt:
        """Does the work of :meth:`ProvisionController.provision_claim_operation
        <pyprovlib.controller._provision.ProvisionController.provision_claim_operation>`
        (documented there)."""
        plan = self._plan(claim)
        if isinstance(plan, ProvisionAttempt):
            return plan
        if self._ctx.options.provisioning_finalizer and not self.protection.is_protected(claim):
            protected = await self._finalizer.protect(claim, plan.logger)
            if isinstance(protected, ProvisionAttempt):
                return protected
            claim = protected
        self._announce(
            claim, f'External provisioner is provisioning volume for claim "{claim_key(claim)}"'
        )
        volume = await self._provision_volume(claim, plan, deadline)
        if isinstance(volume, ProvisionAttempt):
            return volume
        return await self._save_volume(claim, volume, plan.logger)

    async def provision_and_delete(
        self, claim: Obj, deadline: float | None = None
    ) -> ProvisionAttempt:
        """The attempt for a claim deleted before it was bound: the same steps, but the volume
        is finished and then deleted with ``provisioner.delete`` instead of saved as a PV."""
        plan = self._plan(claim)
        if isinstance(plan, ProvisionAttempt):
            return plan
        self._announce(
            claim,
            f'External provisioner is finishing the volume of deleted claim "{claim_key(claim)}" '
            "to delete it",
        )
        volume = await self._provision_volume(claim, plan, deadline)
        if isinstance(volume, ProvisionAttempt):
            return volume
        return await self._finalizer.delete_volume(claim, volume, deadline, plan.logger)

    def volume_name(self, claim: Obj) -> str:
        """The PV name for ``claim`` from the volume name hook. The default hook reads only the
        UID, so the claim is converted to a model only for a hook of the user's."""
        hook = self._ctx.options.volume_name_hook
        if hook is provisioned_volume_name:
            return default_volume_name(claim)
        name = hook(to_model(claim, V1PersistentVolumeClaim))
        if not isinstance(name, str) or not name:
            raise ValueError(f"the volume name hook returned {name!r}")
        return name

    def _plan(self, claim: Obj) -> _Plan | ProvisionAttempt:
        """Name the volume and check the claim and its class before anything is requested;
        the attempt's outcome when there is nothing to request."""
        class_name = get_claim_class(claim)
        logger = self._ctx.log.bind(claim=claim_key(claim), **{"class": class_name})
        try:
            pv_name = self.volume_name(claim)
        except Exception as err:  # malformed claim or broken hook: report, never crash
            return self._unpreparable(claim, err, logger)
        logger = logger.bind(pv=pv_name)
        # A previous attempt may have finished meanwhile: the PV name is deterministic.
        if (
            self._expectations.saved_not_seen(pv_name)
            or self._ctx.volumes.get_by_key(pv_name) is not None
        ):
            logger.debug("PersistentVolume already exists, skipping")
            return ProvisionAttempt(Outcome.VOLUME_EXISTS)
        refusal = claim_refusal(claim, self._supports_block, self._ctx.provisioner_name)
        if refusal is not None:
            self._warn(claim, refusal)
            logger.error("failed to provision volume", reason=refusal)
            return ProvisionAttempt(Outcome.STOPPED)
        storage_class = self._usable_class(claim, class_name, logger)
        if isinstance(storage_class, ProvisionAttempt):
            return storage_class
        return _Plan(pv_name, storage_class, logger)

    def _usable_class(
        self, claim: Obj, class_name: str, logger: structlog.typing.FilteringBoundLogger
    ) -> Obj | ProvisionAttempt:
        """The claim's StorageClass, if it exists, names us and has no mount options a
        provisioner without their support would ignore."""
        storage_class = self._ctx.storage_class(class_name)
        if storage_class is None:
            # Fixable by creating the class: retry.
            return ProvisionAttempt.failed(ClassNotFoundError(class_name))
        class_provisioner = storage_class.get("provisioner")
        if not is_known(class_provisioner, self._ctx.names):
            # The class changed since the claim was annotated, or names another provisioner.
            logger.error(
                "unknown provisioner requested in claim's StorageClass",
                requested=class_provisioner,
            )
            return ProvisionAttempt(Outcome.STOPPED)
        mount_options = storage_class.get("mountOptions")
        if (
            mount_options
            and isinstance(self._ctx.provisioner, MountOptionsProvisioner)
            and not self._ctx.provisioner.supports_mount_options()
        ):
            message = (
                "Mount options are not supported by the provisioner but StorageClass "
                f'"{class_name}" has mount options {list(mount_options)}: remove them from '
                "the class, or use a class without them"
            )
            self._warn(claim, message)
            return ProvisionAttempt.failed(ProvisioningError(message))
        return storage_class

    def _unpreparable(
        self, claim: Obj, err: Exception, logger: structlog.typing.FilteringBoundLogger
    ) -> ProvisionAttempt:
        """Report a claim that cannot be provisioned as it is (malformed, or a broken volume
        name hook): an event and an error log, never a crash."""
        if is_user_bug(err):
            log_user_bug(logger, "cannot prepare provisioning", err)
        else:
            logger.error("cannot prepare provisioning", error=describe(err))
        self._warn(claim, f"cannot provision claim {claim_key(claim)}: {describe(err)}")
        return ProvisionAttempt.failed(err)

    def _supports_block(self) -> bool:
        provisioner = self._ctx.provisioner
        return isinstance(provisioner, BlockProvisioner) and provisioner.supports_block()

    def _announce(self, claim: Obj, message: str) -> None:
        self._ctx.recorder.event(claim_target(claim), EVENT_NORMAL, "Provisioning", message)

    def _warn(self, claim: Obj, message: str) -> None:
        self._ctx.recorder.event(claim_target(claim), EVENT_WARNING, "ProvisioningFailed", message)

    async def _provision_volume(
        self, claim: Obj, plan: _Plan, deadline: float | None
    ) -> Obj | ProvisionAttempt:
        """Ask the provisioner for the volume and complete the PV it returns; the attempt's
        outcome when it failed."""
        annotations = annotations_of(claim)
        selected = annotations.get(ANN_SELECTED_NODE) or annotations.get(ANN_ALPHA_SELECTED_NODE)
        # The cached dicts: the options convert them to models only if the provisioner asks.
        options = ProvisionOptions(
            storage_class=plan.storage_class,
            pv_name=plan.pv_name,
            pvc=claim,
            selected_node_name=selected or None,
        )
        try:
            async with asyncio.timeout_at(deadline):
                result = await self._ctx.provisioner.provision(options)
        except Exception as err:
            return await self._provision_failed(claim, plan, err)
        try:
            volume = _volume_dict(result)
        except ConversionError as err:
            # The asset may exist: keep retrying so a fixed provisioner finishes it.
            return await self._provision_error(claim, plan, ProvisioningState.IN_BACKGROUND, err)
        self._complete_volume(claim, plan, volume)
        return volume

    async def _provision_failed(self, claim: Obj, plan: _Plan, err: Exception) -> ProvisionAttempt:
        """The outcome of a provisioner's call that raised ``err``."""
        logger = plan.logger
        if isinstance(err, IgnoredError):
            logger.info("volume provision ignored", reason=err.reason)
            return ProvisionAttempt(Outcome.STOPPED)
        if isinstance(err, ConversionError):
            # The claim or its class could not be read as a model: nothing was created with
            # it, and only a change to the object can fix that.
            message = (
                f'claim "{claim_key(claim)}" or its StorageClass "{get_claim_class(claim)}" '
                f"is malformed: {err}"
            )
            logger.error("cannot provision volume", error=message)
            self._warn(claim, message)
            return ProvisionAttempt.failed(err)
        if isinstance(err, TimeoutError) and not isinstance(err, ProvisioningError):
            timeout = ProvisioningError(
                f"provisioning did not finish within {self._ctx.options.provision_timeout}s; the "
                "backend may still be creating the volume",
                ProvisioningState.IN_BACKGROUND,
            )
            timeout.__cause__ = err
            return await self._provision_error(
                claim, plan, ProvisioningState.IN_BACKGROUND, timeout
            )
        if is_infeasible_error(err):
            return self._infeasible(claim, plan, err)
        # Unless the provisioner said otherwise, the backend may have done part of the work.
        state = err.state if isinstance(err, ProvisioningError) else ProvisioningState.IN_BACKGROUND
        return await self._provision_error(claim, plan, state, err)

    def _complete_volume(self, claim: Obj, plan: _Plan, volume: Obj) -> None:
        """Name, type and complete the PV the provisioner returned (claimRef, class, policy,
        annotations, finalizer)."""
        volume.setdefault("apiVersion", "v1")
        volume.setdefault("kind", "PersistentVolume")
        volume_meta = volume.setdefault("metadata", {})
        if not volume_meta.get("name"):
            volume_meta["name"] = plan.pv_name
        elif volume_meta["name"] != plan.pv_name:
            plan.logger.warning(
                "the provisioner named the PV differently from options.pv_name; after a crash "
                "its asset will not be found again",
                returned=volume_meta["name"],
            )
        complete_volume(
            volume,
            claim=claim,
            storage_class=plan.storage_class,
            add_finalizer_enabled=self._ctx.options.add_finalizer,
        )

    async def _save_volume(
        self, claim: Obj, volume: Obj, logger: structlog.typing.FilteringBoundLogger
    ) -> ProvisionAttempt:
        logger.info("volume provisioned")
        # Before the save: the informer may show the PV before store_volume returns.
        self._expectations.expect_saved(name_of(volume))
        try:
            await self._volume_store.store_volume(claim, volume)
        except Exception as err:  # the store reported and cleaned up; retry from scratch
            self._expectations.save_failed(name_of(volume))
            return ProvisionAttempt.failed(err)
        return ProvisionAttempt(Outcome.PROVISIONED)

    def _infeasible(self, claim: Obj, plan: _Plan, err: Exception) -> ProvisionAttempt:
        plan.logger.info("detected infeasible volume provisioning request", error=describe(err))
        self.slow_set.add(uid_of(claim), uid_of(plan.storage_class))
        self._warn(
            claim,
            "Volume provisioning failed with infeasible error. Retries will be delayed. "
            f"{describe(err)}",
        )
        return ProvisionAttempt.failed(err)

    async def _provision_error(
        self, claim: Obj, plan: _Plan, state: ProvisioningState, err: Exception
    ) -> ProvisionAttempt:
        """Upstream's ``provisionVolumeErrorHandling``: event, and rescheduling when asked."""
        logger = plan.logger
        class_name = get_claim_class(claim)
        self._warn(
            claim,
            f'failed to provision volume with StorageClass "{class_name}": {describe(err)}',
        )
        if is_user_bug(err):
            log_user_bug(
                logger,
                "provisioning failed: the provisioner raised an unexpected exception",
                err,
                state=state.name,
            )
        else:
            logger.warning("provisioning failed", state=state.name, error=describe(err))
        if state is not ProvisioningState.RESCHEDULE:
            return ProvisionAttempt.failed(err, state)
        if ANN_SELECTED_NODE not in annotations_of(claim):
            # Nothing to reschedule without a selected node.
            return ProvisionAttempt.failed(err)
        # The selected node cannot host the volume: let the scheduler pick again.
        try:
            await self._reschedule(claim)
        except Exception as update_err:  # retried as if the state were FINISHED
            logger.info("volume rescheduling failed", error=describe(update_err))
            return ProvisionAttempt.failed(err)
        logger.info("volume rescheduled", error=describe(err))
        return ProvisionAttempt(Outcome.STOPPED)

    async def _reschedule(self, claim: Obj) -> None:
        """Remove the selected-node annotation (an update guarded by resourceVersion)."""
        # With its type: items of the initial LIST come without kind and apiVersion.
        updated = copy.deepcopy(claim_target(claim))
        annotations = updated.get("metadata", {}).get("annotations") or {}
        annotations.pop(ANN_SELECTED_NODE, None)
        result = await self._ctx.claims_client.replace(updated)
        # The cache would otherwise hand out the old claim until the watch catches up.
        store = self._ctx.claims
        if store.get_by_key(claim_key(result)) is not None:
            store.update(result)


def _volume_dict(result: object) -> Obj:
    """The PV a provisioner returned, as a dict of our own (it is completed in place)."""
    if isinstance(result, Mapping):
        # Ours from here on: the provisioner may keep its own.
        volume: Obj = copy_json(result)
        return volume
    if isinstance(result, V1PersistentVolume):
        return from_model(result)
    raise ConversionError(
        f"the provisioner returned {type(result).__name__}, not a "
        "V1PersistentVolume or its JSON mapping"
    )

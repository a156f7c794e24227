"""The claim side of the provisioning controller (upstream's ``syncClaim``,
``shouldProvision`` and ``provisionClaimOperation``): decide whether a claim is ours to
provision now, refuse what cannot be provisioned (block volumes without support, selectors,
a bad size, mount options), call the provisioner, complete the PV it returns and hand it to the
volume store, and turn each failure into an event, a retry, a reschedule or a stop.

Invariants:

- A claim is provisioned at most once per PV name: a PV saved (even if the cache does not show
  it yet, see
  :class:`~pyprovlib.controller.provision.expectations.VolumeExpectations`) ends
  provisioning for good.
- A claim whose volume may still be being created in the background stays in
  :attr:`~pyprovlib.controller.provision.protected_claims.ProtectedClaimSync.in_progress`
  and is retried beyond the failure threshold, deleted or not, so its volume is never
  leaked.
- User code receives kubernetes-asyncio models, each call converting the claim (or PV) it is
  given once; nothing is converted for a call that is not made (no Qualifier, the default
  volume name hook, a provisioner reading only
  :attr:`~pyprovlib.provisioner.ProvisionOptions.claim_object`).
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Mapping
from typing import Any

import structlog
from kubernetes_asyncio.client import V1PersistentVolume, V1PersistentVolumeClaim

from pyprovlib.controller._errors import DelayRetryError, is_user_bug, log_user_bug
from pyprovlib.controller.provision.context import ProvisionContext
from pyprovlib.controller.provision.decisions import (
    ANN_ALPHA_SELECTED_NODE,
    ANN_SELECTED_NODE,
    EVENT_NORMAL,
    EVENT_WARNING,
    claim_is_block,
    claim_key,
    claim_target,
    claim_wants_provisioning,
    complete_volume,
    get_claim_class,
    is_known,
    source_kind,
    storage_request,
    storage_request_bytes,
)
from pyprovlib.controller.provision.errors import (
    SAVED,
    STOP,
    ClassNotFoundError,
    StopProvisionError,
    describe,
    is_infeasible_error,
)
from pyprovlib.controller.provision.expectations import VolumeExpectations
from pyprovlib.controller.provision.node_deployment import NodeOwnership
from pyprovlib.controller.provision.protected_claims import ProtectedClaimSync
from pyprovlib.controller.provision.protection import is_deleting
from pyprovlib.controller.provision.slowset import SlowSet
from pyprovlib.controller.volume_store import VolumeStore
from pyprovlib.kube.convert import ConversionError, copy_json, from_model, to_model
from pyprovlib.kube.objects import Obj, annotations_of, name_of, spec_of, uid_of
from pyprovlib.kube.store import UID_INDEX
from pyprovlib.kube.workqueue import RateLimitingQueue
from pyprovlib.provisioner import (
    BlockProvisioner,
    IgnoredError,
    MountOptionsProvisioner,
    ProvisioningError,
    ProvisioningState,
    ProvisionOptions,
    Qualifier,
)

__all__ = ["ClaimSync"]


class ClaimSync(ProtectedClaimSync):
    """Processes the keys (claim UIDs) of the claim queue."""

    def __init__(
        self,
        ctx: ProvisionContext,
        queue: RateLimitingQueue[str],
        expectations: VolumeExpectations,
        volume_store: VolumeStore,
        node: NodeOwnership | None = None,
    ) -> None:
        super().__init__(ctx, expectations, volume_store)
        self.queue = queue
        self.slow_set = SlowSet(ctx.options.retry_interval_max, ctx.clock)
        self.node = node
        """With a node deployment, which claims are this node's (and the race for them)."""

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

    def _unpreparable(
        self, claim: Obj, err: Exception, logger: Any
    ) -> tuple[ProvisioningState, Exception]:
        """Report a claim that cannot be provisioned as it is (malformed, or a broken volume
        name hook): an event and an error log, never a crash."""
        message = f"cannot provision claim {claim_key(claim)}: {describe(err)}"
        if is_user_bug(err):
            log_user_bug(logger, "cannot prepare provisioning", err)
        else:
            logger.error("cannot prepare provisioning", error=describe(err))
        self._ctx.recorder.event(claim_target(claim), EVENT_WARNING, "ProvisioningFailed", message)
        return ProvisioningState.FINISHED, err

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
        class_name = get_claim_class(claim)
        source = source_kind(claim)
        try:
            should = await self.should_provision(claim)
        except ClassNotFoundError as err:
            self._ctx.metrics.provision_failed(class_name, source)
            self._ctx.recorder.event(
                claim_target(claim), EVENT_WARNING, "ProvisioningFailed", str(err)
            )
            raise
        except Exception as err:
            self._ctx.metrics.provision_failed(class_name, source)
            if is_user_bug(err):
                log_user_bug(
                    self._ctx.log.bind(claim=claim_key(claim), **{"class": class_name}),
                    "the provisioner's should_provision raised an unexpected exception",
                    err,
                )
            raise
        if not should:
            return
        start = self._ctx.clock.monotonic()
        state, error = await self.provision_claim_operation(claim, deadline)
        if error is None:
            self._ctx.metrics.provision_succeeded(
                class_name, source, self._ctx.clock.monotonic() - start
            )
        else:
            self._ctx.metrics.provision_failed(class_name, source)
        uid = uid_of(claim)
        if error is None or state is ProvisioningState.FINISHED:
            self.in_progress.pop(uid, None)
            if error is not None and error is not SAVED and self.protection.is_protected(claim):
                # Nothing is being created for the claim any more: let it be deleted freely.
                await self._release_claim(claim, "provisioning ended without a volume")
            if error is None or isinstance(error, StopProvisionError):
                return
            raise error
        if state is ProvisioningState.IN_BACKGROUND:
            self._ctx.log.info(
                "provisioning in the background; claim kept in progress", claim_uid=uid
            )
            self.in_progress[uid] = claim
        # NO_CHANGE keeps whatever the previous attempt left in claims-in-progress.
        raise error

    async def provision_claim_operation(
        self, claim: Obj, deadline: float | None = None, *, undo: bool = False
    ) -> tuple[ProvisioningState, Exception | None]:
        """Does the work of :meth:`ProvisionController.provision_claim_operation
        <pyprovlib.controller.provision.ProvisionController.provision_claim_operation>`
        (documented there)."""
        class_name = get_claim_class(claim)
        key = claim_key(claim)
        logger = self._ctx.log.bind(claim=key, **{"class": class_name})

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
            return ProvisioningState.FINISHED, SAVED

        refusal = self._refuse_claim(claim)
        if refusal is not None:
            self._ctx.recorder.event(
                claim_target(claim), EVENT_WARNING, "ProvisioningFailed", refusal
            )
            logger.error("failed to provision volume", reason=refusal)
            return ProvisioningState.FINISHED, STOP

        storage_class = self._ctx.storage_class(class_name)
        if storage_class is None:
            # Fixable by creating the class: retry.
            return ProvisioningState.FINISHED, ClassNotFoundError(class_name)
        class_provisioner = storage_class.get("provisioner")
        if not is_known(class_provisioner, self._ctx.names):
            # The class changed since the claim was annotated, or names another provisioner.
            logger.error(
                "unknown provisioner requested in claim's StorageClass",
                requested=class_provisioner,
            )
            return ProvisioningState.FINISHED, STOP

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
            self._ctx.recorder.event(
                claim_target(claim), EVENT_WARNING, "ProvisioningFailed", message
            )
            return ProvisioningState.FINISHED, ProvisioningError(message)

        if (
            self._ctx.options.provisioning_finalizer
            and not undo
            and not self.protection.is_protected(claim)
        ):
            protected = await self._protect_claim(claim, logger)
            if protected is None:
                return ProvisioningState.FINISHED, STOP
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

        self._ctx.recorder.event(
            claim_target(claim),
            EVENT_NORMAL,
            "Provisioning",
            f'External provisioner is provisioning volume for claim "{key}"'
            if not undo
            else f'External provisioner is finishing the volume of deleted claim "{key}" '
            "to delete it",
        )
        try:
            async with asyncio.timeout_at(deadline):
                result = await self._ctx.provisioner.provision(options)
        except IgnoredError as err:
            logger.info("volume provision ignored", reason=err.reason)
            return ProvisioningState.FINISHED, STOP
        except ConversionError as err:
            # The claim or its class could not be read as a model: nothing was created with
            # it, and only a change to the object can fix that.
            message = f'claim "{key}" or its StorageClass "{class_name}" is malformed: {err}'
            logger.error("cannot provision volume", error=message)
            self._ctx.recorder.event(
                claim_target(claim), EVENT_WARNING, "ProvisioningFailed", message
            )
            return ProvisioningState.FINISHED, err
        except ProvisioningError as err:
            if is_infeasible_error(err):
                return self._infeasible(claim, storage_class, err, logger)
            return await self._provision_error(claim, class_name, err.state, err, logger)
        except TimeoutError as err:
            timeout = ProvisioningError(
                f"provisioning did not finish within {self._ctx.options.provision_timeout}s; the "
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
                # Ours from here on (it is completed below): the provisioner may keep its own.
                volume = copy_json(result)
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
            add_finalizer_enabled=self._ctx.options.add_finalizer,
        )
        if undo:
            return await self._undo_volume(claim, volume, deadline, logger)
        logger.info("volume provisioned")
        # Before the save: the informer may show the PV before store_volume returns.
        self._expectations.expect_saved(name_of(volume))
        try:
            await self._volume_store.store_volume(claim, volume)
        except Exception as err:  # the store reported and cleaned up; retry from scratch
            self._expectations.save_failed(name_of(volume))
            return ProvisioningState.FINISHED, err
        return ProvisioningState.FINISHED, None

    def _refuse_claim(self, claim: Obj) -> str | None:
        """Why this claim cannot be provisioned by us at all, or None."""
        if claim_is_block(claim) and not (
            isinstance(self._ctx.provisioner, BlockProvisioner)
            and self._ctx.provisioner.supports_block()
        ):
            return f"{self._ctx.provisioner_name} does not support block volume provisioning"
        if spec_of(claim).get("selector") is not None:
            return (
                "claim Selector is not supported: dynamically provisioned volumes cannot match "
                "a label selector; remove spec.selector from the claim"
            )
        # kube-apiserver refuses such claims; a cache can still hold one (another server, a
        # relaxed validator), and a volume of no size must never reach the provisioner.
        request = storage_request(claim)
        if request is None:
            return (
                f"claim {claim_key(claim)} has no spec.resources.requests.storage; "
                "set the size the volume should have"
            )
        try:
            size = storage_request_bytes(request)
        except ValueError as err:
            return f"claim {claim_key(claim)} has an invalid {err}"
        if size == 0:
            return (
                f"claim {claim_key(claim)} requests {request!r} of storage; "
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
        logger.info("detected infeasible volume provisioning request", error=describe(err))
        self.slow_set.add(uid_of(claim), uid_of(storage_class))
        self._ctx.recorder.event(
            claim_target(claim),
            EVENT_WARNING,
            "ProvisioningFailed",
            "Volume provisioning failed with infeasible error. Retries will be delayed. "
            f"{describe(err)}",
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
        message = f'failed to provision volume with StorageClass "{class_name}": {describe(err)}'
        self._ctx.recorder.event(claim_target(claim), EVENT_WARNING, "ProvisioningFailed", message)
        if is_user_bug(err):
            log_user_bug(
                logger,
                "provisioning failed: the provisioner raised an unexpected exception",
                err,
                state=state.name,
            )
        else:
            logger.warning("provisioning failed", state=state.name, error=describe(err))
        if state is ProvisioningState.RESCHEDULE:
            if ANN_SELECTED_NODE in annotations_of(claim):
                # The selected node cannot host the volume: let the scheduler pick again.
                try:
                    await self._reschedule(claim)
                except Exception as update_err:  # retried as if the state were FINISHED
                    logger.info("volume rescheduling failed", error=describe(update_err))
                    return ProvisioningState.FINISHED, err
                logger.info("volume rescheduled", error=describe(err))
                return ProvisioningState.FINISHED, STOP
            # Nothing to reschedule without a selected node.
            state = ProvisioningState.FINISHED
        return state, err

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

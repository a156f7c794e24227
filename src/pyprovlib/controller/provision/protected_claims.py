"""The provisioning-protection finalizer's life cycle on a claim, as the controller drives it
(``provisioning_finalizer``; ``protection`` says why it exists): put it on before the
volume is requested, take it off once the claim is bound or provisioning ended without a
volume, and — for a claim deleted before it was bound — finish its volume and delete it again
before letting the claim go.

Invariants (with :class:`~pyprovlib.controller.provision.protection.ClaimProtection`, which
remembers what was written):

- The provisioner is never asked for a volume for a claim that does not carry the finalizer
  (as saved by the API server) while the option is on.
- The finalizer leaves a deleted claim only once its volume is saved as a PV, deleted again,
  or was never requested; a claim whose volume may still be being created stays in progress.
- The volume of a deleted claim is dealt with once: a cached version older than the release
  never starts the clean-up again.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from kubernetes_asyncio.client import V1PersistentVolumeClaim

from pyprovlib.controller._deleting import LazyVolume, deleter
from pyprovlib.controller._errors import is_user_bug, log_user_bug
from pyprovlib.controller.options import provisioned_volume_name
from pyprovlib.controller.provision.context import ProvisionContext
from pyprovlib.controller.provision.decisions import (
    EVENT_WARNING,
    claim_key,
    claim_target,
    default_volume_name,
    get_claim_class,
    is_known,
    requested_provisioner,
)
from pyprovlib.controller.provision.errors import (
    STOP,
    ClassNotFoundError,
    StopProvisionError,
    describe,
)
from pyprovlib.controller.provision.expectations import VolumeExpectations
from pyprovlib.controller.provision.protection import (
    FINALIZER_PROVISIONING,
    ClaimProtection,
    add_provisioning_finalizer,
    is_deleting,
    remove_provisioning_finalizer,
)
from pyprovlib.controller.volume_store import QueueStore, VolumeStore
from pyprovlib.kube.convert import to_model
from pyprovlib.kube.errors import ApiException, is_conflict, is_not_found
from pyprovlib.kube.objects import Obj, name_of, spec_of, uid_of
from pyprovlib.provisioner import (
    DeletionGuard,
    IgnoredError,
    ProvisioningError,
    ProvisioningState,
    Qualifier,
)

if TYPE_CHECKING:
    import structlog

__all__ = ["ProtectedClaimSync"]


class ProtectedClaimSync:
    """The claim side's state and its protected-claim handling;
    :class:`~pyprovlib.controller.provision.claims.ClaimSync` adds the provisioning itself
    (:meth:`provision_claim_operation`).

    ``in_progress`` is upstream's ``claimsInProgress``: claims (by UID) whose volume may still
    be being created in the background, kept with the last version seen so a claim deleted
    meanwhile is still processed. Only workers read or write it; the claim-deleted handler
    reads it to leave such a claim's queue timing alone.
    """

    def __init__(
        self,
        ctx: ProvisionContext,
        expectations: VolumeExpectations,
        volume_store: VolumeStore,
    ) -> None:
        self._ctx = ctx
        self._expectations = expectations
        self._volume_store = volume_store
        self.in_progress: dict[str, Obj] = {}
        self.protection = ClaimProtection()

    async def provision_claim_operation(
        self, claim: Obj, deadline: float | None = None, *, undo: bool = False
    ) -> tuple[ProvisioningState, Exception | None]:
        """One provisioning attempt; implemented by
        :class:`~pyprovlib.controller.provision.claims.ClaimSync`."""
        raise NotImplementedError

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

    async def _protect_claim(
        self, claim: Obj, logger: structlog.typing.FilteringBoundLogger
    ) -> Obj | Exception | None:
        """Put the provisioning-protection finalizer on ``claim`` before its volume is
        requested. Returns the claim as saved; None when it is gone or was replaced (nothing to
        provision); the error to retry on when the write failed (nothing is requested
        unprotected)."""
        try:
            saved = await add_provisioning_finalizer(self._ctx.claims_client, claim)
        except ApiException as err:
            if is_not_found(err) or is_conflict(err):
                logger.info("claim is gone or was replaced; not provisioning", status=err.status)
                return None
            # 422 when the claim is being deleted (no new finalizers then): the retry sees the
            # deletionTimestamp and leaves the claim alone.
            logger.info("cannot add the provisioning-protection finalizer", error=describe(err))
            return ProvisioningError(
                f"cannot add finalizer {FINALIZER_PROVISIONING} to claim {claim_key(claim)}: "
                f"{describe(err)}",
                ProvisioningState.FINISHED,
            )
        self.protection.added(uid_of(claim))
        return saved

    async def _release_claim(self, claim: Obj, why: str) -> None:
        """Remove the provisioning-protection finalizer from ``claim``. A failure raises (the
        claim is retried); a claim already gone counts as released."""
        try:
            await remove_provisioning_finalizer(self._ctx.claims_client, claim)
        except ApiException as err:
            if not is_conflict(err):  # 409: the name belongs to a recreated claim now
                raise
        self.protection.released(claim)
        self._ctx.log.debug(
            "removed the provisioning-protection finalizer", claim=claim_key(claim), why=why
        )

    async def _sync_protected_claim(self, claim: Obj, deadline: float | None) -> bool:
        """A claim carrying the provisioning-protection finalizer: release it once bound; finish
        and delete the volume of a deleted one. Returns False when the claim is to be provisioned
        as usual."""
        if not is_known(requested_provisioner(claim), self._ctx.names):
            return True  # another provisioner's claim (and finalizer)
        if spec_of(claim).get("volumeName"):
            uid = uid_of(claim)
            if not self.protection.released_while_bound(uid):  # else: predates our removal
                await self._release_claim(claim, "claim is bound")
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
        key = claim_key(claim)
        logger = self._ctx.log.bind(claim=key)
        try:
            pv_name = self.volume_name(claim)
        except Exception as err:  # no name now means no volume could be requested before
            logger.warning("cannot name the volume of a deleted claim", error=describe(err))
            await self._release_claim(claim, "claim cannot be provisioned")
            return
        if await self._volume_saved(pv_name):
            await self._release_claim(claim, "claim deleted after its PV was saved")
            return
        class_name = get_claim_class(claim)
        storage_class = self._ctx.storage_class(class_name)
        if storage_class is None:
            message = (
                f"claim {key} was deleted while its volume may have been being created, "
                f'but StorageClass "{class_name}" is gone, so the volume cannot be finished and '
                "deleted: recreate the class, or remove the finalizer "
                f"{FINALIZER_PROVISIONING} from the claim to let it go (a volume created "
                "meanwhile would then leak)"
            )
            logger.error("cannot clean up after a deleted claim", reason=message)
            self._ctx.recorder.event(
                claim_target(claim), EVENT_WARNING, "ProvisioningCleanupFailed", message
            )
            self.in_progress[uid] = claim
            raise ClassNotFoundError(class_name)
        undo = (storage_class.get("reclaimPolicy") or "Delete") == "Delete"
        logger.info("claim deleted before it was bound; finishing its volume", delete=undo)
        state, error = await self.provision_claim_operation(claim, deadline, undo=undo)
        if error is None or state is ProvisioningState.FINISHED:
            self.in_progress.pop(uid, None)
            await self._release_claim(claim, "volume of the deleted claim dealt with")
            if error is not None and not isinstance(error, StopProvisionError):
                logger.info(
                    "provisioning for the deleted claim ended without a volume",
                    error=describe(error),
                )
            return
        # The volume may still be being created: keep trying, however often it fails.
        self.in_progress[uid] = claim
        raise error

    async def _volume_saved(self, pv_name: str) -> bool:
        """Whether the PV ``pv_name`` exists or will be saved — asked of the API server when the
        caches do not show it, as a volume is about to be deleted otherwise."""
        if self._expectations.saved_not_seen(pv_name) or self._ctx.volumes.get_by_key(pv_name):
            return True
        if isinstance(self._volume_store, QueueStore) and self._volume_store.is_pending(pv_name):
            return True
        try:
            await self._ctx.volumes_client.get(pv_name)
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
        provisioner = self._ctx.provisioner
        lazy = LazyVolume(volume)
        try:
            if isinstance(provisioner, DeletionGuard) and not (
                await provisioner.should_delete(lazy.model())
            ):
                raise ProvisioningError(
                    f"the provisioner's should_delete refuses volume {pv_name}",
                    ProvisioningState.IN_BACKGROUND,
                )
            delete = deleter(provisioner, lazy)
            async with asyncio.timeout_at(deadline):
                await delete()
        except IgnoredError as err:
            logger.info("the provisioner leaves the volume of the deleted claim", reason=err.reason)
            return ProvisioningState.FINISHED, STOP
        except Exception as err:  # the volume exists: retry until it is deleted
            message = (
                f"claim {claim_key(claim)} was deleted while its volume {pv_name} was being "
                f"created; deleting the volume failed (will retry): {describe(err)}"
            )
            if is_user_bug(err):
                log_user_bug(logger, "cannot delete the volume of a deleted claim", err)
            else:
                logger.warning("cannot delete the volume of a deleted claim", error=describe(err))
            self._ctx.recorder.event(
                claim_target(claim), EVENT_WARNING, "ProvisioningCleanupFailed", message
            )
            failure = ProvisioningError(message, ProvisioningState.IN_BACKGROUND)
            failure.__cause__ = err
            return ProvisioningState.IN_BACKGROUND, failure
        logger.info("deleted the volume of a deleted claim", pv=pv_name)
        return ProvisioningState.FINISHED, STOP

    # -- volumes -----------------------------------------------------------------------------

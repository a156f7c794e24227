"""The provisioning-protection finalizer's writes on a claim (``provisioning_finalizer``;
``protection`` says why it exists): put it on before the volume is requested, take it off once
the claim is bound or provisioning ended without a volume, and delete the volume finished for a
claim deleted before it was bound. The claim worker
(:class:`~pyprovlib.controller._provision.claims.ClaimSync`) decides when.

Invariants (with :class:`~pyprovlib.controller._provision.protection.ClaimProtection`, which
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

from pyprovlib._provisioner import DeletionGuard, IgnoredError, ProvisioningError, ProvisioningState
from pyprovlib.controller._deleting import LazyVolume, deleter
from pyprovlib.controller._errors import is_user_bug, log_user_bug
from pyprovlib.controller._provision.attempt import Outcome, ProvisionAttempt
from pyprovlib.controller._provision.context import ProvisionContext
from pyprovlib.controller._provision.decisions import EVENT_WARNING, claim_key, claim_target
from pyprovlib.controller._provision.errors import describe
from pyprovlib.controller._provision.expectations import VolumeExpectations
from pyprovlib.controller._provision.protection import (
    FINALIZER_PROVISIONING,
    ClaimProtection,
    add_provisioning_finalizer,
    remove_provisioning_finalizer,
)
from pyprovlib.controller._volume_store import QueueStore, VolumeStore
from pyprovlib.kube._errors import ApiException, is_conflict, is_not_found
from pyprovlib.kube._objects import Obj, name_of, uid_of

if TYPE_CHECKING:
    import structlog

__all__ = ["ClaimFinalizer"]


class ClaimFinalizer:
    """The provisioning-protection finalizer's API writes for the claim worker, recorded in
    ``protection``, and the deletion of a deleted claim's volume."""

    def __init__(
        self,
        ctx: ProvisionContext,
        protection: ClaimProtection,
        expectations: VolumeExpectations,
        volume_store: VolumeStore,
    ) -> None:
        self._ctx = ctx
        self._protection = protection
        self._expectations = expectations
        self._volume_store = volume_store

    async def protect(
        self, claim: Obj, logger: structlog.typing.FilteringBoundLogger
    ) -> Obj | ProvisionAttempt:
        """Put the provisioning-protection finalizer on ``claim`` before its volume is
        requested. Returns the claim as saved; a stop when it is gone or was replaced (nothing
        to provision); a failure to retry on when the write failed (nothing is requested
        unprotected)."""
        try:
            saved = await add_provisioning_finalizer(self._ctx.claims_client, claim)
        except ApiException as err:
            if is_not_found(err) or is_conflict(err):
                logger.info("claim is gone or was replaced; not provisioning", status=err.status)
                return ProvisionAttempt(Outcome.STOPPED)
            # 422 when the claim is being deleted (no new finalizers then): the retry sees the
            # deletionTimestamp and leaves the claim alone.
            logger.info("cannot add the provisioning-protection finalizer", error=describe(err))
            failure = ProvisioningError(
                f"cannot add finalizer {FINALIZER_PROVISIONING} to claim {claim_key(claim)}: "
                f"{describe(err)}",
                ProvisioningState.FINISHED,
            )
            return ProvisionAttempt.failed(failure)
        self._protection.added(uid_of(claim))
        return saved

    async def release(self, claim: Obj, why: str) -> None:
        """Remove the provisioning-protection finalizer from ``claim``. A failure raises (the
        claim is retried); a claim already gone counts as released."""
        try:
            await remove_provisioning_finalizer(self._ctx.claims_client, claim)
        except ApiException as err:
            if not is_conflict(err):  # 409: the name belongs to a recreated claim now
                raise
        self._protection.released(claim)
        self._ctx.log.debug(
            "removed the provisioning-protection finalizer", claim=claim_key(claim), why=why
        )

    async def volume_saved(self, pv_name: str) -> bool:
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

    async def delete_volume(
        self,
        claim: Obj,
        volume: Obj,
        deadline: float | None,
        logger: structlog.typing.FilteringBoundLogger,
    ) -> ProvisionAttempt:
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
            return ProvisionAttempt(Outcome.STOPPED)
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
            return ProvisionAttempt.failed(failure, ProvisioningState.IN_BACKGROUND)
        logger.info("deleted the volume of a deleted claim", pv=pv_name)
        return ProvisionAttempt(Outcome.STOPPED)

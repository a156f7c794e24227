"""The volume side of the provisioning controller (upstream's ``syncVolume``,
``shouldDelete`` and ``deleteVolumeOperation``): keep the PV protection finalizer right, and
delete a Released, Delete-policy PV this provisioner created — the asset first (asking the
:class:`~pyprovlib.DeletionGuard` if the provisioner is one), then the PV with a
UID precondition, then the finalizer.

The PV reaches user code as one ``V1PersistentVolume`` per sync, converted only when the
provisioner is asked about it (``should_delete``, ``delete``) and shared by those calls, as
upstream hands both the same object; an :class:`~pyprovlib.ObjectDeleter` gets
the cached JSON for ``delete_object`` instead.
"""

from __future__ import annotations

import asyncio

from pyprovlib._provisioner import DeletionGuard, IgnoredError
from pyprovlib.controller._deleting import LazyVolume, deleter
from pyprovlib.controller._errors import is_user_bug, log_user_bug
from pyprovlib.controller._provision.context import ProvisionContext
from pyprovlib.controller._provision.decisions import (
    EVENT_WARNING,
    FINALIZER_PV,
    desired_finalizers,
    is_provisioner_for_volume,
    remove_finalizer,
    volume_should_delete,
)
from pyprovlib.controller._provision.errors import describe
from pyprovlib.controller._provision.expectations import VolumeExpectations
from pyprovlib.controller._provision.node_deployment import NodeOwnership
from pyprovlib.controller._volume_store import event_target
from pyprovlib.kube._errors import ApiException, is_conflict, is_not_found
from pyprovlib.kube._objects import Obj, finalizers_of, meta, name_of, spec_of, uid_of
from pyprovlib.kube._workqueue import RateLimitingQueue

__all__ = ["VolumeSync"]


class VolumeSync:
    """Processes the keys (PV names) of the volume queue.

    Invariant: a PV's asset is deleted at most once per PV UID, whatever updates of the PV race
    with its deletion (:class:`VolumeExpectations` remembers the deletion until the cache shows
    the PV gone).
    """

    def __init__(
        self,
        ctx: ProvisionContext,
        queue: RateLimitingQueue[str],
        expectations: VolumeExpectations,
        node: NodeOwnership | None = None,
    ) -> None:
        self._ctx = ctx
        self.queue = queue
        self._expectations = expectations
        self.node = node
        """With a node deployment, which volumes are this node's to delete."""

    async def process(self, key: str) -> None:
        """Sync the PV ``key``; a failure is retried through the queue up to
        ``failed_delete_threshold`` times (upstream's ``processNextVolumeWorkItem``)."""
        ctx = self._ctx
        logger = ctx.log.bind(pv=key)
        try:
            await self._sync_handler(key, ctx.deadline(ctx.options.deletion_timeout))
        except Exception as err:  # every failure is retried through the queue
            failures = self.queue.num_requeues(key)
            threshold = ctx.options.failed_delete_threshold
            if threshold == 0 or failures < threshold:
                logger.info("retrying syncing volume", failures=failures, error=describe(err))
                self.queue.add_rate_limited(key)
            else:
                logger.error(
                    "giving up syncing volume",
                    failures=failures,
                    threshold=threshold,
                    error=describe(err),
                )
        else:
            self.queue.forget(key)

    async def _sync_handler(self, key: str, deadline: float | None) -> None:
        volume = self._ctx.volumes.get_by_key(key)
        self._expectations.observed(key, volume)
        if volume is None:
            return  # already deleted
        await self.sync_volume(volume, deadline)

    async def sync_volume(self, volume: Obj, deadline: float | None = None) -> None:
        """Keep the finalizer right and delete the volume if it should be (``syncVolume``)."""
        ctx = self._ctx
        if not is_provisioner_for_volume(volume, ctx.names):
            return
        volume = await self._handle_protection_finalizer(volume)
        model = LazyVolume(volume)
        if await self._should_delete(model):
            start = ctx.clock.monotonic()
            class_name = str(spec_of(volume).get("storageClassName") or "")
            try:
                await self._delete_volume_operation(model, deadline)
            except Exception:
                ctx.metrics.delete_failed(class_name)
                raise
            ctx.metrics.delete_succeeded(class_name, ctx.clock.monotonic() - start)

    async def _handle_protection_finalizer(self, volume: Obj) -> Obj:
        wanted = desired_finalizers(volume, self._ctx.options.add_finalizer)
        if wanted is None:
            return volume
        name = name_of(volume)
        try:
            return await self._patch_finalizers(volume, wanted)
        except ApiException as err:
            raise RuntimeError(
                f"failed to set finalizers {wanted} on PersistentVolume {name}: {describe(err)}"
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
        return await self._ctx.volumes_client.patch(name_of(volume), body)

    async def should_delete(self, volume: Obj) -> bool:
        """Whether the volume's asset should be deleted now (``shouldDelete``)."""
        return await self._should_delete(LazyVolume(volume))

    async def _should_delete(self, volume: LazyVolume) -> bool:
        ctx = self._ctx
        if not volume_should_delete(volume.obj, ctx.options.add_finalizer):
            return False
        if self.node is not None and not await self.node.may_delete(volume.obj):
            # Another node's volume: its instance deletes it (upstream: "PV was not
            # provisioned on this node").
            return False
        if isinstance(ctx.provisioner, DeletionGuard):
            try:
                return await ctx.provisioner.should_delete(volume.model())
            except Exception as err:
                if is_user_bug(err):
                    log_user_bug(
                        ctx.log.bind(pv=name_of(volume.obj)),
                        "the provisioner's should_delete raised an unexpected exception",
                        err,
                    )
                raise
        return True

    async def delete_volume_operation(self, volume: Obj, deadline: float | None = None) -> None:
        """Delete the asset, then the PV, then our finalizer (``deleteVolumeOperation``).
        Raises when it must be retried."""
        await self._delete_volume_operation(LazyVolume(volume), deadline)

    async def _delete_volume_operation(self, model: LazyVolume, deadline: float | None) -> None:
        ctx = self._ctx
        volume = model.obj
        name = name_of(volume)
        logger = ctx.log.bind(pv=name)
        if not self._expectations.is_asset_deleted(volume):
            delete = deleter(ctx.provisioner, model)  # a malformed PV raises: retried, no event
            try:
                async with asyncio.timeout_at(deadline):
                    await delete()
            except IgnoredError as err:
                logger.info("volume deletion ignored", reason=err.reason)
                return
            except Exception as err:  # reported on the PV and retried
                if isinstance(err, TimeoutError):
                    message = (
                        f"deleting the volume did not finish within {ctx.options.deletion_timeout}s"
                    )
                else:
                    message = describe(err)
                if is_user_bug(err):
                    log_user_bug(logger, "volume deletion failed", err)
                else:
                    logger.warning("volume deletion failed", error=message)
                ctx.recorder.event(
                    event_target(volume, "PersistentVolume"),
                    EVENT_WARNING,
                    "VolumeFailedDelete",
                    message,
                )
                raise
            # Updates of the PV racing with its deletion must not delete the asset twice.
            self._expectations.asset_deleted(volume)
            logger.info("volume deleted")

        try:
            remaining = await ctx.volumes_client.delete(name, preconditions={"uid": uid_of(volume)})
        except ApiException as err:
            if is_not_found(err):
                return
            if is_conflict(err):
                # Another PV now has this name: ours is gone, and that one is not ours to delete.
                logger.info("PersistentVolume was replaced meanwhile; leaving the new one")
                return
            logger.info("failed to delete PersistentVolume", error=describe(err))
            raise

        if ctx.options.add_finalizer and remaining is not None:
            finalizers, changed = remove_finalizer(finalizers_of(remaining), FINALIZER_PV)
            if changed:
                try:
                    await self._patch_finalizers(remaining, finalizers or [])
                except ApiException as err:
                    if not is_not_found(err):
                        logger.info("failed to remove finalizer", error=describe(err))
                        raise
        logger.info("PersistentVolume deleted")

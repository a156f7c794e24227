"""The sync of one object of the attach controller: a VolumeAttachment (attach or detach,
upstream's ``SyncNewOrUpdatedVolumeAttachment`` with the CSI or trivial handler) and a
PersistentVolume (its finalizer, ``SyncNewOrUpdatedPersistentVolume``).

Invariants:

- The VA finalizer goes on only after everything that can be checked before the attach call
  was checked (it would block the VA's deletion on an error).
- A failure is recorded in the VA's ``status.attachError``/``detachError`` with the volume's
  secrets masked, and the VA is retried with backoff.
- It is handed a VA only when the cache shows our own last write to it (the controller's
  worker checks with :class:`~pyprovlib.controller._attach.writes.AttachWriter` first).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from pyprovlib._attacher import Attacher, AttachError, AttachNode, AttachVolume
from pyprovlib.controller._attach.errors import OperationTimeout, error_code
from pyprovlib.controller._attach.options import AttachControllerOptions
from pyprovlib.controller._attach.resolve import (
    VolumeResolver,
    api_error_text,
    attacher_of,
    is_attached,
    is_deleting,
    mask_secrets,
    spec_of,
)
from pyprovlib.controller._attach.writes import AttachWriter
from pyprovlib.controller._errors import describe_error, is_user_bug, log_user_bug
from pyprovlib.kube._errors import ApiException
from pyprovlib.kube._objects import Obj, finalizers_of, name_of
from pyprovlib.kube._store import Indexer

__all__ = ["PV_INDEX", "AttachSync"]

PV_INDEX: Final = "attacher-pv"
"""The VolumeAttachment cache index by ``spec.source.persistentVolumeName``."""


@dataclass(eq=False, kw_only=True)
class AttachSync:
    """Syncs one VolumeAttachment or PersistentVolume at a time for the attacher of
    ``driver_name``: through ``attacher``, or marking VAs attached when it is None (the trivial
    handler). The controller's workers take the keys off the queues and retry what raises.

    ``force_sync`` holds the VAs the reconciler found drifted: processed once even if their
    status says it is done.
    """

    driver_name: str
    attacher: Attacher | None
    options: AttachControllerOptions
    finalizer: str
    vas: Indexer
    """The VolumeAttachment cache (indexed by PV, :data:`PV_INDEX`)."""
    resolver: VolumeResolver
    writes: AttachWriter
    log: Any
    force_sync: set[str] = field(default_factory=set, init=False)

    def is_ours(self, va: Mapping[str, Any]) -> bool:
        """Whether ``va`` names this driver as its attacher."""
        return attacher_of(va) == self.driver_name

    def forget(self, name: str) -> None:
        """The VA ``name`` was deleted: drop what is remembered about it."""
        self.force_sync.discard(name)
        self.writes.forget(name)

    # -- VolumeAttachments ---------------------------------------------------------------------

    async def sync_va(self, va: Obj) -> None:
        """Process one VolumeAttachment of ours (upstream's ``SyncNewOrUpdatedVolumeAttachment``
        without the queue bookkeeping); raises when it must be retried."""
        if self.attacher is None:
            if not is_attached(va):
                await self.writes.mark_as_attached(va, None)
                self.log.info("marked VolumeAttachment as attached", va=name_of(va))
            return
        if is_deleting(va):
            await self._sync_detach(va, self.attacher)
        else:
            await self._sync_attach(va, self.attacher)

    def _consume_force_sync(self, name: str) -> bool:
        if name in self.force_sync:
            self.force_sync.discard(name)
            return True
        return False

    async def _sync_attach(self, va: Obj, attacher: Attacher) -> None:
        name = name_of(va)
        if not self._consume_force_sync(name) and is_attached(va):
            return  # attached, nothing to do
        logger = self.log.bind(va=name)
        logger.info("attaching")
        secrets: Mapping[str, str] = {}
        try:
            va, volume, node, readonly = await self._prepare_attach(va, attacher)
            secrets = volume.secrets
            async with self._timeout("attach", volume.volume_id, node.name):
                metadata = await attacher.attach(volume, node, readonly, volume.volume_attributes)
        except Exception as err:
            raise await self._record_failure("attach", va, err, secrets, logger) from None
        logger.info("attached")
        await self.writes.mark_as_attached(va, dict(metadata) if metadata else None)

    async def _sync_detach(self, va: Obj, attacher: Attacher) -> None:
        name = name_of(va)
        if not self._consume_force_sync(name) and self.finalizer not in finalizers_of(va):
            return  # already detached
        logger = self.log.bind(va=name)
        logger.info("detaching")
        secrets: Mapping[str, str] = {}
        try:
            resolved = self.resolver.resolve(va)
            secrets = await self.resolver.controller_publish_secrets(resolved.csi)
            volume = self.resolver.volume(va, resolved, secrets)
            node_name = str(spec_of(va).get("nodeName") or "")
            node = AttachNode(node_name, self.resolver.node_id(va, True))
            async with self._timeout("detach", volume.volume_id, node.name):
                await attacher.detach(volume, node)
        except Exception as err:
            raise await self._record_failure("detach", va, err, secrets, logger) from None
        logger.info("detached")
        await self.writes.mark_as_detached(va)

    async def _record_failure(
        self, op: str, va: Obj, err: Exception, secrets: Mapping[str, str], logger: Any
    ) -> AttachError:
        """Record why ``op`` ("attach" or "detach") failed in the VA's ``status.<op>Error``,
        with the volume's ``secrets`` masked, and return the error that retries the sync."""
        message = mask_secrets(describe_error(err), secrets)
        if is_user_bug(err):
            log_user_bug(
                logger,
                f"{op} failed: the attacher raised an unexpected exception",
                err,
                mask=functools.partial(mask_secrets, secrets=secrets),
            )
        try:
            await self.writes.save_error(va, f"{op}Error", message, error_code(err))
        except Exception as save_err:
            logger.info(f"failed to save {op} error", error=api_error_text(save_err))
        return AttachError(f"failed to {op}: {message}")

    def _timeout(self, op: str, volume_id: str, node: str) -> OperationTimeout:
        return OperationTimeout(self.options.timeout, op, volume_id, node)

    async def _prepare_attach(
        self, va: Obj, attacher: Attacher
    ) -> tuple[Obj, AttachVolume, AttachNode, bool]:
        """Check as much as possible before the VA finalizer goes on (it would block the
        VA's deletion on an error), add the finalizers, and build the attach arguments."""
        resolved = self.resolver.resolve(va)
        if resolved.pv is not None:
            if is_deleting(resolved.pv):
                raise AttachError(
                    f'PersistentVolume "{name_of(resolved.pv)}" is marked for deletion'
                )
            try:
                await self.writes.add_pv_finalizer(resolved.pv)
            except ApiException as err:
                raise AttachError(
                    f"could not add PersistentVolume finalizer: {api_error_text(err)}"
                ) from None
        volume = self.resolver.volume(va, resolved, {})
        attacher.check(volume)
        secrets = await self.resolver.controller_publish_secrets(resolved.csi)
        volume = volume.with_secrets(secrets)
        readonly = resolved.csi.get("readOnly") is True
        node_name = str(spec_of(va).get("nodeName") or "")
        node_id = self.resolver.node_id(va, False)
        va = await self.writes.add_va_finalizer_and_node_id(va, node_id)
        return va, volume, AttachNode(node_name, node_id), readonly

    # -- PersistentVolumes ---------------------------------------------------------------------

    async def sync_pv(self, pv: Obj) -> None:
        """Remove our finalizer from a PV being deleted that no VolumeAttachment uses
        (upstream's ``SyncNewOrUpdatedPersistentVolume``); raises when it must be retried."""
        if self.attacher is None or not is_deleting(pv):
            return
        if self.finalizer not in finalizers_of(pv):
            return
        users = self.vas.by_index(PV_INDEX, name_of(pv))
        if users:
            self.log.debug("PersistentVolume is still used", pv=name_of(pv), va=name_of(users[0]))
            return
        await self.writes.remove_pv_finalizer(pv)
        self.log.info("removed finalizer from PersistentVolume", pv=name_of(pv))

"""The sync of one claim of the modify controller: upstream's ``syncPVC`` and ``modify``
(``modify_volume.go``) — bring a Bound claim's volume to the VolumeAttributesClass the claim
asks for, and record how it went.

Invariants:

- Every decision is taken on the claim and volume the caches hold, and not on a copy older
  than the controller's own last write (see :mod:`.expectations`).
- The driver is asked to modify a volume only after the claim says ``InProgress`` towards that
  class (a write guarded by the claim's resourceVersion), and once it succeeded it is not asked
  again for the same change: the completion is retried on its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from kubernetes_asyncio.client import V1PersistentVolume

from pyprovlib._attacher import GrpcCode
from pyprovlib._modifier import Modifier, ModifyError
from pyprovlib.controller._errors import DelayRetryError, is_user_bug, log_user_bug
from pyprovlib.controller._modify.claims import (
    CONDITION_MODIFYING_VOLUME,
    PV_NAME_KEY,
    PVC_NAME_KEY,
    PVC_NAMESPACE_KEY,
    REASON_VOLUME_MODIFY,
    REASON_VOLUME_MODIFY_CANCELED,
    REASON_VOLUME_MODIFY_FAILED,
    REASON_VOLUME_MODIFY_NOT_SUPPORTED,
    REASON_VOLUME_MODIFY_SUCCESSFUL,
    STATUS_IN_PROGRESS,
    STATUS_INFEASIBLE,
    Step,
    current_class,
    has_condition,
    modify_status,
    next_step,
    spec_class,
    target_class,
)
from pyprovlib.controller._modify.errors import VolumeNotCachedError, error_text
from pyprovlib.controller._modify.expectations import ModifyExpectations
from pyprovlib.controller._modify.options import ModifyControllerOptions
from pyprovlib.controller._modify.status import ModifyStatusWriter
from pyprovlib.kube._convert import ConversionError, to_model
from pyprovlib.kube._errors import ApiException, api_error_text
from pyprovlib.kube._events import EVENT_TYPE_NORMAL, EVENT_TYPE_WARNING
from pyprovlib.kube._objects import Obj, as_mapping, name_of, namespace_of, spec_of, status_of
from pyprovlib.kube._store import Indexer
from pyprovlib.kube._workqueue import RateLimitingQueue

__all__ = ["ModifySync"]

T = TypeVar("T")


@dataclass(eq=False, kw_only=True)
class ModifySync:
    """Syncs one claim at a time for the modifier ``modifier`` named ``name`` (the CSI
    driver's), reading claims, volumes and VolumeAttributesClasses (None when the driver
    cannot modify) from the controller's caches, writing through ``writes``, and keeping what
    the caches do not show yet in ``expectations``. A claim that must be looked at again
    without an event of its own is put back on ``queue``.
    """

    modifier: Modifier
    name: str
    options: ModifyControllerOptions
    claims: Indexer
    volumes: Indexer
    classes: Indexer | None
    """The VolumeAttributesClass cache; None when the driver cannot modify."""
    queue: RateLimitingQueue[str]
    expectations: ModifyExpectations
    writes: ModifyStatusWriter
    log: Any

    async def sync_claim(self, key: str) -> None:
        """Look at the claim ``key`` (``namespace/name``) and bring its volume to the class it
        asks for (upstream's ``syncPVC``); raises when it must be retried."""
        pvc = self.claims.get_by_key(key)
        if pvc is None:
            return
        if not self.expectations.seen(key, pvc):
            # Our last write is not in the cache yet: never act on the copy before it. The
            # retry keeps the claim's backoff (a failing driver is not called faster).
            raise DelayRetryError(
                f"the cache does not show the last write to pvc {key} yet",
                self.options.retry_interval_start,
            )
        volume_name = spec_of(pvc).get("volumeName")
        if not isinstance(volume_name, str) or not volume_name:
            return
        if status_of(pvc).get("phase") != "Bound":
            return
        if (
            modify_status(pvc) is None
            and (spec_class(pvc) or "") == (current_class(pvc) or "")
            and self.expectations.modified_target(key) is None
        ):
            return  # the common case, decided without the volume
        pv = self.volumes.get_by_key(volume_name)
        if pv is None:
            raise VolumeNotCachedError(
                f"PersistentVolume {volume_name} of claim {key} is not in the cache yet"
            )
        try:
            volume = to_model(pv, V1PersistentVolume)
        except ConversionError as err:
            # Not retried: the same object fails the same way; a change of it looks again.
            self.log.info("cannot read the volume", claim=key, pv=volume_name, error=str(err))
            return
        if not self.modifier.can_support(volume):
            return
        if not self.modifier.modify_supported:
            self._report_unsupported(pvc, volume)
            return
        await self._modify(key, pvc, pv, volume)

    def _report_unsupported(self, pvc: Obj, volume: V1PersistentVolume) -> None:
        wanted = spec_class(pvc) or ""
        if wanted and wanted != (current_class(pvc) or ""):
            self.writes.event(
                pvc,
                EVENT_TYPE_WARNING,
                REASON_VOLUME_MODIFY_NOT_SUPPORTED,
                f'VolumeAttributesClass "{wanted}" cannot be applied to volume '
                f"{name_of(pvc)}: {self.modifier.unsupported_reason(volume)}",
            )

    async def _modify(self, key: str, pvc: Obj, pv: Obj, volume: V1PersistentVolume) -> None:
        """Upstream's ``modify``: wait out an infeasible target, finish what the driver already
        did, then roll back, continue or start."""
        self._delay_if_recently_infeasible(key, pvc)
        done = self.expectations.modified_target(key)
        if done is not None:
            state = as_mapping(modify_status(pvc)).get("status")
            if state == STATUS_IN_PROGRESS and target_class(pvc) == done:
                await self._complete(key, pvc, pv, done)
                return
            self.expectations.completed(key)  # the claim moved on since
        step = next_step(pvc, uncertain=self.expectations.is_uncertain(key))
        if step is Step.NOTHING:
            return
        if step is Step.ROLLED_BACK:
            await self._rolled_back(key, pvc)
        elif step is Step.CONTINUE:
            target = target_class(pvc)
            vac = self._class(pvc, target)
            if vac is None:
                raise ModifyError(f'VolumeAttributesClass "{target}" does not exist')
            await self._modify_with_target(key, pvc, pv, volume, vac)
        else:
            await self._validate_and_modify(key, pvc, pv, volume)

    def _delay_if_recently_infeasible(self, key: str, pvc: Obj) -> None:
        """Upstream's ``delayModificationIfRecentlyInfeasible``: the same infeasible target is
        not tried again before ``retry_interval_max``; another class is tried at once."""
        status = modify_status(pvc)
        wanted = spec_class(pvc)
        if status is None or wanted is None or target_class(pvc) != wanted:
            self.expectations.remove_slow(key)
            return
        remaining = self.expectations.slow_remaining(key)
        if status.get("status") == STATUS_INFEASIBLE:
            self.expectations.add_slow(key)
        if remaining > 0:
            raise DelayRetryError(
                f"skipping volume modification for pvc {key}, because modification previously "
                "failed with infeasible error",
                remaining,
            )

    def _class(self, pvc: Obj, name: str) -> Obj | None:
        """The VolumeAttributesClass ``name`` from the cache; when it does not exist, the
        claim's user is told (upstream's ``getTargetVAC``)."""
        vac = self.classes.get_by_key(name) if self.classes is not None else None
        if vac is None:
            self.writes.event(
                pvc,
                EVENT_TYPE_WARNING,
                REASON_VOLUME_MODIFY_FAILED,
                f'VAC "{name}" does not exist.',
            )
        return vac

    async def _rolled_back(self, key: str, pvc: Obj) -> None:
        """The class was taken back to nothing while no modification runs: the modification
        that had started is cancelled (its status, the record of the last attempt, stays)."""
        if not has_condition(pvc, CONDITION_MODIFYING_VOLUME):
            return
        self.writes.event(
            pvc, EVENT_TYPE_NORMAL, REASON_VOLUME_MODIFY_CANCELED, "Cancelled modify."
        )
        updated = await self._write(
            key, f"mark pvc {key} as rolled back", self.writes.mark_rolled_back(pvc)
        )
        self.expectations.written(key, updated)

    async def _validate_and_modify(
        self, key: str, pvc: Obj, pv: Obj, volume: V1PersistentVolume
    ) -> None:
        """Upstream's ``validateVACAndModifyVolumeWithTarget``: a class that does not exist makes
        the claim Pending (it is looked at again when the class appears); otherwise the claim
        is marked InProgress towards it and the driver is called."""
        wanted = spec_class(pvc) or ""
        vac = self._class(pvc, wanted)
        if vac is None:
            self.log.info("VolumeAttributesClass does not exist", claim=key, **{"class": wanted})
            updated = await self._write(
                key, f"mark pvc {key} as Pending", self.writes.mark_pending(pvc)
            )
            self.expectations.written(key, updated)
            return
        pvc = await self._write(
            key, f"mark pvc {key} as modifying", self.writes.mark_in_progress(pvc, wanted)
        )
        self.expectations.written(key, pvc)
        self.writes.event(
            pvc,
            EVENT_TYPE_NORMAL,
            REASON_VOLUME_MODIFY,
            f"external resizer is modifying volume {name_of(pvc)} with vac {name_of(vac)}",
        )
        await self._modify_with_target(key, pvc, pv, volume, vac)

    async def _modify_with_target(
        self, key: str, pvc: Obj, pv: Obj, volume: V1PersistentVolume, vac: Obj
    ) -> None:
        """Upstream's ``controllerModifyVolumeWithTarget``: call the driver with the class's
        parameters and record the outcome; raises when the claim must be retried."""
        target = name_of(vac)
        logger = self.log.bind(claim=key, pv=name_of(pv), **{"class": target})
        try:
            parameters = self._parameters(pvc, pv, vac)
            logger.info("modifying volume")
            await self._call(volume, parameters)
        except Exception as err:
            await self._record_failure(key, pvc, vac, err, logger)
            raise
        self.expectations.set_certain(key)
        self.expectations.modified(key, target)
        logger.info("volume modified")
        await self._complete(key, pvc, pv, target)

    def _parameters(self, pvc: Obj, pv: Obj, vac: Obj) -> dict[str, str]:
        driver = vac.get("driverName")
        if driver != self.name:
            raise ModifyError(
                f'VolumeAttributesClass "{name_of(vac)}" is for CSI driver "{driver}", not '
                f'"{self.name}" whose volume this is: name a class of "{self.name}"',
                code=GrpcCode.INVALID_ARGUMENT,
            )
        parameters = {str(k): str(v) for k, v in as_mapping(vac.get("parameters")).items()}
        if self.options.extra_modify_metadata:
            parameters[PVC_NAME_KEY] = name_of(pvc)
            parameters[PVC_NAMESPACE_KEY] = namespace_of(pvc)
            parameters[PV_NAME_KEY] = name_of(pv)
        return parameters

    async def _call(self, volume: V1PersistentVolume, parameters: Mapping[str, str]) -> None:
        try:
            async with asyncio.timeout(self.options.timeout):
                await self.modifier.modify(volume, parameters)
        except TimeoutError:
            raise ModifyError(
                f"modifying volume {volume.metadata.name if volume.metadata else ''} timed out "
                f"after {self.options.timeout:g}s; it may still be in progress",
                code=GrpcCode.DEADLINE_EXCEEDED,
            ) from None

    async def _record_failure(
        self, key: str, pvc: Obj, vac: Obj, err: BaseException, logger: Any
    ) -> None:
        """Record a failed call: with a gRPC code, the claim's status (InProgress, or
        Infeasible for invalid parameters) and whether the driver may still be working;
        always a ``VolumeModifyFailed`` event."""
        if is_user_bug(err):
            log_user_bug(
                logger, "modification failed: the modifier raised an unexpected exception", err
            )
        message = error_text(err)
        if isinstance(err, ModifyError) and err.code is not None:
            state = STATUS_IN_PROGRESS
            if not err.final:
                self.expectations.set_uncertain(key)
                message += f". Still modifying to VAC {name_of(vac)}"
            else:
                if err.infeasible:
                    state = STATUS_INFEASIBLE
                self.expectations.set_certain(key)
            try:
                updated = await self.writes.mark_failed(pvc, state, err)
            except ApiException as api_err:
                self.writes.event(pvc, EVENT_TYPE_WARNING, REASON_VOLUME_MODIFY_FAILED, message)
                raise ModifyError(
                    f"modifying volume failed with {message} but marking pvc {key} failed: "
                    f"{api_error_text(api_err)}"
                ) from None
            self.expectations.written(key, updated)
            if state == STATUS_INFEASIBLE:
                self.expectations.add_slow(key)
        logger.info("modification failed", error=message)
        self.writes.event(pvc, EVENT_TYPE_WARNING, REASON_VOLUME_MODIFY_FAILED, message)

    async def _complete(self, key: str, pvc: Obj, pv: Obj, target: str) -> None:
        """The volume has ``target``'s attributes: say so on the volume and the claim. A failed
        write is retried later without calling the driver again."""
        pvc, _ = await self._write(
            key,
            f"volume modified but marking pvc {key} and its volume {name_of(pv)} modified",
            self.writes.mark_completed(pvc, pv, target),
        )
        self.expectations.completed(key)
        self.expectations.written(key, pvc)
        self.writes.event(
            pvc,
            EVENT_TYPE_NORMAL,
            REASON_VOLUME_MODIFY_SUCCESSFUL,
            f"external resizer modified volume {name_of(pvc)} with vac {target} successfully",
        )
        if (spec_class(pvc) or "") != target:
            # The claim asked for another class meanwhile (an uncertain modification was
            # finished first): no event of the claim brings it back, so look again now.
            self.queue.add(key)

    async def _write(self, key: str, what: str, write: Awaitable[T]) -> T:
        """Await the write ``write``; an API error fails the sync with ``what`` and why
        (retried with backoff)."""
        try:
            return await write
        except ApiException as err:
            raise ModifyError(f"{what} failed: {api_error_text(err)}") from None

"""The ModifyController itself (external-resizer's ``modifyController``): informers on claims,
volumes and VolumeAttributesClasses, the claim queue their handlers feed, the workers, leader
election, and the sync of one claim (``syncPVC`` and ``modify``).

Invariants:

- Event handlers only enqueue ``namespace/name`` keys; every decision is a worker's, taken on
  the claim and volume the caches hold when the key is processed (and not on a copy older than
  the controller's own last write, see :mod:`.expectations`).
- The driver is asked to modify a volume only after the claim says ``InProgress`` towards that
  class (a write guarded by the claim's resourceVersion), and once it succeeded it is not asked
  again for the same change: the completion is retried on its own.

Differences from upstream, each on purpose:

- Claims whose class does not exist yet are looked at again as soon as the class is created
  (upstream waits for the resync period, ten minutes by default).
- A claim whose class is taken back to nothing, or that becomes Bound, is looked at at once;
  so is a claim that asked for another class while an uncertain modification was finished.
- A class of another driver is refused as infeasible before the driver is called (upstream
  sends its parameters to whatever driver the volume has).
- A failure without a gRPC code (an unreadable Secret, a bug in a Python modifier) gets a
  ``VolumeModifyFailed`` event too, so the user learns why nothing happens; it changes nothing
  in the claim's status, as upstream.
- A claim waiting out its slow period (infeasible) is requeued for the time left, not retried
  with backoff meanwhile.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Mapping
from typing import Any, Generic, TypeVar

from kubernetes_asyncio.client import ApiClient, V1PersistentVolume

from pyprovlib._attacher import GrpcCode
from pyprovlib._errors import PyprovlibError
from pyprovlib._logging import get_logger
from pyprovlib._modifier import Modifier, ModifyError
from pyprovlib._redaction import scrub_text
from pyprovlib.controller._errors import (
    DelayRetryError,
    describe_user_error,
    is_user_bug,
    log_user_bug,
)
from pyprovlib.controller._lifecycle import ControllerLifecycle
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
    VAC_INDEX,
    Step,
    claim_key,
    claims_by_class,
    current_class,
    dict_of,
    has_condition,
    modify_status,
    next_step,
    should_enqueue,
    spec_class,
    spec_of,
    status_of,
    target_class,
)
from pyprovlib.controller._modify.expectations import ModifyExpectations
from pyprovlib.controller._modify.options import ModifyControllerOptions
from pyprovlib.controller._modify.options import lease_name as default_lease_name
from pyprovlib.controller._modify.status import ModifyStatusWriter
from pyprovlib.controller._sidecar_options import retry_queue
from pyprovlib.kube._clock import Clock
from pyprovlib.kube._convert import ConversionError, to_model
from pyprovlib.kube._errors import ApiException, api_error_text
from pyprovlib.kube._events import (
    CONTROLLER_HOLD_LIMIT,
    CONTROLLER_MAX_BUFFER,
    EVENT_TYPE_NORMAL,
    EVENT_TYPE_WARNING,
    EventRecorder,
)
from pyprovlib.kube._informer import SharedInformer, SharedInformerFactory
from pyprovlib.kube._objects import Obj, name_of, namespace_of
from pyprovlib.kube._resources import (
    PERSISTENT_VOLUME_CLAIMS,
    PERSISTENT_VOLUMES,
    VOLUME_ATTRIBUTES_CLASSES,
)
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.kube._store import DeletedFinalStateUnknown
from pyprovlib.kube._workqueue import RateLimitingQueue

__all__ = ["ModifyController", "VolumeNotCachedError"]

log = get_logger("pyprovlib.controller._modify")

ModifierT = TypeVar("ModifierT", bound=Modifier)
T = TypeVar("T")


class VolumeNotCachedError(PyprovlibError):
    """The claim's volume is not in the cache (yet): retried with backoff, as upstream."""


def _error_text(err: BaseException) -> str:
    if isinstance(err, ModifyError):
        return scrub_text(err.message)
    if isinstance(err, ApiException):
        return api_error_text(err)
    if is_user_bug(err):
        return scrub_text(describe_user_error(err))
    return scrub_text(str(err) or type(err).__name__)


class ModifyController(ControllerLifecycle, Generic[ModifierT]):
    """Modifies the volumes of Bound claims whose ``spec.volumeAttributesClassName`` changed,
    through ``modifier`` (external-resizer's ``modifyController``); generic in the modifier's
    type.

    ``client`` is a kubernetes-asyncio ``ApiClient``. Informers come from ``informer_factory``
    when given (the caller starts it) or from a factory the controller owns. :meth:`run` runs
    everything until cancelled or :meth:`stop`; it can be called once.
    """

    def __init__(
        self,
        client: ApiClient,
        modifier: ModifierT,
        options: ModifyControllerOptions | None = None,
        *,
        informer_factory: SharedInformerFactory | None = None,
        clock: Clock | None = None,
    ) -> None:
        name = getattr(modifier, "name", "")
        if not isinstance(name, str) or not name:
            raise ValueError("the modifier must have a non-empty name")
        self.modifier = modifier
        self.name = name
        self.options = options or ModifyControllerOptions()
        super().__init__(
            client,
            self.options,
            role="modify controller",
            lease_name=self.options.lease or default_lease_name(name),
            log=log.bind(modifier=name),
            informer_factory=informer_factory,
            clock=clock,
        )
        self.recorder = EventRecorder(
            client,
            f"external-resizer {name}",
            host=socket.gethostname(),
            clock=self._clock,
            busy=self._work_waiting,
            max_buffer=CONTROLLER_MAX_BUFFER,
            hold_limit=CONTROLLER_HOLD_LIMIT,
        )
        self._writes = ModifyStatusWriter(
            pvcs=ResourceClient(client, PERSISTENT_VOLUME_CLAIMS),
            pvs=ResourceClient(client, PERSISTENT_VOLUMES),
            recorder=self.recorder,
            clock=self._clock,
        )
        # Named as upstream names it (the resize controller's queue too): "<driver>-pvc".
        self.claim_queue = retry_queue(f"{name}-pvc", self.options, self._clock)
        self.expectations = ModifyExpectations(self._clock, self.options.retry_interval_max)

        self.pvc_informer: SharedInformer = self.informer_factory.informer_for(
            PERSISTENT_VOLUME_CLAIMS
        )
        self.pvc_informer.add_indexers({VAC_INDEX: claims_by_class})
        self.pvc_informer.add_event_handler(
            on_add=self._pvc_added, on_update=self._pvc_updated, on_delete=self._pvc_deleted
        )
        self.pv_informer: SharedInformer = self.informer_factory.informer_for(PERSISTENT_VOLUMES)
        # A driver that cannot modify needs no classes: it only tells users so.
        self.vac_informer: SharedInformer | None = None
        if modifier.modify_supported:
            self.vac_informer = self.informer_factory.informer_for(VOLUME_ATTRIBUTES_CLASSES)
            self.vac_informer.add_event_handler(on_add=self._vac_added)

    # -- lifecycle -----------------------------------------------------------------------------

    def _work_queues(self) -> tuple[RateLimitingQueue[str], ...]:
        return (self.claim_queue,)

    def _work_waiting(self) -> bool:
        """Claims queued for a worker and not shut down: the event writers hold back meanwhile."""
        return bool(len(self.claim_queue)) and not self.claim_queue.shutting_down

    async def run(self) -> None:
        """Run until cancelled or :meth:`stop`. With leader election the control loop runs only
        while holding the Lease; losing it raises
        :class:`~pyprovlib.LeaderElectionLostError`."""
        with self._running():
            self._log.info("starting external resizer for modify volume")
            await self._run_elected_beside(
                {"modify-events": self.recorder.run},
                graceful_tail=lambda: self._flush_events(self.recorder),
            )
        self._log.info("external resizer for modify volume stopped")

    async def _run_controller(self) -> None:
        """Informers, then the uncertain claims, then the workers, until stop (upstream's
        ``Run``)."""
        async with asyncio.TaskGroup() as tg:
            informers = tg.create_task(self._run_informers(), name="modify-informers")
            async with self.claim_queue:
                caches = [self.pvc_informer, self.pv_informer]
                if self.vac_informer is not None:
                    caches.append(self.vac_informer)
                if await self._wait_for_sync(caches):
                    self._init_uncertain()
                    self._synced = True
                    workers = self._start_workers(
                        tg,
                        self.options.workers,
                        self.claim_queue,
                        self.recorder.waking(self._process_claim),
                    )
                    self._log.info("started external resizer for modify volume")
                    await self._stop_requested.wait()
                    self._synced = False
                    self.claim_queue.shut_down()
                    await asyncio.gather(*workers)
            informers.cancel()

    def _init_uncertain(self) -> None:
        """Claims whose status says a modification was running (or refused) when this
        instance started: it may still be running in the driver, so its target is finished
        first (upstream's ``initUncertainPVCs``)."""
        for pvc in self.pvc_informer.store.list():
            state = dict_of(modify_status(pvc)).get("status")
            if state in (STATUS_IN_PROGRESS, STATUS_INFEASIBLE):
                self.expectations.set_uncertain(claim_key(pvc))

    # -- informer handlers ---------------------------------------------------------------------

    def _pvc_added(self, pvc: Obj) -> None:
        self.claim_queue.add(claim_key(pvc))

    def _pvc_updated(self, old: Obj, new: Obj) -> None:
        if should_enqueue(old, new):
            self.claim_queue.add(claim_key(new))

    def _pvc_deleted(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        pvc = obj.obj if isinstance(obj, DeletedFinalStateUnknown) else obj
        key = claim_key(pvc)
        self.claim_queue.forget(key)
        self.expectations.forget(key)

    def _vac_added(self, vac: Obj) -> None:
        # Claims waiting (Pending) for this class to exist.
        for pvc in self.pvc_informer.store.by_index(VAC_INDEX, name_of(vac)):
            self.claim_queue.add(claim_key(pvc))

    # -- claims --------------------------------------------------------------------------------

    async def _process_claim(self, key: str) -> None:
        try:
            await self.sync_claim(key)
        except DelayRetryError as err:
            self._log.debug(str(err), claim=key, delay=err.delay)
            self.claim_queue.add_after(key, err.delay)
        except Exception as err:
            self._log.info(
                "error syncing claim; retrying with backoff", claim=key, error=_error_text(err)
            )
            self.claim_queue.add_rate_limited(key)
        else:
            self.claim_queue.forget(key)

    async def sync_claim(self, key: str) -> None:
        """Look at the claim ``key`` (``namespace/name``) and bring its volume to the class it
        asks for (upstream's ``syncPVC``); raises when it must be retried."""
        pvc = self.pvc_informer.store.get_by_key(key)
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
        pv = self.pv_informer.store.get_by_key(volume_name)
        if pv is None:
            raise VolumeNotCachedError(
                f"PersistentVolume {volume_name} of claim {key} is not in the cache yet"
            )
        try:
            volume = to_model(pv, V1PersistentVolume)
        except ConversionError as err:
            # Not retried: the same object fails the same way; a change of it looks again.
            self._log.info("cannot read the volume", claim=key, pv=volume_name, error=str(err))
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
            self._writes.event(
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
            state = dict_of(modify_status(pvc)).get("status")
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
        vac = self.vac_informer.store.get_by_key(name) if self.vac_informer else None
        if vac is None:
            self._writes.event(
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
        self._writes.event(
            pvc, EVENT_TYPE_NORMAL, REASON_VOLUME_MODIFY_CANCELED, "Cancelled modify."
        )
        updated = await self._write(
            key, f"mark pvc {key} as rolled back", self._writes.mark_rolled_back(pvc)
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
            self._log.info("VolumeAttributesClass does not exist", claim=key, **{"class": wanted})
            updated = await self._write(
                key, f"mark pvc {key} as Pending", self._writes.mark_pending(pvc)
            )
            self.expectations.written(key, updated)
            return
        pvc = await self._write(
            key, f"mark pvc {key} as modifying", self._writes.mark_in_progress(pvc, wanted)
        )
        self.expectations.written(key, pvc)
        self._writes.event(
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
        logger = self._log.bind(claim=key, pv=name_of(pv), **{"class": target})
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
        parameters = {str(k): str(v) for k, v in dict_of(vac.get("parameters")).items()}
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
        message = _error_text(err)
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
                updated = await self._writes.mark_failed(pvc, state, err)
            except ApiException as api_err:
                self._writes.event(pvc, EVENT_TYPE_WARNING, REASON_VOLUME_MODIFY_FAILED, message)
                raise ModifyError(
                    f"modifying volume failed with {message} but marking pvc {key} failed: "
                    f"{api_error_text(api_err)}"
                ) from None
            self.expectations.written(key, updated)
            if state == STATUS_INFEASIBLE:
                self.expectations.add_slow(key)
        logger.info("modification failed", error=message)
        self._writes.event(pvc, EVENT_TYPE_WARNING, REASON_VOLUME_MODIFY_FAILED, message)

    async def _complete(self, key: str, pvc: Obj, pv: Obj, target: str) -> None:
        """The volume has ``target``'s attributes: say so on the volume and the claim. A failed
        write is retried later without calling the driver again."""
        pvc, _ = await self._write(
            key,
            f"volume modified but marking pvc {key} and its volume {name_of(pv)} modified",
            self._writes.mark_completed(pvc, pv, target),
        )
        self.expectations.completed(key)
        self.expectations.written(key, pvc)
        self._writes.event(
            pvc,
            EVENT_TYPE_NORMAL,
            REASON_VOLUME_MODIFY_SUCCESSFUL,
            f"external resizer modified volume {name_of(pvc)} with vac {target} successfully",
        )
        if (spec_class(pvc) or "") != target:
            # The claim asked for another class meanwhile (an uncertain modification was
            # finished first): no event of the claim brings it back, so look again now.
            self.claim_queue.add(key)

    async def _write(self, key: str, what: str, write: Awaitable[T]) -> T:
        """Await the write ``write``; an API error fails the sync with ``what`` and why
        (retried with backoff)."""
        try:
            return await write
        except ApiException as err:
            raise ModifyError(f"{what} failed: {api_error_text(err)}") from None

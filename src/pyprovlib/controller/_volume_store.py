"""Saving provisioned PersistentVolumes to the API server (upstream's ``volume_store.go``).

Once a provisioner has created an asset, its PV must reach the API server or the asset leaks.
Two strategies, as upstream:

- :class:`BackoffStore` blocks the provisioning worker and retries the create on a
  :class:`~pyprovlib.Backoff` schedule. ``AlreadyExists`` counts as success
  (an earlier attempt got through). When every attempt fails it deletes the asset again through
  ``provisioner.delete`` (retried on the same schedule) and reports the claim's provisioning as
  failed, so a later retry starts from scratch; if even the cleanup fails it says so in a
  ``ProvisioningCleanupFailed`` event. One step more than upstream: a failed create may still
  have been written (the answer lost with the connection, or a 504 after etcd took the write),
  so before deleting the asset the store reads the PV back; it deletes only on a ``NotFound``.
  A PV that is there for this claim counts as saved; when even the read gets no answer the
  asset is kept (the claim is retried, and the provisioner's create is idempotent for the same
  PV name) rather than risk deleting the data a PV describes.
- :class:`QueueStore` tries once inline, then hands a failed PV to background workers that
  retry it with a rate limiter until it is saved, so a slow or failing API never blocks
  provisioning workers and the asset is never deleted.
"""

from __future__ import annotations

import asyncio
import random
from typing import Protocol

import structlog
from kubernetes_asyncio.client import ApiClient

from pyprovlib._errors import PyprovlibError
from pyprovlib._logging import get_logger
from pyprovlib._provisioner import IgnoredError, Provisioner
from pyprovlib.controller._deleting import LazyVolume, deleter
from pyprovlib.controller._errors import describe_error
from pyprovlib.controller._options import Backoff
from pyprovlib.kube._clock import Clock, RealClock
from pyprovlib.kube._convert import ConversionError
from pyprovlib.kube._errors import ApiException, is_already_exists, is_not_found
from pyprovlib.kube._events import EventRecorder
from pyprovlib.kube._objects import Obj, name_of, namespace_of
from pyprovlib.kube._resources import PERSISTENT_VOLUMES
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.kube._store import Indexer
from pyprovlib.kube._workqueue import RateLimiter, RateLimitingQueue, run_worker

__all__ = [
    "DEFAULT_STORE_THREADINESS",
    "BackoffStore",
    "QueueStore",
    "VolumeSaveError",
    "VolumeStore",
]

log = get_logger(__name__)

DEFAULT_STORE_THREADINESS = 4
"""Background save workers of the queue store (upstream passes ``DefaultThreadiness``)."""

EVENT_NORMAL = "Normal"
EVENT_WARNING = "Warning"


class VolumeSaveError(PyprovlibError):
    """The PV of a provisioned volume could not be saved; the claim must be provisioned again."""


class VolumeStore(Protocol):
    """Makes sure a provisioned PV is saved to the API server (upstream's ``VolumeStore``)."""

    async def store_volume(self, claim: Obj, volume: Obj) -> None:
        """Save ``volume`` (provisioned for ``claim``). Returning means it was saved or will be
        saved in the background; raising :class:`VolumeSaveError` means it was not saved and
        the claim must be provisioned again."""
        ...

    async def run(self, threadiness: int) -> None:
        """Run background work until cancelled (nothing, for a blocking store)."""
        ...

    async def drain(self, grace_period: float) -> None:
        """Make a last attempt at whatever is pending, at most ``grace_period`` seconds."""
        ...


def event_target(obj: Obj, kind: str) -> Obj:
    """``obj`` with its ``kind``/``apiVersion`` (core/v1), so an event can reference it: items of
    a LIST come without them, and the recorder would drop an event about such an object."""
    if obj.get("kind") and obj.get("apiVersion"):
        return obj
    return {**obj, "kind": obj.get("kind") or kind, "apiVersion": obj.get("apiVersion") or "v1"}


def _claim_key(claim: Obj) -> str:
    return f"{namespace_of(claim)}/{name_of(claim)}"


def _record_provisioned(recorder: EventRecorder, claim: Obj, pv_name: str) -> None:
    """The claim's ``ProvisioningSucceeded`` event, once its PV is saved (by either store)."""
    recorder.event(
        event_target(claim, "PersistentVolumeClaim"),
        EVENT_NORMAL,
        "ProvisioningSucceeded",
        f"Successfully provisioned volume {pv_name}",
    )


async def create_volume(client: ResourceClient, volume: Obj) -> bool:
    """Create ``volume``; True if created, False if it already existed. Other errors raise."""
    try:
        await client.create(volume)
    except ApiException as err:
        if is_already_exists(err):
            return False
        raise
    return True


class BackoffStore:
    """Saves a PV with retries, blocking the caller; deletes the asset if saving fails."""

    def __init__(
        self,
        api_client: ApiClient,
        recorder: EventRecorder,
        backoff: Backoff,
        provisioner: Provisioner,
        *,
        clock: Clock | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self._api = api_client
        self._volumes = ResourceClient(api_client, PERSISTENT_VOLUMES)
        self._recorder = recorder
        self.backoff = backoff
        self._provisioner = provisioner
        self._clock = clock or RealClock()
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not security

    async def _sleep(self, delay: float) -> None:
        if self.backoff.jitter > 0:
            delay += self._rng.random() * self.backoff.jitter * delay
        await self._clock.sleep(delay)

    async def store_volume(self, claim: Obj, volume: Obj) -> None:
        """Create the PV, retrying on the backoff schedule; on final failure delete the asset
        and raise :class:`VolumeSaveError`."""
        pv_name = name_of(volume)
        logger = log.bind(claim=_claim_key(claim), pv=pv_name)
        delays = self.backoff.delays()
        last_error: Exception = VolumeSaveError("no attempt was made")
        for attempt in range(self.backoff.steps):
            try:
                created = await create_volume(self._volumes, volume)
            except Exception as err:  # any failure to save: retry, then clean up
                last_error = err
                logger.info(
                    "failed to save PersistentVolume",
                    attempt=attempt + 1,
                    error=describe_error(err),
                )
                if isinstance(err, ApiException) and err.status in (400, 422):
                    # The PV is invalid: the same request can never succeed.
                    break
            else:
                logger.debug("PersistentVolume saved" if created else "PersistentVolume exists")
                _record_provisioned(self._recorder, claim, pv_name)
                return
            if attempt < len(delays):
                await self._sleep(delays[attempt])
        saved = await self._saved_after_all(claim, pv_name, last_error, logger)
        if saved:
            logger.info("PersistentVolume was saved by an attempt whose answer was lost")
            _record_provisioned(self._recorder, claim, pv_name)
            return
        if saved is None:
            raise VolumeSaveError(
                f"could not save PersistentVolume {pv_name} nor confirm it is absent: "
                f"{describe_error(last_error)}; the volume is kept and provisioning will be retried"
            ) from last_error
        await self._clean_up(claim, volume, last_error, logger)
        raise VolumeSaveError(
            f"could not save PersistentVolume {pv_name}: {describe_error(last_error)}"
        ) from last_error

    async def _saved_after_all(
        self,
        claim: Obj,
        pv_name: str,
        save_error: BaseException,
        logger: structlog.typing.FilteringBoundLogger,
    ) -> bool | None:
        """Whether the PV is there after every create failed: True when it is (for this
        claim), False when the API server says it is not, None when that cannot be known."""
        try:
            existing = await self._volumes.get(pv_name)
        except ApiException as err:
            if is_not_found(err):
                return False
            read_error: BaseException = err
        except Exception as err:  # no answer at all: the connection, a timeout
            read_error = err
        else:
            ref = (existing.get("spec") or {}).get("claimRef") or {}
            if ref.get("uid") in (None, (claim.get("metadata") or {}).get("uid")):
                return True
            # A PV of this name for another claim: its data must not be deleted with ours.
            read_error = VolumeSaveError(
                f"PersistentVolume {pv_name} exists for another claim "
                f"({ref.get('namespace')}/{ref.get('name')})"
            )
        logger.error(
            "could not save the PersistentVolume nor read it back; keeping the volume",
            error=describe_error(save_error),
            read_error=describe_error(read_error),
        )
        self._recorder.event(
            event_target(claim, "PersistentVolumeClaim"),
            EVENT_WARNING,
            "ProvisioningFailed",
            f"Error creating provisioned PV object for claim {_claim_key(claim)}: "
            f"{describe_error(save_error)}; whether it was saved is unknown "
            f"({describe_error(read_error)}), "
            "so the volume is kept and provisioning will be retried.",
        )
        return None

    async def _clean_up(
        self,
        claim: Obj,
        volume: Obj,
        save_error: BaseException,
        logger: structlog.typing.FilteringBoundLogger,
    ) -> None:
        # The asset exists but no PV describes it: delete it so it does not leak.
        logger.error(
            "error creating provisioned PV object for claim; deleting the volume",
            error=describe_error(save_error),
        )
        self._recorder.event(
            event_target(claim, "PersistentVolumeClaim"),
            EVENT_WARNING,
            "ProvisioningFailed",
            f"Error creating provisioned PV object for claim {_claim_key(claim)}: "
            f"{describe_error(save_error)}. Deleting the volume.",
        )
        try:
            delete = deleter(self._provisioner, LazyVolume(volume))
        except ConversionError as err:
            delete_error: BaseException | None = err
        else:
            delete_error = None
            delays = self.backoff.delays()
            for attempt in range(self.backoff.steps):
                try:
                    await delete()
                except IgnoredError as err:
                    logger.info("provisioner declined to delete the volume", reason=err.reason)
                    delete_error = None
                    break
                except Exception as err:
                    delete_error = err
                    logger.info(
                        "failed to clean volume", attempt=attempt + 1, error=describe_error(err)
                    )
                    if attempt < len(delays):
                        await self._sleep(delays[attempt])
                else:
                    logger.info("cleaning volume succeeded")
                    delete_error = None
                    break
        if delete_error is not None:
            logger.error(
                "error cleaning provisioned volume for claim; please delete it manually",
                error=describe_error(delete_error),
            )
            self._recorder.event(
                event_target(claim, "PersistentVolumeClaim"),
                EVENT_WARNING,
                "ProvisioningCleanupFailed",
                f"Error cleaning provisioned volume for claim {_claim_key(claim)}: "
                f"{describe_error(delete_error)}. Please delete manually.",
            )

    async def run(self, threadiness: int) -> None:
        """Nothing runs in the background: returns at once."""
        del threadiness

    async def drain(self, grace_period: float) -> None:
        """Nothing is ever pending: returns at once."""
        del grace_period


class QueueStore:
    """Saves PVs in background workers, retrying each failed one with ``limiter`` until saved.

    Upstream's ``queueStore``. The success event goes to the claim found through the claims
    cache's ``uid`` index (the claim may have changed or gone since provisioning).
    """

    def __init__(
        self,
        api_client: ApiClient,
        limiter: RateLimiter,
        claims: Indexer,
        recorder: EventRecorder,
        *,
        clock: Clock | None = None,
    ) -> None:
        self._volumes_client = ResourceClient(api_client, PERSISTENT_VOLUMES)
        self._claims = claims
        self._recorder = recorder
        self._clock = clock or RealClock()
        self.queue: RateLimitingQueue[str] = RateLimitingQueue(
            "unsavedpvs", limiter, clock=self._clock
        )
        self._pending: dict[str, Obj] = {}

    @property
    def pending(self) -> dict[str, Obj]:
        """PVs not saved yet, by name (a copy)."""
        return dict(self._pending)

    def is_pending(self, name: str) -> bool:
        """Whether the PV ``name`` waits to be saved."""
        return name in self._pending

    async def store_volume(self, claim: Obj, volume: Obj) -> None:
        """Try to save ``volume`` now; on failure queue it for the background workers. Never
        raises: the volume will be saved eventually."""
        del claim
        name = name_of(volume)
        try:
            await self._save(volume)
        except Exception as err:  # retried in the background, whatever went wrong
            log.error(
                "failed to save volume; retrying in the background",
                pv=name,
                error=describe_error(err),
            )
            self._pending[name] = volume
            self.queue.add(name)

    async def _save(self, volume: Obj) -> None:
        created = await create_volume(self._volumes_client, volume)
        log.debug("volume saved" if created else "volume already exists", pv=name_of(volume))
        self._send_success_event(volume)

    def _send_success_event(self, volume: Obj) -> None:
        ref = volume.get("spec", {}).get("claimRef") or {}
        uid = ref.get("uid") if isinstance(ref, dict) else None
        if not uid:
            return
        claims = self._claims.by_index("uid", str(uid))
        if len(claims) != 1:
            return
        _record_provisioned(self._recorder, claims[0], name_of(volume))

    async def run(self, threadiness: int) -> None:
        """Run ``threadiness`` save workers until cancelled or :meth:`drain` is called."""
        log.info("starting save volume queue")
        async with self.queue, asyncio.TaskGroup() as tg:
            for _ in range(max(1, threadiness)):
                tg.create_task(run_worker(self.queue, self._process))
        log.info("stopped save volume queue")

    async def _process(self, name: str) -> None:
        volume = self._pending.get(name)
        if volume is None:
            self.queue.forget(name)
            return
        try:
            await self._save(volume)
        except Exception as err:  # keep retrying until it is saved
            log.info("failed to save volume; will retry", pv=name, error=describe_error(err))
            self.queue.add_rate_limited(name)
            return
        self._pending.pop(name, None)
        self.queue.forget(name)

    async def drain(self, grace_period: float) -> None:
        """Stop the workers and try every unsaved PV once more (no rate limit), for at most
        ``grace_period`` seconds. What is still unsaved is logged by name: a restarted controller
        provisions those claims again (the provisioner finds its asset under the same PV name)."""
        self.queue.shut_down()
        deadline = self._clock.monotonic() + grace_period
        for name, volume in list(self._pending.items()):
            remaining = deadline - self._clock.monotonic()
            if remaining <= 0:
                break
            try:
                async with asyncio.timeout(remaining):
                    await self._save(volume)
            except Exception as err:  # logged below with the others left unsaved
                log.warning(
                    "could not save volume before shutdown", pv=name, error=describe_error(err)
                )
                continue
            self._pending.pop(name, None)
        if self._pending:
            log.error(
                "volumes not saved at shutdown; their claims will be provisioned again on restart",
                pvs=sorted(self._pending),
            )

"""Leader election on coordination.k8s.io/v1 Leases, ported from client-go's
``tools/leaderelection`` with its ``LeaseLock``: one process of many does the work, and a
successor takes over when the leader stops or can no longer renew."""

from __future__ import annotations

import asyncio
import math
import random
import socket
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kubernetes_asyncio.client import ApiClient

from pyprovlib._logging import get_logger
from pyprovlib.kube import _errors as errors
from pyprovlib.kube._clock import Clock, RealClock, run_within
from pyprovlib.kube._config import request_json
from pyprovlib.kube._objects import Obj
from pyprovlib.kube._resources import LEASES

__all__ = [
    "JITTER_FACTOR",
    "LeaderElectionConfig",
    "LeaderElectionRecord",
    "LeaderElector",
    "format_micro_time",
]

log = get_logger(__name__)

JITTER_FACTOR = 1.2
"""client-go's ``JitterFactor``: retries wait ``retry_period * (1 + rand * 1.2)``."""


def _default_identity() -> str:
    return f"{socket.gethostname()}_{uuid.uuid4()}"


@dataclass(frozen=True)
class LeaderElectionConfig:
    """Which Lease to contend for and the timing (client-go's defaults and rules).

    ``lease_duration``: how long followers wait, from when they last saw the lease change,
    before taking it over. ``renew_deadline``: how long the leader keeps retrying a renewal
    before it gives up leading. ``retry_period``: the pause between attempts. They must
    satisfy ``lease_duration > renew_deadline > 1.2 * retry_period > 0``. ``identity``
    defaults to ``<hostname>_<uuid4>``. With ``release_on_cancel`` the lease is released
    when :meth:`LeaderElector.run` stops, so a successor takes over at once.
    """

    lease_name: str
    namespace: str
    identity: str | None = None
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    release_on_cancel: bool = True

    def __post_init__(self) -> None:
        if not self.lease_name:
            raise ValueError("lease_name must not be empty")
        if not self.namespace:
            raise ValueError("namespace must not be empty")
        if self.identity is None:
            object.__setattr__(self, "identity", _default_identity())
        elif not self.identity:
            raise ValueError("identity must not be empty")
        if self.lease_duration <= 0:
            raise ValueError(f"lease_duration must be greater than zero, got {self.lease_duration}")
        if self.renew_deadline <= 0:
            raise ValueError(f"renew_deadline must be greater than zero, got {self.renew_deadline}")
        if self.retry_period <= 0:
            raise ValueError(f"retry_period must be greater than zero, got {self.retry_period}")
        if self.lease_duration <= self.renew_deadline:
            raise ValueError(
                f"lease_duration ({self.lease_duration}) must be greater than renew_deadline "
                f"({self.renew_deadline})"
            )
        if self.renew_deadline <= JITTER_FACTOR * self.retry_period:
            raise ValueError(
                f"renew_deadline ({self.renew_deadline}) must be greater than "
                f"{JITTER_FACTOR} * retry_period ({self.retry_period})"
            )

    @property
    def holder_identity(self) -> str:
        """The identity written into the lease (never empty after construction)."""
        return self.identity or ""


def format_micro_time(dt: datetime) -> str:
    """A ``metav1.MicroTime``: RFC 3339 in UTC with exactly six fractional digits."""
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class LeaderElectionRecord:
    """The lease spec fields leader election reads and writes (client-go's
    ``LeaderElectionRecord``)."""

    holder_identity: str = ""
    lease_duration_seconds: int = 0
    acquire_time: str = ""
    renew_time: str = ""
    leader_transitions: int = 0

    @classmethod
    def from_lease(cls, lease: Mapping[str, Any]) -> LeaderElectionRecord:
        """Read the record from a Lease's JSON."""
        spec = lease.get("spec")
        spec = spec if isinstance(spec, Mapping) else {}
        return cls(
            holder_identity=str(spec.get("holderIdentity") or ""),
            lease_duration_seconds=int(spec.get("leaseDurationSeconds") or 0),
            acquire_time=str(spec.get("acquireTime") or ""),
            renew_time=str(spec.get("renewTime") or ""),
            leader_transitions=int(spec.get("leaseTransitions") or 0),
        )

    def to_spec(self) -> Obj:
        """The Lease ``spec`` JSON for this record."""
        spec: Obj = {
            "holderIdentity": self.holder_identity,
            "leaseDurationSeconds": self.lease_duration_seconds,
            "leaseTransitions": self.leader_transitions,
        }
        if self.acquire_time:
            spec["acquireTime"] = self.acquire_time
        if self.renew_time:
            spec["renewTime"] = self.renew_time
        return spec


@dataclass
class _Observed:
    record: LeaderElectionRecord = field(default_factory=LeaderElectionRecord)
    # Local monotonic time of the last change seen; expiry is judged from it, never from
    # the remote renewTime, so clock skew between nodes cannot cause two leaders.
    time: float = float("-inf")


class LeaderElector:
    """Contends for a Lease and runs ``on_started_leading`` while holding it.

    :meth:`run` returns (or raises) when leadership ends: renewal failed for
    ``renew_deadline`` (the work task is cancelled first), the work returned or raised (its
    exception propagates), or run itself was cancelled (the lease is released when
    ``release_on_cancel``, and ``CancelledError`` propagates). ``on_stopped_leading`` is
    called after the work has stopped, only if leadership was acquired (client-go calls it
    even when it never led). ``on_new_leader`` is called with each new holder observed
    (not with the empty holder of a released lease).
    """

    def __init__(
        self,
        api_client: ApiClient,
        config: LeaderElectionConfig,
        *,
        on_started_leading: Callable[[], Awaitable[None]],
        on_stopped_leading: Callable[[], None] | None = None,
        on_new_leader: Callable[[str], None] | None = None,
        clock: Clock | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self._api = api_client
        self.config = config
        self.identity = config.holder_identity
        self._on_started = on_started_leading
        self._on_stopped = on_stopped_leading
        self._on_new_leader = on_new_leader
        self._clock = clock or RealClock()
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not security
        self._observed = _Observed()
        self._lease: Obj | None = None
        self._reported_leader = ""
        self._leading = False
        self._attempts = 0
        self._log = log.bind(lease=f"{config.namespace}/{config.lease_name}", id=self.identity)

    def is_leader(self) -> bool:
        """True while this elector holds the lease and its work runs."""
        return self._leading

    @property
    def leader(self) -> str | None:
        """The holder this elector last observed, or None when the lease is free/unknown."""
        return self._observed.record.holder_identity or None

    @property
    def attempts(self) -> int:
        """How many tries to acquire or renew the lease have finished (successful, refused,
        failed or timed out): tests wait on it to know a follower has contended, instead of
        sleeping."""
        return self._attempts

    @property
    def observed_record(self) -> LeaderElectionRecord:
        """The lease record as last observed (or written) by this elector."""
        return self._observed.record

    async def run(self) -> None:
        """Acquire the lease, lead until leadership ends, then return; see the class doc."""
        await self._acquire()
        self._leading = True
        self._log.info("became leader")
        work = asyncio.create_task(self._work(), name=f"leader-work:{self.identity}")
        renew = asyncio.create_task(self._renew_loop(), name=f"leader-renew:{self.identity}")
        cancelled = False
        try:
            await asyncio.wait({work, renew}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            cancelled = True
        finally:
            self._leading = False
            for task in (work, renew):
                task.cancel()
            # The work must have stopped before the lease is released, or a successor
            # could start while this process still acts as leader.
            await asyncio.gather(work, renew, return_exceptions=True)
            if self.config.release_on_cancel:
                await self._release()
            self._log.info("stopped leading")
            if self._on_stopped is not None:
                self._on_stopped()
        if cancelled:
            raise asyncio.CancelledError
        if work.done() and not work.cancelled() and work.exception() is not None:
            raise work.exception()  # type: ignore[misc]
        if renew.done() and not renew.cancelled():
            self._log.warning("leadership lost: could not renew the lease in time")

    async def _work(self) -> None:
        await self._on_started()

    async def _acquire(self) -> None:
        self._log.info("attempting to acquire the lease")
        while True:
            ok = await self._attempt(self.config.renew_deadline)
            if ok:
                return
            period = self.config.retry_period
            await self._clock.sleep(period + self._rng.random() * JITTER_FACTOR * period)

    async def _renew_loop(self) -> None:
        while True:
            deadline = self._clock.monotonic() + self.config.renew_deadline
            if not await self._renew_until(deadline):
                # Stop counting as leader at the deadline itself, before the work is
                # cancelled: followers can only take over lease_duration after their last
                # observation, which is later.
                self._leading = False
                return
            await self._clock.sleep(self.config.retry_period)

    async def _renew_until(self, deadline: float) -> bool:
        while True:
            remaining = deadline - self._clock.monotonic()
            if remaining <= 0:
                return False
            if await self._attempt(remaining):
                return True
            remaining = deadline - self._clock.monotonic()
            if remaining <= 0:
                return False
            await self._clock.sleep(min(self.config.retry_period, remaining))

    async def _attempt(self, budget: float) -> bool:
        # One try bounded by the clock, so a hung request counts as a failed renewal.
        attempt = await run_within(self._try_acquire_or_renew(), budget, self._clock)
        ok = False
        if attempt.cancelled():
            self._log.debug("lease request timed out", budget=budget)
        elif (failure := attempt.exception()) is not None:
            # Only an unreadable lease gets here; request errors are handled inside.
            self._log.warning("lease attempt failed", error=_err(failure))
        else:
            ok = attempt.result()
        self._attempts += 1
        self._maybe_report_transition()
        return ok

    def _is_holder(self) -> bool:
        return self._observed.record.holder_identity == self.identity

    def _lease_valid(self) -> bool:
        expiry = self._observed.time + self._observed.record.lease_duration_seconds
        return expiry > self._clock.monotonic()

    def _set_observed(self, record: LeaderElectionRecord) -> None:
        self._observed = _Observed(record, self._clock.monotonic())

    async def _try_acquire_or_renew(self) -> bool:
        now = format_micro_time(self._clock.now())
        # Whole seconds on the wire. Rounded up: followers must never wait less than the
        # configured duration, which is what bounds a cut-off leader (renew deadline + retry).
        duration = max(1, math.ceil(self.config.lease_duration))
        desired = LeaderElectionRecord(self.identity, duration, now, now, 0)

        if self._is_holder() and self._lease_valid() and self._lease is not None:
            # Fast path: renew with the lease we wrote last, without a GET.
            old = self._observed.record
            fast = LeaderElectionRecord(
                self.identity, duration, old.acquire_time, now, old.leader_transitions
            )
            try:
                self._lease = await self._update(self._lease, fast)
            except Exception as err:  # any failure falls back to the slow path
                self._log.debug("optimistic renewal failed", error=_err(err))
            else:
                self._set_observed(fast)
                return True

        try:
            lease = await request_json(
                self._api, "GET", LEASES.path(self.config.namespace, self.config.lease_name)
            )
        except errors.ApiException as err:
            if not errors.is_not_found(err):
                self._log.info("cannot read the lease", error=_err(err))
                return False
            return await self._create(desired)
        except Exception as err:  # transport errors are a failed attempt
            self._log.info("cannot read the lease", error=_err(err))
            return False

        self._lease = lease
        old = LeaderElectionRecord.from_lease(lease)
        if old != self._observed.record:
            self._observed = _Observed(old, self._clock.monotonic())
        if old.holder_identity and self._lease_valid() and not self._is_holder():
            self._log.debug("lease held by another", holder=old.holder_identity)
            return False

        if self._is_holder():
            desired = LeaderElectionRecord(
                self.identity, duration, old.acquire_time, now, old.leader_transitions
            )
        else:
            desired = LeaderElectionRecord(
                self.identity, duration, now, now, old.leader_transitions + 1
            )
        try:
            self._lease = await self._update(lease, desired)
        except Exception as err:  # 409 and others: retry next period
            self._log.info("cannot update the lease", error=_err(err))
            return False
        self._set_observed(desired)
        return True

    async def _create(self, record: LeaderElectionRecord) -> bool:
        body: Obj = {
            "apiVersion": LEASES.api_version,
            "kind": LEASES.kind,
            "metadata": {"name": self.config.lease_name, "namespace": self.config.namespace},
            "spec": record.to_spec(),
        }
        try:
            self._lease = await request_json(
                self._api, "POST", LEASES.path(self.config.namespace), body=body
            )
        except Exception as err:  # AlreadyExists and others: retry later
            self._log.info("cannot create the lease", error=_err(err))
            return False
        self._set_observed(record)
        return True

    async def _update(self, lease: Obj, record: LeaderElectionRecord) -> Obj:
        body = dict(lease)
        body["spec"] = {**(lease.get("spec") or {}), **record.to_spec()}
        # PUT carries the resourceVersion read, so a concurrent writer makes this a 409.
        return await request_json(
            self._api,
            "PUT",
            LEASES.path(self.config.namespace, self.config.lease_name),
            body=body,
        )

    async def _release(self) -> None:
        if not self._is_holder() or self._lease is None:
            return
        now = format_micro_time(self._clock.now())
        # client-go's release: empty holder, a 1 s lease, transitions kept.
        released = LeaderElectionRecord("", 1, now, now, self._observed.record.leader_transitions)
        attempt = await run_within(
            self._update(self._lease, released), self.config.renew_deadline, self._clock
        )
        if not attempt.cancelled() and attempt.exception() is None:
            self._lease = attempt.result()
            self._set_observed(released)
            self._log.info("released the lease")
        else:
            failure = None if attempt.cancelled() else attempt.exception()
            self._log.warning(
                "could not release the lease", error=_err(failure) if failure else "timeout"
            )

    def _maybe_report_transition(self) -> None:
        holder = self._observed.record.holder_identity
        if holder == self._reported_leader:
            return
        self._reported_leader = holder
        if holder:
            self._log.info("new leader observed", leader=holder)
            if self._on_new_leader is not None:
                try:
                    self._on_new_leader(holder)
                except Exception:
                    self._log.exception("on_new_leader callback failed", leader=holder)


def _err(err: BaseException) -> str:
    if isinstance(err, errors.ApiException):
        return f"HTTP {err.status} {errors.status_reason(err)}".strip()
    return type(err).__name__

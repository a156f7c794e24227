"""Leader election with several electors against one in-memory API server, on a fake clock,
with injected faults: never two leaders at once, and failover within the documented bounds."""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import Any

import pytest
import pytest_asyncio

from pyprovlib.kube._clock import FakeClock
from pyprovlib.kube._config import LimitedApiClient, request_json
from pyprovlib.kube._leaderelection import (
    LeaderElectionConfig,
    LeaderElector,
    format_micro_time,
)
from pyprovlib.kube._ratelimit import TokenBucket
from pyprovlib.testing._server import ApiServer

NS = "kube-system"
LEASE = "pyprovlib-test"
MICRO_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


class _Traffic:
    """Counts requests in flight across all electors' clients, so the simulation can let
    real HTTP round trips finish before moving fake time on."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.progress = 0


class _CountingClient(LimitedApiClient):
    traffic: _Traffic

    async def request(self, *args: Any, **kwargs: Any) -> Any:
        self.traffic.in_flight += 1
        self.traffic.progress += 1
        try:
            return await super().request(*args, **kwargs)
        finally:
            self.traffic.in_flight -= 1
            self.traffic.progress += 1


class Candidate:
    """One process contending for the lease: its elector, its work and what it saw."""

    def __init__(self, sim: Sim, name: str, clock: Any = None, **config: Any) -> None:
        self.sim = sim
        self.name = name
        self.working = False
        self.stopped_calls = 0
        self.new_leaders: list[str] = []
        self.client = _CountingClient(sim.server.configuration(), limiter=TokenBucket(0, 0))
        self.client.traffic = sim.traffic
        self.elector = LeaderElector(
            self.client,
            LeaderElectionConfig(LEASE, NS, identity=name, **config),
            on_started_leading=self._work,
            on_stopped_leading=self._stopped,
            on_new_leader=self.new_leaders.append,
            clock=clock or sim.clock,
            rng=random.Random(name),
        )
        self.task: asyncio.Task[None] | None = None

    async def _work(self) -> None:
        self.working = True
        self.sim.timeline.append((self.sim.clock.monotonic(), self.name, "start"))
        try:
            await asyncio.Event().wait()
        finally:
            self.working = False
            self.sim.timeline.append((self.sim.clock.monotonic(), self.name, "stop"))

    def _stopped(self) -> None:
        self.stopped_calls += 1

    def start(self) -> None:
        self.task = asyncio.create_task(self.elector.run(), name=self.name)

    async def stop(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        await self.client.close()


class Sim:
    """Drives fake time in small steps, letting HTTP settle and checking the invariant at
    every step."""

    def __init__(self, server: ApiServer, clock: FakeClock) -> None:
        self.server = server
        self.clock = clock
        self.traffic = _Traffic()
        self.candidates: list[Candidate] = []
        self.timeline: list[tuple[float, str, str]] = []
        # Set while a test parks requests in injected server latency on the fake clock.
        self.allow_parked = False

    def add(self, name: str, clock: Any = None, **config: Any) -> Candidate:
        c = Candidate(self, name, clock, **config)
        self.candidates.append(c)
        return c

    async def settle(self) -> None:
        # Quiet = no request started or finished for a while and none in flight; a request
        # parked in injected server latency stays in flight, so then accept long quiet.
        deadline = time.monotonic() + 10
        quiet_since = time.monotonic()
        seen = self.traffic.progress
        while time.monotonic() < deadline:
            for _ in range(20):
                await asyncio.sleep(0)
            if self.traffic.progress != seen:
                seen = self.traffic.progress
                quiet_since = time.monotonic()
                continue
            quiet = time.monotonic() - quiet_since
            if self.traffic.in_flight == 0 and quiet >= 0.01:
                return
            if self.allow_parked and quiet >= 0.1:
                return
            await asyncio.sleep(0.002)
        raise AssertionError(f"{self.traffic.in_flight} lease requests did not finish")

    async def lead(self, leader: Candidate, *followers: Candidate) -> None:
        """Start ``leader``, run until it leads, then start ``followers``."""
        leader.start()
        await self.run_until(leader.elector.is_leader, limit=1)
        for follower in followers:
            follower.start()

    def leaders(self) -> list[Candidate]:
        return [c for c in self.candidates if c.elector.is_leader()]

    def check(self) -> None:
        leading = [c.name for c in self.leaders()]
        working = [c.name for c in self.candidates if c.working]
        assert len(leading) <= 1, f"two leaders at t={self.clock.monotonic()}: {leading}"
        assert len(working) <= 1, f"two working at t={self.clock.monotonic()}: {working}"

    async def run_for(self, seconds: float, step: float = 0.5) -> None:
        end = self.clock.monotonic() + seconds
        while self.clock.monotonic() < end - 1e-9:
            await self.clock.advance(step)
            await self.settle()
            self.check()

    async def run_until(self, predicate: Any, limit: float, step: float = 0.5) -> float:
        start = self.clock.monotonic()
        while not predicate():
            if self.clock.monotonic() - start > limit:
                raise AssertionError(f"not reached within {limit} s of fake time")
            await self.clock.advance(step)
            await self.settle()
            self.check()
        return self.clock.monotonic() - start

    def lease(self) -> dict[str, Any]:
        lease = self.server.storage.get("leases", NS, LEASE)
        assert lease is not None
        return lease

    def check_timeline(self) -> None:
        # Work intervals of different candidates never overlap.
        active: str | None = None
        for _, name, what in sorted(self.timeline, key=lambda e: (e[0], e[2] == "start")):
            if what == "start":
                assert active is None, f"{name} started while {active} was working"
                active = name
            else:
                assert active == name
                active = None


@pytest_asyncio.fixture
async def sim() -> AsyncIterator[Sim]:
    clock = FakeClock()
    async with ApiServer(clock=clock) as server:
        s = Sim(server, clock)
        try:
            yield s
        finally:
            for c in s.candidates:
                await c.stop()


def test_config_validation() -> None:
    cfg = LeaderElectionConfig("l", "ns")
    assert cfg.identity
    assert "_" in cfg.holder_identity
    assert LeaderElectionConfig("l", "ns").identity != cfg.identity
    with pytest.raises(ValueError, match=r"lease_duration .* must be greater than renew_deadline"):
        LeaderElectionConfig("l", "ns", lease_duration=10, renew_deadline=10)
    with pytest.raises(ValueError, match=r"renew_deadline .* greater than 1.2 \* retry_period"):
        LeaderElectionConfig("l", "ns", renew_deadline=2.4, retry_period=2)
    with pytest.raises(ValueError, match="retry_period must be greater than zero"):
        LeaderElectionConfig("l", "ns", retry_period=0)
    with pytest.raises(ValueError, match="lease_name"):
        LeaderElectionConfig("", "ns")
    with pytest.raises(ValueError, match="identity"):
        LeaderElectionConfig("l", "ns", identity="")


async def test_single_elector_creates_and_renews(sim: Sim) -> None:
    a = sim.add("a")
    a.start()
    await sim.settle()
    assert a.elector.is_leader()
    spec = sim.lease()["spec"]
    assert spec["holderIdentity"] == "a"
    assert spec["leaseDurationSeconds"] == 15
    assert spec["leaseTransitions"] == 0
    assert MICRO_TIME.match(spec["acquireTime"])
    assert spec["acquireTime"] == spec["renewTime"] == format_micro_time(sim.clock.now())
    assert a.new_leaders == ["a"]
    assert a.elector.leader == "a"
    first = a.elector.attempts
    assert first >= 1

    sim.server.requests.reset()
    await sim.run_for(10)
    assert a.elector.attempts == first + 5  # one renewal each retry period
    spec = sim.lease()["spec"]
    assert spec["renewTime"] > spec["acquireTime"]
    assert spec["acquireTime"] == "2026-01-01T00:00:00.000000Z"
    # Renewals take the fast path: an update each retry period, no reads.
    assert sim.server.requests.count("update", "leases") == 5
    assert sim.server.requests.count("get", "leases") == 0
    assert a.working


async def test_two_electors_one_leader_and_followers_see_it(sim: Sim) -> None:
    a, b = sim.add("a"), sim.add("b")
    await sim.lead(a, b)
    await sim.run_for(1)
    tried = b.elector.attempts
    assert tried >= 1  # the follower read the Lease and saw it held
    await sim.run_for(60)
    assert a.elector.is_leader()
    assert not b.elector.is_leader()
    assert b.elector.attempts > tried  # and kept contending
    assert b.new_leaders == ["a"]
    assert b.elector.leader == "a"
    assert sim.lease()["spec"]["leaseTransitions"] == 0
    sim.check_timeline()


async def test_failover_after_cancel_is_immediate(sim: Sim) -> None:
    a, b, c = sim.add("a"), sim.add("b"), sim.add("c")
    for cand in (a, b, c):
        cand.start()
    await sim.run_until(lambda: len(sim.leaders()) == 1, limit=5)
    await sim.run_for(6)
    (old,) = sim.leaders()
    assert old.task is not None
    old.task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await old.task
    assert old.stopped_calls == 1
    assert not old.working
    released = sim.lease()["spec"]
    assert released["holderIdentity"] == ""
    assert released["leaseDurationSeconds"] == 1
    assert released["leaseTransitions"] == 0

    # A follower takes over at its next retry, not after the lease duration.
    waited = await sim.run_until(lambda: len(sim.leaders()) == 1, limit=15)
    assert waited <= 2.0 * (1 + 1.2) + 0.5
    (new,) = sim.leaders()
    assert new is not old
    assert sim.lease()["spec"]["holderIdentity"] == new.name
    assert sim.lease()["spec"]["leaseTransitions"] == 1
    await sim.run_for(5)
    others = [x for x in (a, b, c) if x is not old]
    for x in others:
        assert x.new_leaders[-1] == new.name
    sim.check_timeline()


async def test_hung_leader_steps_down_and_follower_takes_over(sim: Sim) -> None:
    a, b, c = sim.add("a"), sim.add("b"), sim.add("c")
    await sim.lead(a, b, c)
    await sim.run_for(5)
    last_renew = sim.clock.monotonic()
    # Only the leader writes while the lease is held: failing updates makes it "hang".
    sim.server.faults.fail(500, verb="update", resource="leases", count=None)
    lost = await sim.run_until(lambda: not a.elector.is_leader(), limit=20, step=0.25)
    # It gives up within a retry period plus the renew deadline of its last renewal.
    assert lost <= 2 + 10 + 0.5
    assert a.task is not None
    await asyncio.wait_for(a.task, 5)  # run() returns by itself
    assert a.stopped_calls == 1
    assert not a.working
    # Followers cannot take over before the lease expires; let writes through before that.
    await sim.run_for(14 - (sim.clock.monotonic() - last_renew), step=0.25)
    assert sim.leaders() == []
    sim.server.faults.clear()
    await sim.run_until(lambda: len(sim.leaders()) == 1, limit=15, step=0.25)
    took = sim.clock.monotonic() - last_renew
    # Lease duration after the followers' last observation, plus at most one jittered retry.
    assert 15 <= took <= 15 + 2 * (1 + 1.2) + 0.5
    assert sim.lease()["spec"]["leaseTransitions"] == 1
    sim.check_timeline()


async def test_renewal_request_hanging_counts_as_failure(sim: Sim) -> None:
    a, b = sim.add("a"), sim.add("b")
    await sim.lead(a, b)
    await sim.run_for(4)
    # The next renewal hangs in the server far past the renew deadline.
    sim.server.faults.latency(60, verb="update", resource="leases", count=1)
    sim.allow_parked = True
    lost = await sim.run_until(lambda: not a.elector.is_leader(), limit=20, step=0.25)
    assert lost <= 2 + 10 + 0.5
    # The hung write never landed; a released the lease, so b follows at its next retry.
    await sim.run_until(b.elector.is_leader, limit=10, step=0.25)
    assert sim.lease()["spec"]["holderIdentity"] == "b"
    sim.check_timeline()


async def test_conflicting_writer_makes_leader_fall_back_and_keep_lease(sim: Sim) -> None:
    a = sim.add("a")
    await sim.lead(a)
    # Someone else touches the lease (a label): a's cached resourceVersion is stale, so its
    # fast-path update gets 409 and it re-reads, then renews.
    async with sim.server.api_client() as other:
        await request_json(
            other,
            "PATCH",
            f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{LEASE}",
            body={"metadata": {"labels": {"touched": "yes"}}},
            content_type="application/merge-patch+json",
        )
    sim.server.requests.reset()
    await sim.run_for(2.5)
    assert a.elector.is_leader()
    assert sim.server.requests.count("get", "leases") == 1
    assert sim.server.requests.count("update", "leases") == 2
    assert sim.lease()["metadata"]["labels"] == {"touched": "yes"}


async def test_work_ending_releases_and_propagates(sim: Sim) -> None:
    clock = sim.clock

    async def work() -> None:
        await clock.sleep(3)
        raise RuntimeError("provisioner crashed")

    stopped: list[bool] = []
    async with sim.server.api_client() as client:
        elector = LeaderElector(
            client,
            LeaderElectionConfig(LEASE, NS, identity="w"),
            on_started_leading=work,
            on_stopped_leading=lambda: stopped.append(True),
            clock=clock,
        )
        task = asyncio.create_task(elector.run())
        await sim.run_until(elector.is_leader, limit=1)
        await sim.run_until(task.done, limit=10)
        with pytest.raises(RuntimeError, match="provisioner crashed"):
            await task
    assert stopped == [True]
    assert sim.lease()["spec"]["holderIdentity"] == ""


async def test_cancel_before_leading_does_not_call_stopped(sim: Sim) -> None:
    a, b = sim.add("a"), sim.add("b")
    await sim.lead(a, b)
    await sim.run_for(3)
    await b.stop()
    assert b.stopped_calls == 0
    assert sim.lease()["spec"]["holderIdentity"] == "a"


class _SkewedClock:
    """The shared fake clock with a wall clock an hour ahead: a node with a skewed clock."""

    def __init__(self, base: FakeClock, skew: float) -> None:
        self._base = base
        self._skew = timedelta(seconds=skew)

    def monotonic(self) -> float:
        return self._base.monotonic()

    def now(self) -> datetime:
        return self._base.now() + self._skew

    async def sleep(self, seconds: float) -> None:
        await self._base.sleep(seconds)


async def test_expiry_is_judged_locally_not_from_remote_timestamps(sim: Sim) -> None:
    a = sim.add("a")
    a.start()
    await sim.settle()
    assert a.elector.is_leader()
    # b's wall clock is an hour ahead: by remote renewTime the lease looks long expired,
    # but b only counts from when it saw the record change.
    b = sim.add("b", clock=_SkewedClock(sim.clock, 3600))
    b.start()
    await sim.run_for(40)
    assert a.elector.is_leader()
    assert not b.elector.is_leader()
    assert sim.lease()["spec"]["leaseTransitions"] == 0

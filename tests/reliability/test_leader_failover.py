"""Two and three replicas with leader election, the leader killed again and again (issue 11).

Each replica is a ProvisionController with Lease leader election sharing one backend; killing
the leader cancels its task (a crash: the Lease is not released, the next leader waits for it
to expire) and a fresh replica replaces it. Claims keep arriving, then are deleted, while
leaders die. Asserted: never two replicas leading or provisioning at the same time (the backend
records every provisioning call in flight per replica), no claim stuck, and the invariants.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest
from rel_support import (
    PROVISIONER,
    Backend,
    BackendProvisioner,
    Replicas,
    cancel,
    create_paced,
    delete_claims,
    fast_options,
    memory_world,
    nfs_world,
    stop_controllers,
    wait_until,
)
from task_support import background

from pyprovlib.controller._provision import ProvisionController


class Replica:
    def __init__(self, client: Any, backend: Backend, namespace: str, index: int) -> None:
        self.name = f"replica-{index}"
        options = fast_options(
            leader_election=True,
            leader_election_namespace=namespace,
            lease_duration=1.5,
            renew_deadline=1.0,
            retry_period=0.2,
        )
        self.provisioner = BackendProvisioner(backend, replica=self.name, pause=0.01)
        self.controller = ProvisionController(client, PROVISIONER, self.provisioner, options)
        self.task = asyncio.create_task(self.controller.run())


async def failover_scenario(replicas: int, kills: int, claims: int, seed: int) -> None:
    rng = random.Random(seed)
    async with memory_world("leader") as world:
        server, client, ns, class_name = world.server, world.client, world.ns, world.class_name
        backend, scenario = world.backend, world.scenario
        counter = iter(range(1000))
        live = [Replica(client, backend, ns, next(counter)) for _ in range(replicas)]
        max_leaders = 0
        leaders_seen: set[str] = set()

        async def watch_leaders() -> None:
            nonlocal max_leaders
            while True:
                leading = [r for r in live if r.controller.ready()]
                max_leaders = max(max_leaders, len(leading))
                leaders_seen.update(r.name for r in leading)
                await asyncio.sleep(0.01)

        async def kill_leaders() -> None:
            nonlocal live
            for _ in range(kills):
                await wait_until(
                    lambda: any(r.controller.ready() for r in live),  # noqa: B023 - rebound on purpose
                    timeout=15,
                    message="a leader is elected",
                )
                await asyncio.sleep(rng.uniform(0.1, 0.6))
                leader = next(r for r in live if r.controller.ready())
                # A crash: the Lease is not released (its release, an update, fails), so the
                # next leader must wait for it to expire while the old one is gone.
                server.faults.fail(500, verb="update", resource="leases", count=None)
                await cancel(leader.task)
                server.faults.clear()
                kill_times.append(loop.time())
                live = [r for r in live if r is not leader]
                live.append(Replica(client, backend, ns, next(counter)))

        keys = [(ns, f"claim-{i}") for i in range(claims)]
        loop = asyncio.get_running_loop()
        kill_times: list[float] = []
        try:
            async with background(watch_leaders()):
                await asyncio.gather(
                    kill_leaders(),
                    create_paced(client, keys, class_name, lambda: rng.uniform(0, 0.02)),
                )
                uids = await scenario.wait_bound(claims, timeout=60)
                await asyncio.gather(kill_leaders(), delete_claims(client, keys))
                await scenario.wait_deleted(uids, timeout=60)
        finally:
            await stop_controllers((r.controller, r.task) for r in live)
        # Crashed leaders were not released: takeovers waited for the lease to expire.
        assert len(kill_times) == 2 * kills
        assert backend.overlaps == [], f"two replicas provisioned at once: {backend.overlaps[:5]}"
        assert max_leaders == 1, f"{max_leaders} replicas led at the same time"
        assert len(leaders_seen) >= kills, f"only {sorted(leaders_seen)} ever led"
        # A killed leader's asset, created just before the kill, is reused: no second asset.
        assert all(n == 1 for n in backend.creations.values()), backend.creations.most_common(3)


@pytest.mark.parametrize("replicas", [2, 3])
async def test_leader_killed_repeatedly(replicas: int) -> None:
    await failover_scenario(replicas, kills=3, claims=40, seed=replicas)


@pytest.mark.slow
@pytest.mark.parametrize("replicas", [2, 3])
async def test_leader_killed_repeatedly_many_times(replicas: int) -> None:
    await failover_scenario(replicas, kills=12, claims=200, seed=10 + replicas)


# --------------------------------------------------------------------------------------------
# Real processes: three NFS example replicas, the leader SIGKILLed again and again
# --------------------------------------------------------------------------------------------


async def process_failover(tmp_path: Path, replicas: int, kills: int, claims: int) -> None:
    rng = random.Random(replicas * 100 + kills)
    async with nfs_world(tmp_path, "px") as world:
        client, ns, class_name, scenario = world.client, world.ns, world.class_name, world.scenario
        group = Replicas(tmp_path, world.kubeconfig, world.root, ns)
        try:
            for _ in range(replicas):
                await group.start()

            async def kill_leaders() -> None:
                for _ in range(kills):
                    await wait_until(
                        lambda: group.leader() is not None, timeout=60, message="a leader"
                    )
                    # A random moment of its term; under load the lease may change hands
                    # meanwhile, so whoever leads after the pause is the one killed.
                    await asyncio.sleep(rng.uniform(0.2, 1.0))
                    await wait_until(
                        lambda: group.leader() is not None, timeout=60, message="a leader"
                    )
                    leader = group.leader()
                    assert leader is not None
                    await group.kill(leader)
                    await group.top_up(replicas)

            keys = [(ns, f"claim-{i}") for i in range(claims)]
            await asyncio.gather(
                kill_leaders(), create_paced(client, keys, class_name, lambda: 0.05)
            )
            await group.top_up(replicas)
            uids = await scenario.wait_bound(claims, timeout=90)
            await asyncio.gather(kill_leaders(), delete_claims(client, keys))
            await group.top_up(replicas)
            await scenario.wait_deleted(uids, timeout=90)
        finally:
            await group.stop_all()
        assert len(group.killed_at) == 2 * kills
        assert group.overlapping_work() == [], group.overlapping_work()
        assert sum(bool(group.became_leader(i)) for i in range(len(group.procs))) > 2 * kills


@pytest.mark.parametrize(
    ("kills", "claims"),
    [
        pytest.param(2, 20, marks=pytest.mark.heavy, id="2-kills"),
        pytest.param(6, 100, marks=pytest.mark.slow, id="many-kills"),
    ],
)
async def test_three_processes_leader_sigkilled(tmp_path: Path, kills: int, claims: int) -> None:
    await process_failover(tmp_path, replicas=3, kills=kills, claims=claims)

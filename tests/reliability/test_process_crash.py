"""Process crashes during provisioning and deletion (issue 11, "Process crashes").

Two kinds of crash:

- task cancellation of an in-process ProvisionController at random points (the controller's
  code sees a CancelledError wherever it happens to be awaiting), replaced by a new instance;
- a real ``SIGKILL`` of a controller process — the NFS example (``python -m
  pyprovlib.examples.nfs``), whose assets are directories in a temporary "export" that
  survive the process — at random points, and exactly inside the windows "asset created, PV not
  saved" and "asset deleted, PV not deleted" (held open by API latency on the PV create/delete).

After the last restart the invariants hold: every claim Bound exactly once, one directory per
PV, no directory without a PV, nothing left of deleted claims.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from rel_support import (
    PROVISIONER,
    BackendProvisioner,
    NFSProcess,
    World,
    cancel,
    create_claims,
    delete_claims,
    fast_options,
    memory_world,
    nfs_world,
    running,
    wait_until,
)

from pyprovlib.controller._provision import ProvisionController

# --------------------------------------------------------------------------------------------
# In-process: task cancellation at random points
# --------------------------------------------------------------------------------------------


async def cancellation_scenario(claims: int, kills: int, seed: int) -> None:
    rng = random.Random(seed)
    async with memory_world("crash") as world:
        client, backend = world.client, world.backend

        async def crash_once() -> None:
            # A slow backend widens the windows between asset and PV.
            provisioner = BackendProvisioner(backend, pause=rng.uniform(0, 0.05))
            controller = ProvisionController(client, PROVISIONER, provisioner, fast_options())
            task = asyncio.create_task(controller.run())
            await asyncio.sleep(rng.uniform(0.05, 0.6))
            await cancel(task)

        def restarted() -> ProvisionController:
            return ProvisionController(
                client, PROVISIONER, BackendProvisioner(backend), fast_options()
            )

        keys = await create_claims(client, [world.ns], claims, world.class_name)
        for _ in range(kills):
            await crash_once()
        async with running(restarted()):
            uids = await world.scenario.wait_bound(claims, timeout=60)

        await delete_claims(client, keys)
        for _ in range(kills):
            await crash_once()
        async with running(restarted()):
            await world.scenario.wait_deleted(uids, timeout=60)


async def test_task_cancelled_at_random_points() -> None:
    await cancellation_scenario(claims=60, kills=6, seed=1)


@pytest.mark.slow
async def test_task_cancelled_at_random_points_500_claims() -> None:
    await cancellation_scenario(claims=500, kills=25, seed=2)


# --------------------------------------------------------------------------------------------
# A real process: the NFS example, SIGKILLed
# --------------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def nfs_process(tmp_path: Path) -> AsyncIterator[tuple[World, NFSProcess]]:
    async with nfs_world(tmp_path, "nfs") as world:
        process = NFSProcess(world.kubeconfig, world.root, tmp_path / "nfs.log")
        world.scenario.detail = process.tail
        try:
            yield world, process
        finally:
            await process.close()


@pytest.mark.parametrize(
    ("claims", "kills", "seed"),
    [
        pytest.param(30, 2, 3, marks=pytest.mark.heavy, id="30-claims"),
        pytest.param(200, 10, 4, marks=pytest.mark.slow, id="200-claims"),
    ],
)
async def test_nfs_process_sigkilled_at_random_points(
    tmp_path: Path, claims: int, kills: int, seed: int
) -> None:
    await sigkill_scenario(tmp_path, claims=claims, kills=kills, seed=seed)


async def sigkill_scenario(tmp_path: Path, claims: int, kills: int, seed: int) -> None:
    rng = random.Random(seed)
    async with nfs_process(tmp_path) as (world, process):
        scenario = world.scenario
        # Every PV save and delete takes a while, so kills land between asset and PV.
        world.server.faults.latency(0.15, verb="create", resource="persistentvolumes")
        world.server.faults.latency(0.15, verb="delete", resource="persistentvolumes")
        keys = await create_claims(world.client, [world.ns], claims, world.class_name)

        async def kill_mid_work() -> bool:
            """Start, wait until the process works, kill at a random point; True when the
            kill landed with work left to do."""
            await process.start()
            before = len(scenario.assets())
            with contextlib.suppress(AssertionError):
                await wait_until(lambda: len(scenario.assets()) != before, timeout=20, message="")
            await asyncio.sleep(rng.uniform(0.0, 0.4))
            await process.kill()
            return len(scenario.assets()) not in (0, before)

        mid = [await kill_mid_work() for _ in range(kills)]
        await process.start()
        uids = await world.scenario.wait_bound(claims, timeout=120)
        await process.kill()
        await delete_claims(world.client, keys)
        mid += [await kill_mid_work() for _ in range(kills)]
        await process.start()
        await world.scenario.wait_deleted(uids, timeout=120)
        assert await process.terminate() == 0
        scenario.check(deleted_uids=uids)
        assert any(mid), "no kill landed while the process was working"


async def test_nfs_sigkill_between_asset_created_and_pv_saved(tmp_path: Path) -> None:
    async with nfs_process(tmp_path) as (world, process):
        server, scenario = world.server, world.scenario
        # The PV create hangs: the directory exists, the PV does not.
        server.faults.latency(60.0, verb="create", resource="persistentvolumes", count=1)
        keys = await create_claims(world.client, [world.ns], 1, world.class_name)
        await process.start()
        await wait_until(
            lambda: (
                bool(scenario.assets())
                and server.requests.count("create", "persistentvolumes") >= 1
            ),
            timeout=30,
            message=lambda: "directory created and PV create in flight\n" + process.tail(),
        )
        await process.kill()
        assert scenario.volumes() == []
        assert len(scenario.assets()) == 1  # the window: an asset without a PV

        await process.start()
        uids = await world.scenario.wait_bound(1, timeout=30)

        # Now the other window: directory removed, the PV delete hangs, kill.
        server.faults.latency(60.0, verb="delete", resource="persistentvolumes", count=1)
        await delete_claims(world.client, keys)
        await wait_until(
            lambda: (
                not scenario.assets() and server.requests.count("delete", "persistentvolumes") >= 1
            ),
            timeout=30,
            message=lambda: "directory removed and PV delete in flight\n" + process.tail(),
        )
        await process.kill()
        assert len(scenario.volumes()) == 1  # the window: a PV without asset

        await process.start()
        await world.scenario.wait_deleted(uids, timeout=30)
        assert await process.terminate() == 0
        scenario.check(deleted_uids=uids)

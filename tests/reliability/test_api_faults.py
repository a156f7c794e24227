"""API server faults during provisioning and deletion (issue 11, "Faults").

A chaos task keeps injecting one kind of fault — bursts of 500 / 503 / 429-with-Retry-After,
latency, dropped watches, history compaction (410 when a watch resumes), full server restarts
with state kept — while claims are created and provisioned, and again while they are deleted.
The faults hit every client, the PV binder (kube-controller-manager's part) included. At the end:
every claim Bound exactly once, one asset per PV, no leaked asset, nothing left of deleted claims.

Default: 60 claims per fault kind; ``-m slow``: 500 claims with every fault kind mixed.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Sequence

import pytest
from rel_support import (
    PROVISIONER,
    Backend,
    BackendProvisioner,
    all_bound,
    check_invariants,
    create_claims,
    create_class,
    create_namespace,
    delete_claims,
    fast_options,
    our_claims,
    our_volumes,
    running,
    unbound_report,
    unique,
    wait_until,
)

from pyprovlib.controller.provision import ProvisionController
from pyprovlib.testing.server import ApiServer

FAULT_KINDS = ("500", "503", "429", "latency", "drop_watches", "compact", "restart")


async def inject(server: ApiServer, kind: str, rng: random.Random) -> None:
    """One dose of ``kind``."""
    if kind in ("500", "503"):
        server.faults.fail(int(kind), count=rng.randint(3, 10))
    elif kind == "429":
        server.faults.fail(429, count=rng.randint(2, 6), retry_after=1)
    elif kind == "latency":
        server.faults.latency(rng.uniform(0.05, 0.3), count=rng.randint(5, 20))
    elif kind == "drop_watches":
        server.drop_watches()
    elif kind == "compact":
        server.compact()
        server.drop_watches()
    elif kind == "restart":
        await server.restart()
    else:
        raise ValueError(kind)


@contextlib.asynccontextmanager
async def chaos(
    server: ApiServer, kinds: Sequence[str], seed: int, interval: float = 0.15
) -> AsyncIterator[list[str]]:
    """Inject faults of ``kinds`` every ``interval`` (jittered) for the duration of the block;
    yields the log of what was injected. The first fault goes in before the block runs, so a
    phase that finishes quickly is still faulted. Faults left over are cleared on exit."""
    rng = random.Random(seed)
    injected: list[str] = []

    async def inject_one() -> None:
        kind = rng.choice(kinds)
        await inject(server, kind, rng)
        injected.append(kind)

    async def loop() -> None:
        while True:
            await asyncio.sleep(rng.uniform(interval / 2, interval * 1.5))
            await inject_one()

    await inject_one()

    task = asyncio.create_task(loop())
    try:
        yield injected
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        server.faults.clear()


async def run_scenario(
    kinds: Sequence[str], namespaces: int, per_namespace: int, seed: int
) -> None:
    async with ApiServer(binder=True) as server, server.api_client() as client:
        ns_names = [unique("rel") for _ in range(namespaces)]
        for ns in ns_names:
            await create_namespace(client, ns)
        class_name = await create_class(client, reclaimPolicy="Delete")
        total = namespaces * per_namespace
        backend = Backend()
        controller = ProvisionController(
            client, PROVISIONER, BackendProvisioner(backend), fast_options()
        )
        async with running(controller):
            async with chaos(server, kinds, seed) as injected:
                keys = await create_claims(client, ns_names, per_namespace, class_name)
                # Keep the faults coming while provisioning goes on.
                with contextlib.suppress(AssertionError):
                    await wait_until(
                        lambda: all_bound(server, ns_names, total), timeout=5, message=""
                    )
            assert injected, "no fault was injected: the scenario tested nothing"
            await wait_until(
                lambda: all_bound(server, ns_names, total),
                timeout=90,
                message=lambda: unbound_report(server, ns_names),
            )
            check_invariants(server, ns_names, [class_name], backend.assets)
            assert sum(backend.creations.values()) >= total

            uids = [c["metadata"]["uid"] for c in our_claims(server, ns_names)]
            async with chaos(server, kinds, seed + 1) as injected:
                await delete_claims(client, keys)
                with contextlib.suppress(AssertionError):
                    await wait_until(lambda: not backend.assets, timeout=5, message="")
            assert injected
            await wait_until(
                lambda: not backend.assets and not our_volumes(server, [class_name]),
                timeout=90,
                message=lambda: (
                    f"{len(backend.assets)} assets and "
                    f"{len(our_volumes(server, [class_name]))} PVs left"
                ),
            )
            check_invariants(server, ns_names, [class_name], backend.assets, deleted_uids=uids)
            assert our_claims(server, ns_names) == []
            # Nothing is still queued or believed in progress once everything is gone.
            await wait_until(
                lambda: len(controller.claim_queue) == 0 and len(controller.volume_queue) == 0,
                timeout=10,
                message="queues drained",
            )
            assert controller.claims_in_progress() == frozenset()
            assert controller.healthy()


@pytest.mark.parametrize("kind", FAULT_KINDS)
async def test_faults_during_provisioning_and_deletion(kind: str) -> None:
    await run_scenario([kind], namespaces=3, per_namespace=20, seed=FAULT_KINDS.index(kind))


@pytest.mark.slow
async def test_every_fault_mixed_500_claims() -> None:
    await run_scenario(FAULT_KINDS, namespaces=10, per_namespace=50, seed=11)

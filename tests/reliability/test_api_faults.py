"""API server faults during provisioning and deletion (issue 11, "Faults").

A chaos task keeps injecting one kind of fault — bursts of 500 / 503 / 429-with-Retry-After,
latency, dropped watches, history compaction (410 when a watch resumes), full server restarts
with state kept — while claims are created and provisioned, and again while they are deleted.
The faults hit every client, the PV binder (kube-controller-manager's part) included. At the end:
every claim Bound exactly once, one asset per PV, no leaked asset, nothing left of deleted claims.

Default: 60 claims per fault kind; ``-m slow``: 500 claims with every fault kind mixed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import pytest
from rel_support import (
    FAULT_KINDS,
    PROVISIONER,
    Backend,
    BackendProvisioner,
    Scenario,
    all_bound,
    chaos,
    create_claims,
    create_class,
    create_namespace,
    delete_claims,
    fast_options,
    running,
    unique,
    wait_until,
)

from pyprovlib.controller._provision import ProvisionController
from pyprovlib.testing._server import ApiServer


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
        scenario = Scenario(server, ns_names, [class_name], lambda: backend.assets)
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
            uids = await scenario.wait_bound(total, timeout=90)
            assert sum(backend.creations.values()) >= total

            async with chaos(server, kinds, seed + 1) as injected:
                await delete_claims(client, keys)
                with contextlib.suppress(AssertionError):
                    await wait_until(lambda: not backend.assets, timeout=5, message="")
            assert injected
            await scenario.wait_deleted(uids, timeout=90)
            assert scenario.claims() == []
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

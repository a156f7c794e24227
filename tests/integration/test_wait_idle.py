"""pyprovlib.testing.wait_idle: the deterministic point for negative assertions; and what runs
beside a ProvisionController's workers (``run_beside``)."""

from __future__ import annotations

import asyncio

import pytest
from claim_support import create_claim
from provision_support import MemoryProvisioner, create_class, fast_options, provisioner_name

from pyprovlib.controller._provision import ProvisionController
from pyprovlib.testing import eventually, running
from pyprovlib.testing._cluster import TestCluster
from pyprovlib.testing._support import wait_idle

pytestmark = pytest.mark.e2e


async def test_wait_idle_returns_once_the_write_is_seen_and_handled(
    kube_cluster: TestCluster,
) -> None:
    name = provisioner_name(kube_cluster)
    provisioner = MemoryProvisioner({})
    controller = ProvisionController(kube_cluster.api_client, name, provisioner, fast_options())
    async with running(controller):
        # Another provisioner's class: the claim is seen and deliberately left alone.
        other_class = await create_class(kube_cluster, f"{name}-other")
        claim = await create_claim(kube_cluster, other_class)
        await wait_idle(controller, claim)
        assert controller.caught_up(claim)
        assert controller.idle()
        assert provisioner.calls == []
        # A version the caches cannot have seen yet is reported, not waited for forever.
        future = {
            **claim,
            "metadata": {**claim["metadata"], "resourceVersion": "999999999999"},
        }
        with pytest.raises(AssertionError, match="caches to show PersistentVolumeClaim"):
            await wait_idle(controller, future, timeout=0.2)
    assert not controller.idle()  # stopped: never idle


async def test_work_run_beside_starts_once_synced_and_stops_with_the_workers(
    kube_cluster: TestCluster,
) -> None:
    name = provisioner_name(kube_cluster)
    controller = ProvisionController(
        kube_cluster.api_client, name, MemoryProvisioner({}), fast_options()
    )
    started, cancelled = asyncio.Event(), asyncio.Event()
    ready_when_started: list[bool] = []

    async def companion() -> None:
        ready_when_started.append(controller.ready())
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    controller.run_beside("companion", companion)
    with pytest.raises(ValueError, match="already runs beside"):
        controller.run_beside("companion", companion)
    async with running(controller):
        await eventually(started.is_set, message="the companion started")
        assert ready_when_started == [True]  # caches synced first
        assert not cancelled.is_set()
    assert cancelled.is_set()
    with pytest.raises(RuntimeError, match="register it before running"):
        controller.run_beside("late", companion)

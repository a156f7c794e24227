"""Health endpoints as upstream's sidecars serve them, with two replicas contending for one
Lease: ``/healthz/leader-election`` (client-go's leader-election health check, the liveness
path of upstream manifests) and ``/readyz`` Ready on the standby too, so a rolling update
that waits for the new replica to be Ready (``maxUnavailable: 0``) completes."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import aiohttp
import pytest
from provision_support import MemoryProvisioner, fast_options, provisioner_name

from pyprovlib.controller._leader_health import leader_renewal_overdue
from pyprovlib.controller._provision import ProvisionController
from pyprovlib.kube._leaderelection import format_micro_time
from pyprovlib.runtime import LeaderElected
from pyprovlib.runtime._http import HttpServer, controller_checks
from pyprovlib.testing import running
from pyprovlib.testing._cluster import TestCluster

pytestmark = pytest.mark.e2e

LEASE_DURATION = 2.0


def leader_options(cluster: TestCluster) -> dict[str, object]:
    return {
        "leader_election": True,
        "leader_election_namespace": cluster.namespace,
        "lease_duration": LEASE_DURATION,
        "renew_deadline": 1.5,
        "retry_period": 0.2,
    }


@contextlib.asynccontextmanager
async def serving(controller: ProvisionController) -> AsyncIterator[str]:
    healthz, readyz = controller_checks(controller)
    async with HttpServer("127.0.0.1:0", healthz=healthz, readyz=readyz) as server:
        yield server.url


async def get(session: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    async with session.get(url) as resp:
        return resp.status, await resp.text()


async def test_the_standby_is_ready_and_both_replicas_pass_the_leader_election_check(
    kube_cluster: TestCluster,
) -> None:
    name = provisioner_name(kube_cluster)
    controllers = [
        ProvisionController(
            kube_cluster.api_client,
            name,
            MemoryProvisioner(),
            fast_options(**leader_options(kube_cluster)),
        )
        for _ in range(2)
    ]
    assert all(isinstance(c, LeaderElected) for c in controllers)
    async with (
        running(controllers[0]),
        running(controllers[1]),
        serving(controllers[0]) as url0,
        serving(controllers[1]) as url1,
        aiohttp.ClientSession() as session,
    ):

        async def leader_and_standby() -> bool:
            return sorted((c.ready(), c.standing_by()) for c in controllers) == [
                (False, True),
                (True, False),
            ]

        await kube_cluster.wait_for(leader_and_standby, message="one leader, one standby")
        leader, standby = (0, 1) if controllers[0].ready() else (1, 0)
        urls = [url0, url1]

        # Leadership is not readiness: the standby is Ready, as the leader is.
        assert await get(session, f"{urls[standby]}/readyz") == (200, "ok")
        assert await get(session, f"{urls[leader]}/readyz") == (200, "ok")
        # Upstream's liveness path answers on both, and /healthz includes the check.
        for url in urls:
            assert await get(session, f"{url}/healthz/leader-election") == (200, "ok")
            status, body = await get(session, f"{url}/healthz?verbose")
            assert status == 200
            assert "[+]leader-election ok" in body.splitlines()

        # client-go's check: a leader whose last renewal is older than the lease duration
        # plus the timeout is unhealthy; a standby never is. (A negative timeout makes the
        # fresh renewal "overdue", exercising the real Lease record and clock.)
        reason = controllers[leader].leader_election_check(-LEASE_DURATION - 1)
        assert reason is not None
        assert "failed election to renew leadership on lease" in reason
        assert kube_cluster.namespace in reason
        assert controllers[standby].leader_election_check(-LEASE_DURATION - 1) is None
        assert controllers[leader].leader_election_check(20.0) is None

        async with HttpServer(
            "127.0.0.1:0",
            healthz={
                "leader-election": lambda: controllers[leader].leader_election_check(
                    -LEASE_DURATION - 1
                )
            },
        ) as overdue:
            status, body = await get(session, f"{overdue.url}/healthz/leader-election")
            assert status == 500
            assert "[-]leader-election failed: failed election to renew leadership" in body

        # A stopping standby is no longer Ready.
        controllers[standby].stop()
        status, _ = await get(session, f"{urls[standby]}/readyz")
        assert status == 503


async def test_without_leader_election_the_check_passes(kube_cluster: TestCluster) -> None:
    controller = ProvisionController(
        kube_cluster.api_client,
        provisioner_name(kube_cluster),
        MemoryProvisioner(),
        fast_options(),
    )
    async with (
        running(controller),
        serving(controller) as url,
        aiohttp.ClientSession() as session,
    ):
        assert await get(session, f"{url}/healthz/leader-election") == (200, "ok")
        assert not controller.standing_by()
        assert controller.leader_election_check(-100.0) is None


def test_renewal_overdue_compares_the_renew_time_with_the_tolerance() -> None:
    now = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
    fresh = format_micro_time(now - timedelta(seconds=30))
    assert leader_renewal_overdue(fresh, now, 35.0, "ns/lease") is None
    reason = leader_renewal_overdue(fresh, now, 29.0, "ns/lease")
    assert reason == "failed election to renew leadership on lease ns/lease (30s ago)"
    assert "no valid renewTime" in str(leader_renewal_overdue("", now, 35.0, "ns/lease"))

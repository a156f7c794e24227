"""Leader election around the ProvisionController (upstream's Run with resourcelock Leases), a
shared informer factory passed in (upstream's TestControllerSharedInformers) and the metrics
endpoint the controller can serve itself (upstream's MetricsPort)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
from collections.abc import Awaitable, Callable

import aiohttp
import pytest
from claim_support import create_claim
from provision_support import (
    MemoryProvisioner,
    create_class,
    fast_options,
    kill,
    provisioner_name,
    wait_ready,
)
from task_support import informers_running

from pyprovlib.controller._provision import LeaderElectionLostError, ProvisionController
from pyprovlib.kube._informer import SharedInformerFactory
from pyprovlib.kube._resources import LEASES
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.testing import eventually, running, wait_bound
from pyprovlib.testing._cluster import TestCluster

pytestmark = pytest.mark.e2e


def leader_options(cluster: TestCluster) -> dict[str, object]:
    return {
        "leader_election": True,
        "leader_election_namespace": cluster.namespace,
        "lease_duration": 2.0,
        "renew_deadline": 1.5,
        "retry_period": 0.2,
    }


async def test_only_the_leader_provisions_and_a_follower_takes_over(
    kube_cluster: TestCluster,
) -> None:
    name = provisioner_name(kube_cluster)
    class_name = await create_class(kube_cluster, name)
    backends = [MemoryProvisioner(), MemoryProvisioner()]
    controllers = [
        ProvisionController(
            kube_cluster.api_client, name, p, fast_options(**leader_options(kube_cluster))
        )
        for p in backends
    ]
    async with running(controllers[0]), running(controllers[1]):

        async def one_leader() -> bool:
            return sum(c.ready() for c in controllers) == 1

        await kube_cluster.wait_for(one_leader, message="one leader elected")
        leader = 0 if controllers[0].ready() else 1
        follower = 1 - leader
        lease = await ResourceClient(kube_cluster.api_client, LEASES).get(
            name.replace("/", "-"), kube_cluster.namespace
        )
        assert lease["spec"]["holderIdentity"] == controllers[leader].id

        claims = [await create_claim(kube_cluster, class_name) for _ in range(3)]
        for claim in claims:
            await wait_bound(kube_cluster, claim["metadata"]["name"])
        assert len(backends[leader].calls) == 3
        assert backends[follower].calls == []
        assert not controllers[follower].ready()

        # The leader stops (releasing the lease): the follower takes over.
        controllers[leader].stop()
        await wait_ready(kube_cluster, controllers[follower])
        later = await create_claim(kube_cluster, class_name)
        await wait_bound(kube_cluster, later["metadata"]["name"])
        assert [c.pvc.metadata.name for c in backends[follower].calls] == [
            later["metadata"]["name"]
        ]
        assert controllers[follower].healthy()
        assert controllers[leader].healthy()


async def test_shared_informer_factory_is_started_by_its_owner(kube_cluster: TestCluster) -> None:
    name = provisioner_name(kube_cluster)
    class_name = await create_class(kube_cluster, name)
    factory = SharedInformerFactory(kube_cluster.api_client)
    provisioner = MemoryProvisioner()
    controller = ProvisionController(
        kube_cluster.api_client, name, provisioner, fast_options(), informer_factory=factory
    )
    assert {i.name for i in factory.informers} == {
        "persistentvolumeclaims",
        "persistentvolumes",
        "storageclasses",
    }

    # The owner (the test) runs and stops the informers; the controller never starts them.
    async with informers_running(factory), running(controller):
        claim = await create_claim(kube_cluster, class_name)
        await wait_bound(kube_cluster, claim["metadata"]["name"])
        assert all(informer.has_synced() for informer in factory.informers)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def test_controller_serves_its_metrics(kube_cluster: TestCluster) -> None:
    name = provisioner_name(kube_cluster)
    class_name = await create_class(kube_cluster, name)
    async with contextlib.AsyncExitStack() as stack:
        # metrics_port=0 means "off", so the test picks a free port; another process may take
        # it before the controller binds it, so a taken port is picked again.
        for _ in range(5):
            port = _free_port()
            controller = ProvisionController(
                kube_cluster.api_client,
                name,
                MemoryProvisioner(),
                fast_options(metrics_port=port, metrics_address="127.0.0.1", metrics_path="/m"),
            )
            try:
                await stack.enter_async_context(running(controller, ready=True))
            except OSError as err:
                if err.errno != errno.EADDRINUSE:
                    raise
                continue
            break
        else:
            pytest.fail("no free port for the metrics server in five tries")
        claim = await create_claim(kube_cluster, class_name)
        await wait_bound(kube_cluster, claim["metadata"]["name"])

        async def scraped() -> str | None:
            try:
                async with (
                    aiohttp.ClientSession() as session,
                    session.get(f"http://127.0.0.1:{port}/m") as response,
                ):
                    text = await response.text()
            except aiohttp.ClientError:
                return None
            wanted = f'controller_persistentvolumeclaim_provision_total{{class="{class_name}"'
            return text if wanted in text else None

        await kube_cluster.wait_for(scraped, message="metrics served")

        # The same server as the runtime's: health and readiness beside the metrics.
        async with aiohttp.ClientSession() as session:
            for path in ("/healthz", "/healthz/leader-election", "/readyz"):
                async with session.get(f"http://127.0.0.1:{port}{path}") as response:
                    assert (path, response.status, await response.text()) == (path, 200, "ok")
    # Served while the controller runs, not after.
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientConnectionError):
            await session.get(f"http://127.0.0.1:{port}/healthz")


async def test_an_unusable_metrics_address_fails_run_plainly(kube_cluster: TestCluster) -> None:
    name = provisioner_name(kube_cluster)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        controller = ProvisionController(
            kube_cluster.api_client,
            name,
            MemoryProvisioner(),
            fast_options(metrics_port=port, metrics_address="127.0.0.1"),
        )
        # The OSError itself, not an ExceptionGroup around it, and before any work is taken.
        with pytest.raises(OSError, match=r"(?i)address already in use"):
            async with asyncio.timeout(10):
                await controller.run()
    assert not controller.healthy()


async def test_a_follower_stops_without_ever_leading(kube_cluster: TestCluster) -> None:
    name = provisioner_name(kube_cluster)
    options = leader_options(kube_cluster)
    leader = ProvisionController(
        kube_cluster.api_client, name, MemoryProvisioner(), fast_options(**options)
    )
    follower_backend = MemoryProvisioner()
    follower = ProvisionController(
        kube_cluster.api_client, name, follower_backend, fast_options(**options)
    )
    async with running(leader):
        await wait_ready(kube_cluster, leader)
        task = asyncio.create_task(follower.run())
        # Contending for the Lease held by the leader: it has seen the holder and tried again.
        await eventually(
            lambda: follower.standing_by() and follower.lease_attempts >= 2,
            timeout=10,
            message="the follower contending for the Lease",
        )
        assert not follower.ready()
        follower.stop()
        async with asyncio.timeout(5):
            await task
        assert follower.healthy()
        assert leader.ready()
    assert follower_backend.calls == []


async def test_a_lease_taken_by_another_holder_fails_the_controller(
    kube_cluster: TestCluster,
) -> None:
    """The Lease is taken over behind the leader's back (as an operator, or a replica that
    saw it expire, would): its next renewal sees another holder and the controller stops
    with LeaderElectionLostError. Runs on a real control plane too."""

    async def taken_over(lease: str) -> None:
        # A merge patch: no resourceVersion to race the controller's renewals with.
        await ResourceClient(kube_cluster.api_client, LEASES).patch(
            lease,
            {"spec": {"holderIdentity": "someone-else", "leaseDurationSeconds": 3600}},
            namespace=kube_cluster.namespace,
        )

    await leader_fails_on_losing_its_lease(kube_cluster, taken_over)


async def leader_fails_on_losing_its_lease(
    cluster: TestCluster, lose: Callable[[str], Awaitable[object]]
) -> None:
    """Run a leader-elected controller until it leads, ``lose(lease name)`` its lease: the
    controller must end with LeaderElectionLostError naming the lease, unhealthy, not ready."""
    name = provisioner_name(cluster)
    lease = name.replace("/", "-")
    controller = ProvisionController(
        cluster.api_client, name, MemoryProvisioner(), fast_options(**leader_options(cluster))
    )
    task = asyncio.create_task(controller.run())
    try:
        await wait_ready(cluster, controller)
        await lose(lease)
        with pytest.raises(LeaderElectionLostError, match=lease):
            async with asyncio.timeout(10):
                await task
        assert not controller.healthy()
        assert not controller.ready()
    finally:
        if not task.done():
            await kill(task)


async def test_losing_the_lease_fails_the_controller(kube_cluster: TestCluster) -> None:
    kube_cluster.require_in_memory(
        "makes the API server answer lease renewals with 500, which a real kube-apiserver "
        "cannot be made to do; test_a_lease_taken_by_another_holder_fails_the_controller "
        "covers losing the lease there"
    )
    server = kube_cluster.server
    assert server is not None

    async def renewals_fail(lease: str) -> None:
        server.faults.fail(500, resource="leases", count=None)

    try:
        await leader_fails_on_losing_its_lease(kube_cluster, renewals_fail)
    finally:
        server.faults.clear()

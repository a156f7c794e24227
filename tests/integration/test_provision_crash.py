"""Crash safety and graceful stop of the ProvisionController.

A controller killed (its task cancelled) after the backend created an asset but before the PV
was saved — while the provisioner still ran, or while the PV create was in flight — is replaced
by a new instance: the claim ends Bound with exactly one asset, because the PV name is
deterministic (``pvc-<claim uid>``) and provisioning is idempotent. A graceful stop lets the
operation in flight finish and saves its PV.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from claim_support import create_claim, delete_claim, get_volume
from kubernetes_asyncio.client import ApiClient, V1PersistentVolume
from provision_support import (
    MemoryProvisioner,
    controller_for,
    create_class,
    fast_options,
    kill,
    provisioner_name,
)

from pyprovlib._provisioner import ProvisionOptions
from pyprovlib.controller._provision import ProvisionController
from pyprovlib.kube._objects import Obj
from pyprovlib.kube._resources import PERSISTENT_VOLUMES
from pyprovlib.testing import eventually, running, wait_bound, wait_deleted, wait_event
from pyprovlib.testing._cluster import TestCluster
from pyprovlib.testing._netproxy import TcpProxy

pytestmark = pytest.mark.e2e


class HangingProvisioner(MemoryProvisioner):
    """Creates the asset, then never returns (a controller about to be killed)."""

    def __init__(self, assets: dict[str, Obj]) -> None:
        super().__init__(assets)
        self.asset_created = asyncio.Event()

    async def provision(self, options: ProvisionOptions) -> V1PersistentVolume:
        await super().provision(options)
        self.asset_created.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def killed_once(
    cluster: TestCluster,
    controller: ProvisionController,
    class_name: str,
    reached: Callable[[Obj], Awaitable[object]],
) -> tuple[Obj, str]:
    """Run ``controller``, create a claim and kill the controller (a crash) once
    ``reached(claim)`` returns. Returns the claim and its PV's name."""
    task = asyncio.create_task(controller.run())
    try:
        claim = await create_claim(cluster, class_name)
        async with asyncio.timeout(30):
            await reached(claim)
    finally:
        await kill(task)
    return claim, f"pvc-{claim['metadata']['uid']}"


@contextlib.asynccontextmanager
async def restarted_bound(
    cluster: TestCluster, name: str, backend: dict[str, Obj], claim: Obj, pv_name: str
) -> AsyncIterator[MemoryProvisioner]:
    """A new controller on the crashed one's ``backend``: the claim ends Bound to ``pv_name``
    with the one asset. The block runs with the controller running."""
    second = MemoryProvisioner(backend)
    restarted = ProvisionController(cluster.api_client, name, second, fast_options())
    async with running(restarted):
        bound = await wait_bound(cluster, claim["metadata"]["name"])
        assert bound["spec"]["volumeName"] == pv_name
        assert list(backend) == [pv_name]
        yield second


async def test_killed_while_the_provisioner_runs(kube_cluster: TestCluster) -> None:
    name = provisioner_name(kube_cluster)
    class_name = await create_class(kube_cluster, name)
    backend: dict[str, Obj] = {}
    first = HangingProvisioner(backend)
    controller = ProvisionController(kube_cluster.api_client, name, first, fast_options())
    claim, pv_name = await killed_once(
        kube_cluster, controller, class_name, lambda _claim: first.asset_created.wait()
    )
    assert list(backend) == [pv_name]
    assert await get_volume(kube_cluster.api_client, pv_name) is None

    async with restarted_bound(kube_cluster, name, backend, claim, pv_name) as second:
        assert [c.pv_name for c in second.calls] == [pv_name]
        await delete_claim(kube_cluster, claim["metadata"]["name"])
        await wait_deleted(kube_cluster, PERSISTENT_VOLUMES, pv_name)
        assert backend == {}


async def test_killed_while_the_pv_is_being_saved(kube_cluster: TestCluster) -> None:
    kube_cluster.require_in_memory(
        "holds the PV create inside the API server, which a real kube-apiserver cannot be made "
        "to do; test_killed_while_the_pv_create_is_lost_in_the_network covers it there"
    )
    server = kube_cluster.server
    assert server is not None
    name = provisioner_name(kube_cluster)
    class_name = await create_class(kube_cluster, name)
    backend: dict[str, Obj] = {}
    first = MemoryProvisioner(backend)
    controller = ProvisionController(kube_cluster.api_client, name, first, fast_options())
    server.faults.latency(30.0, verb="create", resource="persistentvolumes", count=1)

    async def saving(claim: Obj) -> None:
        pv_name = f"pvc-{claim['metadata']['uid']}"

        async def in_flight() -> bool:
            return pv_name in backend and server.requests.count("create", "persistentvolumes") >= 1

        await kube_cluster.wait_for(in_flight, message="asset created and PV create in flight")

    claim, pv_name = await killed_once(kube_cluster, controller, class_name, saving)
    assert await get_volume(kube_cluster.api_client, pv_name) is None

    async with restarted_bound(kube_cluster, name, backend, claim, pv_name):
        pass


class PartitioningProvisioner(MemoryProvisioner):
    """Creates the asset, then cuts the controller off from the API server before handing the
    PV back: the controller's PV create goes into a network black hole."""

    def __init__(self, assets: dict[str, Obj], proxy: TcpProxy) -> None:
        super().__init__(assets)
        self.proxy = proxy
        self.cut = asyncio.Event()

    async def provision(self, options: ProvisionOptions) -> V1PersistentVolume:
        volume = await super().provision(options)
        self.proxy.partition("blackhole")
        self.cut.set()
        return volume


async def test_killed_while_the_pv_create_is_lost_in_the_network(
    kube_cluster: TestCluster,
) -> None:
    """The controller reaches the API server through a TCP proxy that turns into a black hole
    right after the asset is created: the PV create never arrives, the controller is killed
    while it waits for the answer, and a new instance finishes with the one asset. Needs no
    fault injection in the server, so it runs on a real control plane as well."""
    name = provisioner_name(kube_cluster)
    class_name = await create_class(kube_cluster, name)
    backend: dict[str, Obj] = {}
    config = copy.deepcopy(kube_cluster.api_client.configuration)
    assert config.host is not None
    target = urllib.parse.urlsplit(config.host)
    assert target.hostname is not None
    assert target.port is not None
    async with TcpProxy(target.hostname, target.port) as proxy:
        config.host = f"{target.scheme}://{target.hostname}:{proxy.port}"
        async with ApiClient(configuration=config) as proxied:
            first = PartitioningProvisioner(backend, proxy)
            controller = ProvisionController(proxied, name, first, fast_options())
            claim, pv_name = await killed_once(
                kube_cluster, controller, class_name, lambda _claim: first.cut.wait()
            )
    assert list(backend) == [pv_name]
    assert await get_volume(kube_cluster.api_client, pv_name) is None

    async with restarted_bound(kube_cluster, name, backend, claim, pv_name):
        pass


async def test_graceful_stop_finishes_the_operation_in_flight(kube_cluster: TestCluster) -> None:

    class Gated(MemoryProvisioner):
        def __init__(self) -> None:
            super().__init__()
            self.entered = asyncio.Event()
            self.gate = asyncio.Event()

        async def provision(self, options: ProvisionOptions) -> V1PersistentVolume:
            self.entered.set()
            await self.gate.wait()
            return await super().provision(options)

    provisioner = Gated()
    controller, class_name = await controller_for(kube_cluster, provisioner)
    task = asyncio.create_task(controller.run())
    try:
        claim = await create_claim(kube_cluster, class_name)
        async with asyncio.timeout(30):
            await provisioner.entered.wait()
        controller.stop()
        assert not controller.ready()
        await eventually(controller.draining, timeout=10, message="stop waiting for the worker")
        assert not task.done(), "run() returned with an operation still in flight"
        provisioner.gate.set()
        async with asyncio.timeout(20):
            await task
    finally:
        if not task.done():
            await kill(task)
    assert controller.healthy()
    pv = await get_volume(kube_cluster.api_client, f"pvc-{claim['metadata']['uid']}")
    assert pv is not None
    # A new claim is not picked up any more: once the PV controller has seen it (and waits
    # for an external provisioner), the stopped controller would have been told of it too.
    later = await create_claim(kube_cluster, class_name)
    await wait_event(kube_cluster, later["metadata"]["name"], "ExternalProvisioning")
    assert all(c.pvc.metadata.uid != later["metadata"]["uid"] for c in provisioner.calls)


async def test_a_controller_runs_only_once(kube_cluster: TestCluster) -> None:
    controller = ProvisionController(
        kube_cluster.api_client, provisioner_name(kube_cluster), MemoryProvisioner(), fast_options()
    )
    async with running(controller):
        await asyncio.sleep(0)
        with pytest.raises(RuntimeError, match="only once"):
            await controller.run()

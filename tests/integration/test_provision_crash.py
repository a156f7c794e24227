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

import pytest
from kubernetes_asyncio.client import ApiClient, V1PersistentVolume
from test_provision_e2e import (
    MemoryProvisioner,
    create_claim,
    create_class,
    delete_claim,
    fast_options,
    get_volume,
    provisioner_name,
    running,
    wait_bound,
    wait_gone,
)

from pyprovlib.controller.provision import ProvisionController
from pyprovlib.kube.objects import Obj
from pyprovlib.provisioner import ProvisionOptions
from pyprovlib.testing.cluster import TestCluster
from pyprovlib.testing.netproxy import TcpProxy

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


async def kill(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def test_killed_while_the_provisioner_runs(kube_cluster: TestCluster) -> None:
    name = provisioner_name(kube_cluster)
    class_name = await create_class(kube_cluster, name)
    backend: dict[str, Obj] = {}
    first = HangingProvisioner(backend)
    controller = ProvisionController(kube_cluster.api_client, name, first, fast_options())
    task = asyncio.create_task(controller.run())
    try:
        claim = await create_claim(kube_cluster, class_name)
        async with asyncio.timeout(30):
            await first.asset_created.wait()
    finally:
        await kill(task)
    pv_name = f"pvc-{claim['metadata']['uid']}"
    assert list(backend) == [pv_name]
    assert await get_volume(kube_cluster.api_client, pv_name) is None

    second = MemoryProvisioner(backend)
    restarted = ProvisionController(kube_cluster.api_client, name, second, fast_options())
    async with running(restarted):
        bound = await wait_bound(kube_cluster, claim["metadata"]["name"])
        assert bound["spec"]["volumeName"] == pv_name
        assert list(backend) == [pv_name]
        assert [c.pv_name for c in second.calls] == [pv_name]
        await delete_claim(kube_cluster, claim["metadata"]["name"])
        await wait_gone(kube_cluster.api_client, kube_cluster, pv_name)
        assert backend == {}


async def test_killed_while_the_pv_is_being_saved(kube_cluster: TestCluster) -> None:
    kube_cluster.require_in_memory(
        "holds the PV create inside the API server, which a real kube-apiserver cannot be made "
        "to do; test_killed_while_the_pv_create_is_lost_in_the_network covers it there"
    )
    server = kube_cluster.server
    name = provisioner_name(kube_cluster)
    class_name = await create_class(kube_cluster, name)
    backend: dict[str, Obj] = {}
    first = MemoryProvisioner(backend)
    controller = ProvisionController(kube_cluster.api_client, name, first, fast_options())
    server.faults.latency(30.0, verb="create", resource="persistentvolumes", count=1)
    task = asyncio.create_task(controller.run())
    try:
        claim = await create_claim(kube_cluster, class_name)
        pv_name = f"pvc-{claim['metadata']['uid']}"

        async def saving() -> bool:
            return pv_name in backend and server.requests.count("create", "persistentvolumes") >= 1

        await kube_cluster.wait_for(saving, message="asset created and PV create in flight")
    finally:
        await kill(task)
    assert await get_volume(kube_cluster.api_client, pv_name) is None

    second = MemoryProvisioner(backend)
    restarted = ProvisionController(kube_cluster.api_client, name, second, fast_options())
    async with running(restarted):
        await wait_bound(kube_cluster, claim["metadata"]["name"])
        assert list(backend) == [pv_name]


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
    target = urllib.parse.urlsplit(config.host)
    assert target.hostname is not None
    assert target.port is not None
    async with TcpProxy(target.hostname, target.port) as proxy:
        config.host = f"{target.scheme}://{target.hostname}:{proxy.port}"
        async with ApiClient(configuration=config) as proxied:
            first = PartitioningProvisioner(backend, proxy)
            controller = ProvisionController(proxied, name, first, fast_options())
            task = asyncio.create_task(controller.run())
            try:
                claim = await create_claim(kube_cluster, class_name)
                async with asyncio.timeout(30):
                    await first.cut.wait()
            finally:
                await kill(task)
    pv_name = f"pvc-{claim['metadata']['uid']}"
    assert list(backend) == [pv_name]
    assert await get_volume(kube_cluster.api_client, pv_name) is None

    second = MemoryProvisioner(backend)
    restarted = ProvisionController(kube_cluster.api_client, name, second, fast_options())
    async with running(restarted):
        bound = await wait_bound(kube_cluster, claim["metadata"]["name"])
        assert bound["spec"]["volumeName"] == pv_name
        assert list(backend) == [pv_name]


async def test_graceful_stop_finishes_the_operation_in_flight(kube_cluster: TestCluster) -> None:
    name = provisioner_name(kube_cluster)
    class_name = await create_class(kube_cluster, name)

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
    controller = ProvisionController(kube_cluster.api_client, name, provisioner, fast_options())
    task = asyncio.create_task(controller.run())
    try:
        claim = await create_claim(kube_cluster, class_name)
        async with asyncio.timeout(30):
            await provisioner.entered.wait()
        controller.stop()
        assert not controller.ready()
        await asyncio.sleep(0.1)
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
    # A new claim is not picked up any more.
    later = await create_claim(kube_cluster, class_name)
    await asyncio.sleep(0.2)
    assert all(c.pvc.metadata.uid != later["metadata"]["uid"] for c in provisioner.calls)


async def test_a_controller_runs_only_once(kube_cluster: TestCluster) -> None:
    controller = ProvisionController(
        kube_cluster.api_client, provisioner_name(kube_cluster), MemoryProvisioner(), fast_options()
    )
    async with running(controller):
        await asyncio.sleep(0)
        with pytest.raises(RuntimeError, match="only once"):
            await controller.run()

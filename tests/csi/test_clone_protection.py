"""Cloning protection end to end: the ``provisioner.storage.kubernetes.io/cloning-protection``
finalizer the CSIProvisioner puts on a source claim before it clones it, and the
CloningProtectionController that takes it off once no clone of the source is in flight. A
source whose deletion is requested meanwhile stays, Terminating, until its clones are done or
abandoned — across a restart too — and then goes. Runs in memory, on a real control plane
(``PYPROVLIB_KUBE_ASSETS``) or cluster, and with the Go hostpathplugin as the driver."""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
from collections.abc import AsyncIterator
from typing import Any

import claim_support
import pytest
from claim_support import class_body
from csi_driver import DriverState, Fault
from csi_e2e import (
    Env,
    create_claim,
    create_class,
    csi_env,
    get_claim,
    get_volume,
    go_hostpath,
    wait_bound,
    wait_event,
    wait_until,
)
from grpclib.const import Status
from prometheus_client import CollectorRegistry
from task_support import informers_running

from pyprovlib import testing
from pyprovlib._logging import get_logger
from pyprovlib.csi.provisioner._clone_controller import CloningProtectionController
from pyprovlib.csi.provisioner._data_source import CLONE_FINALIZER, SourceGuard
from pyprovlib.kube._informer import SharedInformerFactory
from pyprovlib.kube._objects import Obj
from pyprovlib.kube._resources import CSINODES, PERSISTENT_VOLUME_CLAIMS, STORAGE_CLASSES
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.kube._workqueue import ItemExponentialFailureRateLimiter
from pyprovlib.testing._cluster import TestCluster

pytestmark = pytest.mark.e2e


def protected(claim: Obj | None) -> bool:
    return claim is not None and CLONE_FINALIZER in (claim["metadata"].get("finalizers") or [])


def clone_of(name: str) -> Obj:
    """A claim's ``dataSource`` naming the claim ``name``."""
    return {"kind": "PersistentVolumeClaim", "name": name}


async def wait_protected(cluster: TestCluster, name: str) -> None:
    async def check() -> bool:
        return protected(await claim_support.get_claim(cluster, name))

    await cluster.wait_for(check, message=f"cloning-protection finalizer on claim {name}")


async def wait_claim_gone(cluster: TestCluster, name: str) -> None:
    async def gone() -> bool:
        return await claim_support.get_claim(cluster, name) is None

    await cluster.wait_for(gone, message=f"claim {name} deleted")


async def delete(cluster: TestCluster, name: str) -> Obj:
    """Delete the claim ``name``; the claim as the deletion left it (finalizers hold it)."""
    claims = ResourceClient(cluster.api_client, PERSISTENT_VOLUME_CLAIMS)
    left = await claims.delete(name, cluster.namespace)
    assert left is not None, f"claim {name} went at once: nothing held it"
    assert left["kind"] == "PersistentVolumeClaim"  # what wait_idle needs to find its cache
    return left


async def assert_terminating_and_protected(
    cluster: TestCluster, controller: CloningProtectionController | None, deleted: Obj
) -> None:
    assert controller is not None
    # The controller has seen the deletion and done what it causes: the point after which
    # "the finalizer was not removed" holds.
    await testing.wait_idle(controller, deleted)
    current = await claim_support.get_claim(cluster, deleted["metadata"]["name"])
    assert current is not None, "the source went while a clone of it was in flight"
    assert current["metadata"].get("deletionTimestamp")
    assert protected(current)


async def bound_source(env: Env, class_name: str) -> str:
    source = await create_claim(env, class_name, size="1Gi")
    name: str = source["metadata"]["name"]
    await wait_bound(env, name)
    return name


# -- with the provisioner ---------------------------------------------------------------------


async def test_a_source_deleted_while_a_clone_is_in_flight_stays_until_the_clone_is_done(
    kube_cluster: TestCluster, sock_dir: pathlib.Path
) -> None:
    async with csi_env(kube_cluster, sock_dir) as env:
        class_name = await create_class(env)
        source = await bound_source(env, class_name)
        gate = asyncio.Event()  # every CreateVolume waits until the test opens it
        env.driver.fail("CreateVolume", Fault(gate=gate, times=10**6))
        clone = await create_claim(env, class_name, dataSource=clone_of(source))
        await wait_protected(kube_cluster, source)

        deleted = await delete(kube_cluster, source)
        await assert_terminating_and_protected(kube_cluster, env.cloning_protection, deleted)

        gate.set()
        await wait_bound(env, clone["metadata"]["name"])
        await wait_claim_gone(kube_cluster, source)
        request = env.driver.requests("CreateVolume")[-1]
        assert request.volume_content_source is not None


async def pending_clone_of_deleted(env: Env, class_name: str, source: str, refusal: str) -> str:
    """A clone of ``source`` the driver refuses (an event saying ``refusal``), so it stays
    Pending; then ``source`` deleted, which it keeps terminating and protected. The clone's
    name."""
    clone = await create_claim(env, class_name, dataSource=clone_of(source))
    clone_name: str = clone["metadata"]["name"]
    await wait_event(env, clone_name, "ProvisioningFailed", refusal)
    await wait_protected(env.cluster, source)
    deleted = await delete(env.cluster, source)
    await assert_terminating_and_protected(env.cluster, env.cloning_protection, deleted)
    return clone_name


@pytest.mark.parametrize("provisioning_finalizer", [False, True], ids=["plain", "protected"])
async def test_an_abandoned_clone_releases_its_source(
    kube_cluster: TestCluster, sock_dir: pathlib.Path, provisioning_finalizer: bool
) -> None:
    async with csi_env(
        kube_cluster, sock_dir, provisioning_finalizer=provisioning_finalizer
    ) as env:
        class_name = await create_class(env)
        source = await bound_source(env, class_name)
        # The driver refuses every clone: the clone stays Pending, retried.
        env.driver.fail("CreateVolume", Fault(status=Status.INTERNAL, times=10**6))
        clone_name = await pending_clone_of_deleted(env, class_name, source, "injected failure")

        await ResourceClient(kube_cluster.api_client, PERSISTENT_VOLUME_CLAIMS).delete(
            clone_name, kube_cluster.namespace
        )
        await wait_claim_gone(kube_cluster, source)
        await wait_claim_gone(kube_cluster, clone_name)


@pytest.mark.parametrize("while_down", ["nothing", "clone-deleted"])
async def test_a_restart_mid_clone_keeps_then_removes_the_finalizer(
    kube_cluster: TestCluster, sock_dir: pathlib.Path, while_down: str
) -> None:
    # One process stops while a clone of a source being deleted is in flight; the next one
    # finishes the clone (a clone that existed before the deletion may still be made) or, if
    # the clone was deleted meanwhile, releases the source at once.
    state = DriverState(name=f"{kube_cluster.unique_name('test')}.csi.pyprovlib.io")
    async with csi_env(kube_cluster, sock_dir, state=state, call_timeout=0.5) as env:
        class_name = await create_class(env)
        source = await bound_source(env, class_name)
        gate = asyncio.Event()  # never opened: the first process never finishes the clone
        env.driver.fail("CreateVolume", Fault(gate=gate, times=10**6))
        clone = await create_claim(env, class_name, dataSource=clone_of(source))
        clone_name = clone["metadata"]["name"]
        await wait_protected(kube_cluster, source)
        deleted = await delete(kube_cluster, source)
        await assert_terminating_and_protected(kube_cluster, env.cloning_protection, deleted)
    state.faults.clear()
    assert protected(await get_claim(env, source))
    if while_down == "clone-deleted":
        await ResourceClient(kube_cluster.api_client, PERSISTENT_VOLUME_CLAIMS).delete(
            clone_name, kube_cluster.namespace
        )
        await wait_claim_gone(kube_cluster, clone_name)

    async with csi_env(kube_cluster, sock_dir, state=state) as env:
        if while_down == "nothing":
            bound = await wait_bound(env, clone_name)
            pv = await get_volume(env, bound["spec"]["volumeName"])
            assert pv is not None
            [volume] = [v for v in state.volumes.values() if v.source is not None]
            assert pv["spec"]["csi"]["volumeHandle"] == volume.volume_id
        await wait_claim_gone(kube_cluster, source)
    if while_down == "clone-deleted":
        assert not [v for v in state.volumes.values() if v.source is not None]


async def test_a_clone_of_a_source_being_deleted_created_after_the_deletion_is_refused(
    kube_cluster: TestCluster, sock_dir: pathlib.Path
) -> None:
    async with csi_env(kube_cluster, sock_dir) as env:
        class_name = await create_class(env)
        source = await bound_source(env, class_name)
        gate = asyncio.Event()
        env.driver.fail("CreateVolume", Fault(gate=gate, times=10**6))
        first = await create_claim(env, class_name, dataSource=clone_of(source))
        await wait_protected(kube_cluster, source)
        deleted = await delete(kube_cluster, source)
        # The API's times have whole seconds: the late clone is made a second later.
        deletion = deleted["metadata"]["deletionTimestamp"]

        async def next_second() -> bool:
            probe = await create_claim(env, "no-such-class")
            created: str = probe["metadata"]["creationTimestamp"]
            return created > deletion

        await kube_cluster.wait_for(next_second, message="a creation time after the deletion")
        late = await create_claim(env, class_name, dataSource=clone_of(source))
        await wait_event(env, late["metadata"]["name"], "ProvisioningFailed", "being deleted")

        gate.set()
        await wait_bound(env, first["metadata"]["name"])
        # The late clone, still Pending, does not hold the source.
        await wait_claim_gone(kube_cluster, source)
        current = await get_claim(env, late["metadata"]["name"])
        assert current is not None
        assert current["status"]["phase"] == "Pending"


# -- the controller alone ---------------------------------------------------------------------


@contextlib.asynccontextmanager
async def cloning_protection(cluster: TestCluster) -> AsyncIterator[CloningProtectionController]:
    """A CloningProtectionController on informers of its own (no provisioner runs: the
    clones it looks at name a class that does not exist, so they stay Pending)."""
    api = cluster.api_client
    factory = SharedInformerFactory(api)
    guard = SourceGuard(
        ResourceClient(api, PERSISTENT_VOLUME_CLAIMS),
        CLONE_FINALIZER,
        "clone source claim",
        get_logger("test"),
    )
    controller = CloningProtectionController(
        guard,
        factory,
        workers=2,
        rate_limiter=ItemExponentialFailureRateLimiter(0.01, 0.2),
        registry=CollectorRegistry(),
    )
    async with informers_running(factory), testing.running(controller):
        yield controller


async def test_the_finalizer_goes_with_the_last_clone_in_flight_even_across_a_restart(
    kube_cluster: TestCluster,
) -> None:
    cluster = kube_cluster
    claims = ResourceClient(cluster.api_client, PERSISTENT_VOLUME_CLAIMS)

    async def claim(**spec: Any) -> str:
        created = await claim_support.create_claim(cluster, "no-such-class", **spec)
        return str(created["metadata"]["name"])

    source, idle_source = await claim(), await claim()
    for name in (source, idle_source):
        await claims.patch(
            name, {"metadata": {"finalizers": [CLONE_FINALIZER]}}, namespace=cluster.namespace
        )
    first, second = (
        await claim(dataSource=clone_of(source)),
        await claim(dataSource=clone_of(source)),
    )
    async with cloning_protection(cluster) as controller:
        # A source no clone names loses the finalizer; one being cloned keeps it.
        async def idle_released() -> bool:
            return not protected(await get_claim_of(cluster, idle_source))

        await cluster.wait_for(idle_released, message="finalizer off the claim no clone names")
        deleted = await delete(cluster, source)
        await assert_terminating_and_protected(cluster, controller, deleted)
        await claims.delete(first, cluster.namespace)
        await wait_claim_gone(cluster, first)
        await assert_terminating_and_protected(cluster, controller, deleted)
    # The last clone goes while no controller runs; the next one releases the source.
    await claims.delete(second, cluster.namespace)
    await wait_claim_gone(cluster, second)
    assert protected(await get_claim_of(cluster, source))
    async with cloning_protection(cluster):
        await wait_claim_gone(cluster, source)
    await claims.patch(idle_source, {"metadata": {"finalizers": []}}, namespace=cluster.namespace)


async def get_claim_of(cluster: TestCluster, name: str) -> Obj | None:
    return await claim_support.get_claim(cluster, name)


# -- with the Go hostpathplugin ---------------------------------------------------------------

GI = 1024**3


async def test_clone_protection_with_the_go_hostpath_driver(
    kube_cluster: TestCluster, sock_dir: pathlib.Path, hostpathplugin_binary: pathlib.Path
) -> None:
    # The driver has room for two 1Gi volumes of its "fast" kind: with the source and a
    # filler there, it refuses the clone (ResourceExhausted), which stays Pending with its
    # source protected. The source's deletion waits; deleting the filler makes room, the
    # clone is made from the source's volume, and then the source goes.
    cluster = kube_cluster
    api = cluster.api_client
    name = f"{cluster.unique_name('hostpath')}.csi.pyprovlib.io"
    node = cluster.unique_name("node")
    async with go_hostpath(
        hostpathplugin_binary, sock_dir, name, node_id=node, extra_args=("--capacity=fast=2Gi",)
    ) as driver:
        cluster.track(CSINODES, node)
        await ResourceClient(api, CSINODES).create(
            {
                "apiVersion": "storage.k8s.io/v1",
                "kind": "CSINode",
                "metadata": {"name": node},
                "spec": {"drivers": [{"name": name, "nodeID": node}]},
            }
        )
        # Retried for as long as it fails, as the sidecar does (no failure threshold).
        async with csi_env(cluster, sock_dir, go=driver, failed_provision_threshold=0) as env:
            class_name = cluster.unique_name("sc")
            await ResourceClient(api, STORAGE_CLASSES).create(
                class_body(class_name, name, parameters={"kind": "fast"}, reclaimPolicy="Delete")
            )
            cluster.track(STORAGE_CLASSES, class_name)
            source = await bound_source(env, class_name)
            filler = await bound_source(env, class_name)
            source_pv = await get_volume(
                env, (await get_claim(env, source) or {})["spec"]["volumeName"]
            )
            assert source_pv is not None
            source_handle = source_pv["spec"]["csi"]["volumeHandle"]
            # What the clone must carry over: a file in the source volume's directory.
            marker = pathlib.Path(driver.volumes()[source_handle]["VolPath"]) / "marker"
            marker.write_text("from the source")

            clone_name = await pending_clone_of_deleted(
                env, class_name, source, "ResourceExhausted"
            )

            await ResourceClient(api, PERSISTENT_VOLUME_CLAIMS).delete(filler, cluster.namespace)
            bound = await wait_bound(env, clone_name, timeout=60.0)
            await wait_claim_gone(cluster, source)
            clone_pv = await get_volume(env, bound["spec"]["volumeName"])
            assert clone_pv is not None
            volume = driver.volumes()[clone_pv["spec"]["csi"]["volumeHandle"]]
            assert volume["VolSize"] == GI
            copied = pathlib.Path(volume["VolPath"]) / "marker"
            assert copied.read_text() == "from the source"

            # The source's volume goes with its claim (Delete), the clone stays.
            await wait_until(
                env,
                lambda: source_handle not in driver.volumes(),
                "the source's volume deleted",
                timeout=60.0,
            )


async def test_threads_is_the_deprecated_name_of_workers(kube_cluster: TestCluster) -> None:
    guard = SourceGuard(
        ResourceClient(kube_cluster.api_client, PERSISTENT_VOLUME_CLAIMS),
        CLONE_FINALIZER,
        "clone source claim",
        get_logger("test"),
    )
    factory = SharedInformerFactory(kube_cluster.api_client)
    with pytest.warns(DeprecationWarning, match=r"\(threads=\.\.\.\) is deprecated: use workers="):
        controller = CloningProtectionController(guard, factory, threads=3)
    assert controller.workers == 3
    with pytest.warns(DeprecationWarning, match="threads is deprecated: read workers"):
        assert controller.threads == 3
    with pytest.raises(ValueError, match="workers must be at least 1, not 0"):
        CloningProtectionController(guard, factory, workers=0)

"""The provisioning-protection finalizer (``provisioning_finalizer``): a claim deleted while
its volume is being created never leaks the volume, even when the controller is killed and
replaced meanwhile (kubernetes-csi/external-provisioner#486, which upstream leaves open).

Scenarios:

- the finalizer is on the claim while the provisioner runs and off once the claim is Bound;
  one add and one remove, and the claim is provisioned exactly once (the update our own patch
  causes must not provision it again);
- a claim deleted while the provisioner hangs, the controller killed, a new one started: the
  volume is finished and deleted, the claim goes, no PV is saved;
- the same with a Retain class: the PV is saved (the administrator's handle on the volume);
- a claim deleted while provisioning fails in the background: retried until the backend
  succeeds, then deleted;
- provisioning failing for good takes the finalizer off again;
- the StorageClass gone while a deleted claim waits: a ProvisioningCleanupFailed event naming
  the class and the finalizer; recreating the class finishes the clean-up;
- a claim deleted before its volume was requested is not provisioned at all;
- without the option no claim is ever written.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from claim_support import create_claim, delete_claim, get_claim, get_volume
from kubernetes_asyncio.client import V1PersistentVolume
from provision_support import (
    MemoryProvisioner,
    controller_for,
    create_class,
    fast_options,
    kill,
    provisioner_name,
)

from pyprovlib._provisioner import ProvisioningError, ProvisioningState, ProvisionOptions
from pyprovlib.controller._options import ProvisionControllerOptions
from pyprovlib.controller._provision import ANN_STORAGE_PROVISIONER, ProvisionController
from pyprovlib.controller._provision.protection import FINALIZER_PROVISIONING
from pyprovlib.kube._objects import Obj
from pyprovlib.kube._resources import (
    PERSISTENT_VOLUME_CLAIMS,
    PERSISTENT_VOLUMES,
    STORAGE_CLASSES,
)
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.testing import running, wait_bound, wait_deleted, wait_event
from pyprovlib.testing._cluster import TestCluster
from pyprovlib.testing._support import wait_idle

pytestmark = pytest.mark.e2e


def protected_options() -> ProvisionControllerOptions:
    return fast_options(provisioning_finalizer=True)


class GatedProvisioner(MemoryProvisioner):
    """Creates the asset, then waits for ``gate`` before returning (a slow backend)."""

    def __init__(self, assets: dict[str, Obj]) -> None:
        super().__init__(assets)
        self.asset_created = asyncio.Event()
        self.gate = asyncio.Event()
        self.finalizers_seen: list[list[str]] = []

    async def provision(self, options: ProvisionOptions) -> V1PersistentVolume:
        self.finalizers_seen.append(list(options.pvc.metadata.finalizers or []))
        volume = await super().provision(options)
        self.asset_created.set()
        await self.gate.wait()
        return volume


class FlakyProvisioner(MemoryProvisioner):
    """Creates the asset but reports IN_BACKGROUND until ``healthy`` is set."""

    def __init__(self, assets: dict[str, Obj]) -> None:
        super().__init__(assets)
        self.healthy = False

    async def provision(self, options: ProvisionOptions) -> V1PersistentVolume:
        volume = await super().provision(options)
        if not self.healthy:
            raise ProvisioningError("backend still busy", ProvisioningState.IN_BACKGROUND)
        return volume


class RefusingProvisioner(MemoryProvisioner):
    async def provision(self, options: ProvisionOptions) -> V1PersistentVolume:
        self.calls.append(options)
        raise ProvisioningError("no space left for this claim", ProvisioningState.FINISHED)


async def finalizers(cluster: TestCluster, name: str) -> list[str]:
    claim = await get_claim(cluster, name)
    assert claim is not None, f"claim {name} is gone"
    return list(claim["metadata"].get("finalizers") or [])


async def wait_released(cluster: TestCluster, name: str, why: str) -> None:
    """Wait until the claim ``name`` no longer carries our finalizer."""

    async def released() -> bool:
        return FINALIZER_PROVISIONING not in await finalizers(cluster, name)

    await cluster.wait_for(released, message=f"finalizer removed {why}")


@contextlib.asynccontextmanager
async def deleted_but_held(cluster: TestCluster, name: str) -> AsyncIterator[Obj]:
    """Delete the claim ``name`` while a finalizer of the test's holds it: the block sees it
    marked for deletion (and gets it, as read then); afterwards the hold is released and the
    claim is gone."""
    hold = "test.pyprovlib.io/hold"
    claims = ResourceClient(cluster.api_client, PERSISTENT_VOLUME_CLAIMS)

    async def patch(finalizers: Obj) -> None:
        await claims.patch(
            name, {"metadata": finalizers}, namespace=cluster.namespace, patch_type="strategic"
        )

    await patch({"finalizers": [hold]})
    try:
        await delete_claim(cluster, name)
        deleting = await get_claim(cluster, name)
        assert deleting is not None
        yield deleting
    finally:
        await patch({"$deleteFromPrimitiveList/finalizers": [hold]})
    await wait_deleted(cluster, PERSISTENT_VOLUME_CLAIMS, name)


async def delete_while_retried(
    cluster: TestCluster, class_name: str, provisioner: FlakyProvisioner
) -> tuple[str, str]:
    """Create a claim, wait until its provisioning failed in the background and was retried,
    then delete it. Returns (claim, PV name)."""
    claim = await create_claim(cluster, class_name)
    claim_name = claim["metadata"]["name"]

    async def retried() -> bool:
        return len(provisioner.calls) >= 2

    await cluster.wait_for(retried, message="provisioning retried")
    await delete_claim(cluster, claim_name)
    return claim_name, f"pvc-{claim['metadata']['uid']}"


async def delete_mid_provision(
    cluster: TestCluster, name: str, class_name: str, backend: dict[str, Obj]
) -> tuple[str, str]:
    """Run a controller until the backend created the asset of a new claim, delete the claim
    (the provisioner still running), then kill the controller. Returns (claim, PV name)."""
    first = GatedProvisioner(backend)
    controller = ProvisionController(cluster.api_client, name, first, protected_options())
    task = asyncio.create_task(controller.run())
    try:
        claim = await create_claim(cluster, class_name)
        claim_name = claim["metadata"]["name"]
        async with asyncio.timeout(30):
            await first.asset_created.wait()
        await delete_claim(cluster, claim_name)
        # Held by the finalizer: the claim stays, marked for deletion.
        held = await get_claim(cluster, claim_name)
        assert held is not None
        assert held["metadata"].get("deletionTimestamp")
    finally:
        await kill(task)
    pv_name = f"pvc-{claim['metadata']['uid']}"
    assert list(backend) == [pv_name]
    return claim_name, pv_name


async def restart_until_gone(
    cluster: TestCluster, name: str, backend: dict[str, Obj], claim_name: str
) -> MemoryProvisioner:
    """Start a new controller on ``backend`` and run it until the deleted claim is gone."""
    second = MemoryProvisioner(backend)
    restarted = ProvisionController(cluster.api_client, name, second, protected_options())
    async with running(restarted):
        await wait_deleted(cluster, PERSISTENT_VOLUME_CLAIMS, claim_name)
    return second


async def test_finalizer_held_while_provisioning_and_removed_once_bound(
    kube_cluster: TestCluster,
) -> None:
    provisioner = GatedProvisioner({})
    controller, class_name = await controller_for(kube_cluster, provisioner, protected_options())
    patches_before = (
        kube_cluster.server.requests.count("patch", "persistentvolumeclaims")
        if kube_cluster.server is not None
        else 0
    )
    async with running(controller):
        claim = await create_claim(kube_cluster, class_name)
        claim_name = claim["metadata"]["name"]
        async with asyncio.timeout(30):
            await provisioner.asset_created.wait()
        # The provisioner got the claim as saved with the finalizer, and it is on the claim.
        assert FINALIZER_PROVISIONING in provisioner.finalizers_seen[0]
        assert FINALIZER_PROVISIONING in await finalizers(kube_cluster, claim_name)
        provisioner.gate.set()
        await wait_bound(kube_cluster, claim_name)

        await wait_released(kube_cluster, claim_name, "after binding")
        # Once the updates our own patches caused are processed, count. In memory, the
        # binder (the PV controller) has made every write it would make first.
        latest = await get_claim(kube_cluster, claim_name)
        assert latest is not None
        binder = kube_cluster.server.binder if kube_cluster.server is not None else None
        if binder is not None:
            await wait_idle(binder, latest)
            latest = await get_claim(kube_cluster, claim_name)
            assert latest is not None
        await wait_idle(controller, latest)
        assert len(provisioner.calls) == 1, "the claim was provisioned more than once"
    if kube_cluster.server is not None:
        # One add and one remove: the binder's two writes (claim, then its status) both show
        # the finalizer and a volumeName, but only the first may cause a removal.
        patches = kube_cluster.server.requests.count("patch", "persistentvolumeclaims")
        assert patches - patches_before == 2


async def test_claim_deleted_while_provisioning_then_controller_killed(
    kube_cluster: TestCluster,
) -> None:
    name = provisioner_name(kube_cluster)
    class_name = await create_class(kube_cluster, name)
    backend: dict[str, Obj] = {}
    claim_name, pv_name = await delete_mid_provision(kube_cluster, name, class_name, backend)

    second = await restart_until_gone(kube_cluster, name, backend, claim_name)
    assert backend == {}, "the volume of the deleted claim leaked"
    assert second.deleted == [pv_name]
    assert [c.pv_name for c in second.calls] == [pv_name]
    assert await get_volume(kube_cluster.api_client, pv_name) is None


async def test_claim_deleted_while_provisioning_retain_class_keeps_a_pv(
    kube_cluster: TestCluster,
) -> None:
    name = provisioner_name(kube_cluster)
    class_name = await create_class(kube_cluster, name, reclaimPolicy="Retain")
    backend: dict[str, Obj] = {}
    claim_name, pv_name = await delete_mid_provision(kube_cluster, name, class_name, backend)
    kube_cluster.track(PERSISTENT_VOLUMES, pv_name)

    second = await restart_until_gone(kube_cluster, name, backend, claim_name)
    volume = await get_volume(kube_cluster.api_client, pv_name)
    assert volume is not None, "a Retain volume of a deleted claim must keep its PV"
    assert volume["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
    assert list(backend) == [pv_name]
    assert second.deleted == []


async def test_claim_deleted_while_provisioning_fails_in_the_background(
    kube_cluster: TestCluster,
) -> None:
    provisioner = FlakyProvisioner({})
    controller, class_name = await controller_for(kube_cluster, provisioner, protected_options())
    async with running(controller):
        claim_name, pv_name = await delete_while_retried(kube_cluster, class_name, provisioner)
        await wait_event(kube_cluster, claim_name, "ProvisioningFailed", "backend still busy")
        held = await get_claim(kube_cluster, claim_name)
        assert held is not None, "the claim went while its volume may still be created"
        assert pv_name in provisioner.assets
        provisioner.healthy = True
        await wait_deleted(kube_cluster, PERSISTENT_VOLUME_CLAIMS, claim_name)
    assert provisioner.assets == {}
    assert provisioner.deleted == [pv_name]
    assert await get_volume(kube_cluster.api_client, pv_name) is None


async def test_deleted_claim_is_cleaned_up_once_even_from_a_stale_cache(
    kube_cluster: TestCluster,
) -> None:
    """A worker may read the deleted claim from the informer cache after the controller
    released it (the DELETED event not processed yet): the volume, already deleted, must not be
    provisioned and deleted again."""
    provisioner = FlakyProvisioner({})
    controller, class_name = await controller_for(kube_cluster, provisioner, protected_options())
    async with running(controller):
        claim_name, pv_name = await delete_while_retried(kube_cluster, class_name, provisioner)
        stale = await get_claim(kube_cluster, claim_name)  # deleting, still protected
        assert stale is not None
        assert FINALIZER_PROVISIONING in stale["metadata"]["finalizers"]
        provisioner.healthy = True
        await wait_deleted(kube_cluster, PERSISTENT_VOLUME_CLAIMS, claim_name)
        # The claim is gone once the API server applied the worker's finalizer removal; the
        # worker records the clean-up only when its PATCH returns. A worker reading the stale
        # cache comes after that (the queue hands a key to one worker at a time): so does this.
        await wait_idle(controller)
        assert provisioner.deleted == [pv_name]
        calls = len(provisioner.calls)
        await controller.sync_claim(stale)  # what a worker reading the stale cache does
        assert len(provisioner.calls) == calls
    assert provisioner.deleted == [pv_name]
    assert provisioner.assets == {}


async def test_final_failure_releases_the_claim(kube_cluster: TestCluster) -> None:
    provisioner = RefusingProvisioner({})
    controller, class_name = await controller_for(kube_cluster, provisioner, protected_options())
    async with running(controller):
        claim = await create_claim(kube_cluster, class_name)
        claim_name = claim["metadata"]["name"]
        await wait_event(kube_cluster, claim_name, "ProvisioningFailed", "no space left")

        await wait_released(kube_cluster, claim_name, "after a final error")
        # Deleting it now needs nothing from the controller.
        controller.stop()
    await delete_claim(kube_cluster, claim_name)
    await wait_deleted(kube_cluster, PERSISTENT_VOLUME_CLAIMS, claim_name)


async def test_class_gone_while_a_deleted_claim_waits(kube_cluster: TestCluster) -> None:
    name = provisioner_name(kube_cluster)
    class_name = await create_class(kube_cluster, name)
    backend: dict[str, Obj] = {}
    claim_name, pv_name = await delete_mid_provision(kube_cluster, name, class_name, backend)
    await ResourceClient(kube_cluster.api_client, STORAGE_CLASSES).delete(class_name)

    second = MemoryProvisioner(backend)
    restarted = ProvisionController(kube_cluster.api_client, name, second, protected_options())
    async with running(restarted):
        event = await wait_event(
            kube_cluster, claim_name, "ProvisioningCleanupFailed", f'"{class_name}" is gone'
        )
        assert FINALIZER_PROVISIONING in event["message"]
        assert "recreate the class" in event["message"]
        assert await get_claim(kube_cluster, claim_name) is not None
        assert list(backend) == [pv_name]
        await create_class(kube_cluster, name, name=class_name)
        await wait_deleted(kube_cluster, PERSISTENT_VOLUME_CLAIMS, claim_name)
    assert backend == {}


async def test_claim_deleted_before_provisioning_is_not_provisioned(
    kube_cluster: TestCluster,
) -> None:
    provisioner = MemoryProvisioner({})
    controller, class_name = await controller_for(kube_cluster, provisioner, protected_options())
    claim = await create_claim(kube_cluster, class_name)
    claim_name = claim["metadata"]["name"]
    async with deleted_but_held(kube_cluster, claim_name) as deleting:
        async with running(controller):
            await wait_idle(controller, deleting)
            assert provisioner.calls == []
        assert FINALIZER_PROVISIONING not in await finalizers(kube_cluster, claim_name)


async def test_deleting_unprovisioned_claim_is_left_alone_after_another_was_released(
    kube_cluster: TestCluster,
) -> None:
    """Regression (issue 20): while the controller remembered any released claim, every other
    claim skipped the "deleting without our finalizer: nothing to do" guard, so a deleting,
    never-provisioned claim went down the provisioning path (a refused finalizer PATCH, a
    failure and retries; one refusal away from a volume for a claim on its way out)."""
    provisioner = MemoryProvisioner({})
    controller, class_name = await controller_for(kube_cluster, provisioner, protected_options())
    async with running(controller):
        bound = await create_claim(kube_cluster, class_name)
        bound_name = bound["metadata"]["name"]
        await wait_bound(kube_cluster, bound_name)

        await wait_released(kube_cluster, bound_name, "once bound")
        # A worker reading a version from before the removal (a stale cache) makes the
        # controller remember the release, whatever order the binder's writes came in.
        current = await get_claim(kube_cluster, bound_name)
        assert current is not None
        stale = {
            **current,
            "metadata": {
                **current["metadata"],
                "finalizers": [
                    *(current["metadata"].get("finalizers") or []),
                    FINALIZER_PROVISIONING,
                ],
            },
        }
        await controller.sync_claim(stale)
    calls = len(provisioner.calls)
    assert calls == 1

    # Annotated as the PV controller does, so that nothing but the guard keeps it from us.
    leaving = await create_claim(
        kube_cluster, class_name, annotations={ANN_STORAGE_PROVISIONER: controller.provisioner_name}
    )
    leaving_name = leaving["metadata"]["name"]
    # Stopped controller: nothing provisions the new claim before it is marked for deletion.
    async with deleted_but_held(kube_cluster, leaving_name) as deleting:
        assert deleting["metadata"].get("deletionTimestamp")
        await controller.sync_claim(deleting)  # must neither raise nor provision
        assert len(provisioner.calls) == calls
        assert FINALIZER_PROVISIONING not in await finalizers(kube_cluster, leaving_name)


async def test_without_the_option_no_finalizer_is_added(kube_cluster: TestCluster) -> None:
    provisioner = GatedProvisioner({})
    controller, class_name = await controller_for(kube_cluster, provisioner)
    async with running(controller):
        claim = await create_claim(kube_cluster, class_name)
        claim_name = claim["metadata"]["name"]
        async with asyncio.timeout(30):
            await provisioner.asset_created.wait()
        assert len(provisioner.finalizers_seen) == 1
        assert FINALIZER_PROVISIONING not in provisioner.finalizers_seen[0]
        assert FINALIZER_PROVISIONING not in await finalizers(kube_cluster, claim_name)
        provisioner.gate.set()
        await wait_bound(kube_cluster, claim_name)
        assert FINALIZER_PROVISIONING not in await finalizers(kube_cluster, claim_name)

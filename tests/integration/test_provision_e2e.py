"""End-to-end tests of the ProvisionController: claim created → PV provisioned → claim Bound;
claim deleted → asset and PV gone. They use the ``kube_cluster`` fixture, so they run against
the in-memory API server (with its PV binder playing kube-controller-manager) and, with
``PYPROVLIB_E2E_KUBECONFIG``, against a real cluster.

Scenarios of upstream's controller_test.go covered here (the error paths are in
test_provision_errors.py, the volume stores in test_provision_stores.py, crash safety in
test_provision_crash.py, leader election in test_provision_leader.py):

- "provision for claim-1 but not claim-2" (a claim of another provisioner's class is left alone)
- "provision for claim-1 with storage class provisioner name distinct from controller
  provisioner name" (additional provisioner names)
- "delete volume-1 but not volume-2" (only PVs provisioned by us are deleted)
- "provision with Retain reclaim policy" and "don't delete volume-1 because its reclaim policy
  is not delete"
- "provision for ext provisioner with finalizer" and "ensure volume with finalizer is deleted
  if it is in a Released state and reclaim policy is Delete"
- TestTopologyParams "provision with selected node" (WaitForFirstConsumer: nothing happens until
  the scheduler selects a node, whose name reaches the provisioner)
- mount options of the class copied to the PV; the ``provision_total`` / ``delete_total``
  metrics counted by class.
"""

from __future__ import annotations

import asyncio

import pytest
from claim_support import create_claim, delete_claim, get_claim, get_volume
from provision_support import (
    MemoryProvisioner,
    controller_for,
    counter,
    create_class,
    fast_options,
    provisioner_name,
    wait_ready,
)

from pyprovlib.controller._provision import (
    ANN_DYNAMICALLY_PROVISIONED,
    ANN_STORAGE_PROVISIONER,
    FINALIZER_PV,
    ProvisionController,
)
from pyprovlib.kube._objects import Obj
from pyprovlib.kube._resources import (
    PERSISTENT_VOLUME_CLAIMS,
    PERSISTENT_VOLUMES,
    STORAGE_CLASSES,
)
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.testing import eventually, running, wait_bound, wait_deleted, wait_event, wait_idle
from pyprovlib.testing._cluster import TestCluster

pytestmark = pytest.mark.e2e


async def test_claim_is_provisioned_bound_and_deleted_with_its_asset(
    kube_cluster: TestCluster,
) -> None:
    provisioner = MemoryProvisioner()
    options = fast_options()
    controller, class_name = await controller_for(
        kube_cluster, provisioner, options, mountOptions=["noatime"]
    )
    async with running(controller):
        claim = await create_claim(kube_cluster, class_name, size="2Gi")
        claim_name = claim["metadata"]["name"]
        bound = await wait_bound(kube_cluster, claim_name)
        pv_name = f"pvc-{claim['metadata']['uid']}"
        assert bound["spec"]["volumeName"] == pv_name
        assert list(provisioner.assets) == [pv_name]

        pv = await get_volume(kube_cluster.api_client, pv_name)
        assert pv is not None
        assert (
            pv["metadata"]["annotations"][ANN_DYNAMICALLY_PROVISIONED]
            == controller.provisioner_name
        )
        assert pv["spec"]["claimRef"]["uid"] == claim["metadata"]["uid"]
        assert pv["spec"]["claimRef"]["name"] == claim_name
        assert pv["spec"]["storageClassName"] == class_name
        assert pv["spec"]["persistentVolumeReclaimPolicy"] == "Delete"
        assert pv["spec"]["mountOptions"] == ["noatime"]
        assert pv["spec"]["capacity"]["storage"] == "2Gi"
        assert FINALIZER_PV not in pv["metadata"].get("finalizers", [])

        (call,) = provisioner.calls
        assert call.pv_name == pv_name
        assert call.storage_class.metadata.name == class_name
        assert call.pvc.metadata.uid == claim["metadata"]["uid"]
        assert call.selected_node_name is None

        await wait_event(kube_cluster, claim_name, "Provisioning", "External provisioner")
        await wait_event(kube_cluster, claim_name, "ProvisioningSucceeded", pv_name)
        assert (
            counter(
                options.metrics,
                "persistentvolumeclaim_provision_total",
                **{"class": class_name, "source": ""},
            )
            == 1
        )

        await delete_claim(kube_cluster, claim_name)
        await wait_deleted(kube_cluster, PERSISTENT_VOLUMES, pv_name)
        assert provisioner.assets == {}
        assert provisioner.deleted == [pv_name]
        # The PV is gone once the API server applied the worker's DELETE; the worker counts the
        # deletion when the call returns: wait until it is done with everything.
        await wait_idle(controller)
        assert (
            counter(options.metrics, "persistentvolume_delete_total", **{"class": class_name}) == 1
        )


async def test_only_claims_of_our_classes_are_provisioned(kube_cluster: TestCluster) -> None:
    name = provisioner_name(kube_cluster)
    ours = await create_class(kube_cluster, name)
    theirs = await create_class(kube_cluster, f"{name}-someone-else")
    provisioner = MemoryProvisioner()
    controller = ProvisionController(kube_cluster.api_client, name, provisioner, fast_options())
    async with running(controller):
        other = await create_claim(kube_cluster, theirs)
        mine = await create_claim(kube_cluster, ours)
        await wait_bound(kube_cluster, mine["metadata"]["name"])
        other_now = await get_claim(kube_cluster, other["metadata"]["name"])
        assert other_now is not None
        assert other_now["status"]["phase"] == "Pending"
        assert [c.pvc.metadata.name for c in provisioner.calls] == [mine["metadata"]["name"]]


async def test_additional_provisioner_names(kube_cluster: TestCluster) -> None:
    name = provisioner_name(kube_cluster)
    old_name = f"{name}-legacy"
    class_name = await create_class(kube_cluster, old_name)
    provisioner = MemoryProvisioner()
    controller = ProvisionController(
        kube_cluster.api_client,
        name,
        provisioner,
        fast_options(additional_provisioner_names=(old_name,)),
    )
    async with running(controller):
        claim = await create_claim(kube_cluster, class_name)
        await wait_bound(kube_cluster, claim["metadata"]["name"])
        pv = await get_volume(kube_cluster.api_client, f"pvc-{claim['metadata']['uid']}")
        assert pv is not None
        # The PV records the class's provisioner, so deletion finds it under either name.
        assert pv["metadata"]["annotations"][ANN_DYNAMICALLY_PROVISIONED] == old_name
        await delete_claim(kube_cluster, claim["metadata"]["name"])
        await wait_deleted(kube_cluster, PERSISTENT_VOLUMES, pv["metadata"]["name"])
        assert provisioner.assets == {}


async def test_wait_for_first_consumer_waits_for_the_selected_node(
    kube_cluster: TestCluster,
) -> None:
    provisioner = MemoryProvisioner()
    controller, class_name = await controller_for(
        kube_cluster, provisioner, volumeBindingMode="WaitForFirstConsumer"
    )
    async with running(controller):
        claim = await create_claim(kube_cluster, class_name)
        claim_name = claim["metadata"]["name"]
        await wait_ready(kube_cluster, controller)
        # Annotating for us as the PV controller would, before any node is selected: the
        # claim must still wait.
        annotated = await ResourceClient(kube_cluster.api_client, PERSISTENT_VOLUME_CLAIMS).patch(
            claim_name,
            {"metadata": {"annotations": {ANN_STORAGE_PROVISIONER: controller.provisioner_name}}},
            namespace=kube_cluster.namespace,
        )
        await wait_idle(controller, annotated)
        assert provisioner.calls == []
        await kube_cluster.create_consumer_pod(claim_name)
        bound = await wait_bound(kube_cluster, claim_name, timeout=60)
        (call,) = provisioner.calls
        node = bound["metadata"]["annotations"]["volume.kubernetes.io/selected-node"]
        assert call.selected_node_name == node


async def test_retain_policy_keeps_the_volume_and_its_asset(kube_cluster: TestCluster) -> None:
    provisioner = MemoryProvisioner()
    controller, class_name = await controller_for(kube_cluster, provisioner, reclaimPolicy="Retain")
    async with running(controller):
        claim = await create_claim(kube_cluster, class_name)
        pv_name = f"pvc-{claim['metadata']['uid']}"
        kube_cluster.track(PERSISTENT_VOLUMES, pv_name)
        await wait_bound(kube_cluster, claim["metadata"]["name"])
        pv = await get_volume(kube_cluster.api_client, pv_name)
        assert pv is not None
        assert pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
        await delete_claim(kube_cluster, claim["metadata"]["name"])

        async def released() -> Obj | None:
            pv = await get_volume(kube_cluster.api_client, pv_name)
            return pv if pv is not None and pv["status"].get("phase") == "Released" else None

        pv = await eventually(released, message="PV Released")
        # The controller has seen the Released PV and done all it would do about it.
        await wait_idle(controller, pv)
        assert await get_volume(kube_cluster.api_client, pv_name) is not None
        assert pv_name in provisioner.assets
        assert provisioner.deleted == []


async def test_finalizer_protects_the_volume_until_its_asset_is_deleted(
    kube_cluster: TestCluster,
) -> None:
    provisioner = MemoryProvisioner()
    controller, class_name = await controller_for(
        kube_cluster, provisioner, fast_options(add_finalizer=True)
    )
    async with running(controller):
        claim = await create_claim(kube_cluster, class_name)
        pv_name = f"pvc-{claim['metadata']['uid']}"
        await wait_bound(kube_cluster, claim["metadata"]["name"])
        pv = await get_volume(kube_cluster.api_client, pv_name)
        assert pv is not None
        assert FINALIZER_PV in pv["metadata"]["finalizers"]

        await delete_claim(kube_cluster, claim["metadata"]["name"])
        await wait_deleted(kube_cluster, PERSISTENT_VOLUMES, pv_name)
        assert provisioner.deleted == [pv_name]
        assert provisioner.assets == {}


async def test_volumes_of_other_provisioners_are_not_deleted(kube_cluster: TestCluster) -> None:
    name = provisioner_name(kube_cluster)
    volumes = ResourceClient(kube_cluster.api_client, PERSISTENT_VOLUMES)

    def released_volume(pv_name: str, by: str) -> Obj:
        return {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": pv_name, "annotations": {ANN_DYNAMICALLY_PROVISIONED: by}},
            "spec": {
                "capacity": {"storage": "1Mi"},
                "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Delete",
                "hostPath": {"path": f"/tmp/{pv_name}"},
                # Bound to a claim that does not exist: the PV controller releases it.
                "claimRef": {
                    "kind": "PersistentVolumeClaim",
                    "apiVersion": "v1",
                    "namespace": kube_cluster.namespace,
                    "name": "gone",
                    "uid": "00000000-0000-0000-0000-000000000000",
                },
            },
        }

    mine, theirs = kube_cluster.unique_name("volume-1"), kube_cluster.unique_name("volume-2")
    for pv_name, by in ((mine, name), (theirs, "abc.def/ghi")):
        await volumes.create(released_volume(pv_name, by))
        kube_cluster.track(PERSISTENT_VOLUMES, pv_name)
    provisioner = MemoryProvisioner({mine: {}})
    controller = ProvisionController(kube_cluster.api_client, name, provisioner, fast_options())

    async def theirs_released() -> bool:
        other = await get_volume(kube_cluster.api_client, theirs)
        return other is not None and (other.get("status") or {}).get("phase") == "Released"

    async with running(controller):
        # The PV controller releases both in its own order and time: wait for each state.
        await kube_cluster.wait_for(theirs_released, message=f"PV {theirs} Released")
        await wait_deleted(kube_cluster, PERSISTENT_VOLUMES, mine)
        assert provisioner.deleted == [mine]
        other = await get_volume(kube_cluster.api_client, theirs)
        assert other is not None
        assert other["status"]["phase"] == "Released"


async def test_many_claims_are_provisioned_once_each(kube_cluster: TestCluster) -> None:
    provisioner = MemoryProvisioner()
    controller, class_name = await controller_for(
        kube_cluster, provisioner, fast_options(workers=3)
    )
    async with running(controller):
        claims = await asyncio.gather(*(create_claim(kube_cluster, class_name) for _ in range(12)))
        for claim in claims:
            await wait_bound(kube_cluster, claim["metadata"]["name"])
        assert sorted(provisioner.assets) == sorted(f"pvc-{c['metadata']['uid']}" for c in claims)


async def test_the_class_model_is_converted_once_per_class_version(
    kube_cluster: TestCluster,
) -> None:
    provisioner = MemoryProvisioner()
    controller, class_name = await controller_for(kube_cluster, provisioner)
    async with running(controller):
        for _ in range(2):
            claim = await create_claim(kube_cluster, class_name)
            await wait_bound(kube_cluster, claim["metadata"]["name"])
        first, second = provisioner.calls
        assert first.storage_class is second.storage_class  # one model for one version
        changed = await ResourceClient(kube_cluster.api_client, STORAGE_CLASSES).patch(
            class_name, {"metadata": {"annotations": {"example.com/tier": "gold"}}}
        )
        version = changed["metadata"]["resourceVersion"]
        async with asyncio.timeout(30):
            while (controller.class_informer.store.get_by_key(class_name) or {}).get(
                "metadata", {}
            ).get("resourceVersion") != version:
                await asyncio.sleep(0.01)
        claim = await create_claim(kube_cluster, class_name)
        await wait_bound(kube_cluster, claim["metadata"]["name"])
        third = provisioner.calls[2]
        assert third.storage_class is not first.storage_class
        assert third.storage_class.metadata.annotations == {"example.com/tier": "gold"}

"""What crosses into user code on deletion (issue 20): a DeletionGuard and ``delete`` get one
``V1PersistentVolume`` per sync, the same object, as upstream hands both the same pointer; an
ObjectDeleter gets the PV's JSON, read-only, and no model is built for it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from kubernetes_asyncio.client import V1PersistentVolume
from provision_support import MemoryProvisioner, bound_then_deleted, controller_for

from pyprovlib._provisioner import DeletionGuard, ObjectDeleter
from pyprovlib.testing import running
from pyprovlib.testing._cluster import TestCluster

pytestmark = pytest.mark.e2e


class SharingGuard(MemoryProvisioner, DeletionGuard):
    """Records the model objects its guard and its delete receive."""

    def __init__(self) -> None:
        super().__init__()
        self.guarded: list[V1PersistentVolume] = []
        self.deleted_models: list[V1PersistentVolume] = []

    async def should_delete(self, volume: V1PersistentVolume) -> bool:
        self.guarded.append(volume)
        return True

    async def delete(self, volume: V1PersistentVolume) -> None:
        self.deleted_models.append(volume)
        await super().delete(volume)


class JSONDeleter(MemoryProvisioner, ObjectDeleter):
    """Deletes from the PV's JSON; its model entry point must not be used by the controller."""

    def __init__(self) -> None:
        super().__init__()
        self.objects: list[Mapping[str, Any]] = []
        self.writable: list[bool] = []

    async def delete_object(self, volume: Mapping[str, Any]) -> None:
        self.objects.append(volume)
        try:
            volume["spec"] = {}  # type: ignore[index]
        except TypeError:
            self.writable.append(False)
        else:
            self.writable.append(True)
        name = volume["metadata"]["name"]
        self.deleted.append(name)
        self.assets.pop(name, None)

    async def delete(self, volume: V1PersistentVolume) -> None:
        raise AssertionError("the controller called delete(model) on an ObjectDeleter")


async def test_the_guard_and_delete_receive_one_model(kube_cluster: TestCluster) -> None:
    provisioner = SharingGuard()
    controller, class_name = await controller_for(kube_cluster, provisioner)
    async with running(controller):
        pv_name = await bound_then_deleted(kube_cluster, class_name)
    (deleted,) = provisioner.deleted_models
    assert deleted.metadata.name == pv_name
    # The guard was asked about that very object (it may also have been asked on other syncs).
    assert any(guarded is deleted for guarded in provisioner.guarded)


async def test_an_object_deleter_gets_the_pv_json_read_only(kube_cluster: TestCluster) -> None:
    provisioner = JSONDeleter()
    controller, class_name = await controller_for(kube_cluster, provisioner)
    async with running(controller):
        pv_name = await bound_then_deleted(kube_cluster, class_name)
        assert controller.healthy()
    assert provisioner.deleted == [pv_name]
    assert provisioner.writable == [False]
    (volume,) = provisioner.objects
    assert f"pvc-{volume['spec']['claimRef']['uid']}" == pv_name  # the claim's uid
    assert pv_name not in provisioner.assets

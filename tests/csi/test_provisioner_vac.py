"""CSIProvisioner and VolumeAttributesClasses (external-provisioner's behaviour): a claim created
with a class is provisioned with the class's parameters as CreateVolume's
``mutable_parameters`` and a PV of that class; the class must be the driver's and the driver
must have MODIFY_VOLUME; a class not created yet is waited for; the class's
controller-modify secret is recorded on the PV for the resizer."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest
from csi_e2e import create_claim, create_class, csi_env, get_volume, wait_bound, wait_event

from pyprovlib.csi.provisioner._secrets import ANN_MODIFY_SECRET_NAME, ANN_MODIFY_SECRET_NAMESPACE
from pyprovlib.kube._resources import VOLUME_ATTRIBUTES_CLASSES
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.testing._cluster import TestCluster

pytestmark = pytest.mark.e2e


async def create_vac(
    cluster: TestCluster, driver: str, parameters: dict[str, str], name: str = ""
) -> str:
    name = name or cluster.unique_name("vac")
    cluster.track(VOLUME_ATTRIBUTES_CLASSES, name)
    await ResourceClient(cluster.api_client, VOLUME_ATTRIBUTES_CLASSES).create(
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "VolumeAttributesClass",
            "metadata": {"name": name},
            "driverName": driver,
            "parameters": parameters,
        }
    )
    return name


def creates(env: Any) -> list[Any]:
    return [r for m, r in env.driver.calls if m == "CreateVolume"]


async def test_class_parameters_are_mutable_parameters(
    kube_cluster: TestCluster, sock_dir: pathlib.Path
) -> None:
    async with csi_env(kube_cluster, sock_dir, modify=True) as env:
        gold = await create_vac(kube_cluster, env.name, {"iops": "3000"})
        sc = await create_class(
            env,
            parameters={
                "csi.storage.k8s.io/controller-modify-secret-name": "modify-${pvc.name}",
                "csi.storage.k8s.io/controller-modify-secret-namespace": "${pvc.namespace}",
            },
        )
        claim = await create_claim(env, sc, volumeAttributesClassName=gold)
        name = claim["metadata"]["name"]
        bound = await wait_bound(env, name)
        (request,) = creates(env)
        assert request.mutable_parameters == {"iops": "3000"}
        # The provisioner's own parameters never reach the driver.
        assert request.parameters == {}
        pv = await get_volume(env, bound["spec"]["volumeName"])
        assert pv is not None
        assert pv["spec"]["volumeAttributesClassName"] == gold
        annotations = pv["metadata"]["annotations"]
        assert annotations[ANN_MODIFY_SECRET_NAME] == f"modify-{name}"
        assert annotations[ANN_MODIFY_SECRET_NAMESPACE] == kube_cluster.namespace
        # The PV controller copies the volume's class into the claim's status when it binds.
        assert bound["status"]["currentVolumeAttributesClassName"] == gold


async def test_a_class_of_another_driver_is_refused(
    kube_cluster: TestCluster, sock_dir: pathlib.Path
) -> None:
    async with csi_env(kube_cluster, sock_dir, modify=True) as env:
        other = await create_vac(kube_cluster, "other.example.com", {"iops": "1"})
        sc = await create_class(env)
        claim = await create_claim(env, sc, volumeAttributesClassName=other)
        event = await wait_event(env, claim["metadata"]["name"], "ProvisioningFailed")
        assert event["message"] == (
            f'failed to provision volume with StorageClass "{sc}": VAC {other} referenced in '
            f"PVC is for driver other.example.com which does not match driver name {env.name}"
        )
        assert creates(env) == []


async def test_a_driver_without_modify_volume_is_refused(
    kube_cluster: TestCluster, sock_dir: pathlib.Path
) -> None:
    async with csi_env(kube_cluster, sock_dir) as env:
        gold = await create_vac(kube_cluster, env.name, {"iops": "1"})
        sc = await create_class(env)
        claim = await create_claim(env, sc, volumeAttributesClassName=gold)
        event = await wait_event(env, claim["metadata"]["name"], "ProvisioningFailed")
        assert event["message"].startswith(
            f'failed to provision volume with StorageClass "{sc}": CSI driver does not support '
            "VolumeAttributesClass: controller MODIFY_VOLUME capability is not reported"
        )
        assert creates(env) == []


async def test_a_class_created_later_is_waited_for(
    kube_cluster: TestCluster, sock_dir: pathlib.Path
) -> None:
    async with csi_env(kube_cluster, sock_dir, modify=True) as env:
        sc = await create_class(env)
        later = kube_cluster.unique_name("later")
        claim = await create_claim(env, sc, volumeAttributesClassName=later)
        name = claim["metadata"]["name"]
        event = await wait_event(env, name, "ProvisioningFailed")
        assert f'cannot read VolumeAttributesClass "{later}"' in event["message"]
        assert "404" in event["message"]
        await create_vac(kube_cluster, env.name, {"iops": "7"}, name=later)
        await wait_bound(env, name, timeout=30)
        assert creates(env)[-1].mutable_parameters == {"iops": "7"}

"""The object convention at the Attacher boundary (issue 20): ``AttachVolume.spec`` is the
kubernetes-asyncio ``V1PersistentVolumeSpec``, converted lazily and at most once per call, with
the JSON form (``spec_object``) beside it; the built-in CSI attacher reads neither and so
converts nothing."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from attach_support import MemoryAttacher, Objects, driver_name, fast_options, is_attached
from csi_attach_driver import AttachDriver
from kubernetes_asyncio.client import V1PersistentVolumeSpec
from prometheus_client import CollectorRegistry
from sidecar_support import running, short_socket_dir

from pyprovlib._attacher import AttachNode, AttachVolume
from pyprovlib.controller._attach import AttachController
from pyprovlib.csi._connection import ConnectionOptions, CSIConnection, CSIMetrics
from pyprovlib.csi.attacher import CSIAttacher
from pyprovlib.kube._convert import ConversionError
from pyprovlib.testing._cluster import TestCluster

SPEC = {
    "capacity": {"storage": "1Gi"},
    "accessModes": ["ReadWriteOnce"],
    "csi": {"driver": "d.example.com", "volumeHandle": "vol-1", "fsType": "xfs"},
}


async def test_spec_is_a_model_converted_once_and_shared_with_the_secrets_copy() -> None:
    volume = AttachVolume("vol-1", "d.example.com", pv_name="pv-1", spec_object=SPEC)
    assert "spec" not in vars(volume)  # nothing converted until asked
    spec = volume.spec
    assert isinstance(spec, V1PersistentVolumeSpec)
    assert spec.csi.volume_handle == "vol-1"
    assert spec.csi.fs_type == "xfs"
    assert spec.access_modes == ["ReadWriteOnce"]
    assert volume.spec is spec  # once
    with_secrets = volume.with_secrets({"password": "hunter2-secret"})
    assert with_secrets.spec is spec  # the copy the backend receives converts nothing again
    assert with_secrets.secrets == {"password": "hunter2-secret"}
    assert with_secrets.spec_object is SPEC
    # Before any access, the copy converts on its own and the original stays unconverted.
    fresh = AttachVolume("vol-1", "d.example.com", spec_object=SPEC).with_secrets({})
    assert "spec" not in vars(fresh)
    assert fresh.spec.csi.driver == "d.example.com"


async def test_a_spec_the_model_refuses_names_the_volume() -> None:
    bad = {"csi": {"volumeHandle": "vol-1"}}  # the model requires csi.driver
    volume = AttachVolume("vol-1", "d.example.com", pv_name="pv-bad", spec_object=bad)
    with pytest.raises(ConversionError, match='PersistentVolume "pv-bad"'):
        _ = volume.spec
    inline = AttachVolume("vol-1", "d.example.com", spec_object=bad)
    with pytest.raises(ConversionError, match="inline volume"):
        _ = inline.spec


class SpecReadingAttacher(MemoryAttacher):
    """A backend working on the model: it reads ``volume.spec``."""

    def __init__(self) -> None:
        super().__init__()
        self.specs: list[V1PersistentVolumeSpec] = []

    async def attach(
        self,
        volume: AttachVolume,
        node: AttachNode,
        readonly: bool,
        context: Mapping[str, str],
    ) -> Mapping[str, str]:
        self.specs.append(volume.spec)
        return await super().attach(volume, node, readonly, context)


@pytest.mark.e2e
async def test_a_backend_receives_the_pv_spec_as_a_model(kube_cluster: TestCluster) -> None:
    driver = driver_name(kube_cluster)
    objects = Objects(kube_cluster, driver)
    node = kube_cluster.unique_name("node")
    await objects.csinode(node, f"id-{node}")
    pv_name, va_name = kube_cluster.unique_name("pv"), kube_cluster.unique_name("va")
    await objects.pv(pv_name, "vol-model", fs_type="ext4", attributes={"pool": "gold"})
    backend = SpecReadingAttacher()
    controller = AttachController(kube_cluster.api_client, driver, backend, fast_options())
    async with running(controller):
        await objects.va(va_name, node, pv=pv_name)
        await objects.wait_va(va_name, is_attached, "attached")
    (spec,) = backend.specs
    assert isinstance(spec, V1PersistentVolumeSpec)
    assert spec.csi.driver == driver
    assert spec.csi.volume_handle == "vol-model"
    assert spec.csi.volume_attributes == {"pool": "gold"}
    (call,) = backend.calls
    assert call.volume.spec_object["csi"]["volumeHandle"] == "vol-model"


class RecordingCSIAttacher(CSIAttacher):
    """The built-in CSI attacher, keeping every volume it was handed."""

    volumes: list[AttachVolume]

    def check(self, volume: AttachVolume) -> None:
        self.volumes.append(volume)
        super().check(volume)

    async def attach(
        self,
        volume: AttachVolume,
        node: AttachNode,
        readonly: bool,
        context: Mapping[str, str],
    ) -> Mapping[str, str]:
        self.volumes.append(volume)
        return await super().attach(volume, node, readonly, context)

    async def detach(self, volume: AttachVolume, node: AttachNode) -> None:
        self.volumes.append(volume)
        await super().detach(volume, node)


@pytest.mark.e2e
async def test_the_csi_attacher_converts_nothing(kube_cluster: TestCluster) -> None:
    driver = driver_name(kube_cluster)
    objects = Objects(kube_cluster, driver)
    node = kube_cluster.unique_name("node")
    await objects.csinode(node, f"csi-{node}")
    pv_name, va_name = kube_cluster.unique_name("pv"), kube_cluster.unique_name("va")
    await objects.pv(pv_name, "vol-json", fs_type="ext4")
    with short_socket_dir() as directory:
        async with AttachDriver(driver, directory / "csi.sock") as csi_driver:
            connection = await CSIConnection.open(
                csi_driver.endpoint,
                ConnectionOptions(timeout=5.0, exit_on_connection_loss=False),
                metrics=CSIMetrics(CollectorRegistry()),
            )
            try:
                attacher = RecordingCSIAttacher(connection)
                attacher.volumes = []
                controller = AttachController(
                    kube_cluster.api_client, driver, attacher, fast_options()
                )
                async with running(controller):
                    await objects.va(va_name, node, pv=pv_name)
                    await objects.wait_va(va_name, is_attached, "attached")
                    await objects.vas.delete(va_name)
                    await objects.wait_va_gone(va_name)
            finally:
                connection.close()
            assert csi_driver.state.unpublish_requests
    ops = {id(v) for v in attacher.volumes}
    assert len(ops) >= 3  # check, attach, detach
    for volume in attacher.volumes:
        assert volume.spec_object["csi"]["volumeHandle"] == "vol-json"
        assert "spec" not in vars(volume), "the CSI attacher's path converted the PV spec"

"""The CSI sidecars against a real grpc-go peer: the Go ``hostpathplugin``
(kubernetes-csi/csi-driver-host-path) instead of the Python test driver.

One claim's whole life through pyprovlib's CSI client and controllers: provisioned
(CreateVolume), attached and detached (ControllerPublish/UnpublishVolume), expanded
(ControllerExpandVolume) and deleted (DeleteVolume), each checked against the driver's own state
file. Runs in memory by default and against a real cluster with ``PYPROVLIB_E2E_KUBECONFIG``;
skips when no hostpathplugin binary is found (see ``find_hostpathplugin``).
"""

from __future__ import annotations

import pathlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import pytest
from claim_support import attachment_body, class_body
from csi_e2e import (
    GoHostpath,
    create_claim,
    csi_env,
    get_volume,
    go_hostpath,
    wait_bound,
    wait_volume_gone,
)
from prometheus_client import CollectorRegistry
from sidecar_support import fast_values

from pyprovlib import testing
from pyprovlib.controller._attach import AttachController
from pyprovlib.controller._attach.options import AttachControllerOptions
from pyprovlib.controller._resize import ResizeController, ResizeControllerOptions
from pyprovlib.csi._connection import ConnectionOptions, CSIConnection, CSIMetrics
from pyprovlib.csi.attacher import CSIAttacher
from pyprovlib.csi.resizer import CSIResizer
from pyprovlib.kube._objects import Obj
from pyprovlib.kube._resources import (
    CSINODES,
    PERSISTENT_VOLUME_CLAIMS,
    STORAGE_CLASSES,
    VOLUME_ATTACHMENTS,
)
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.testing._cluster import TestCluster

pytestmark = pytest.mark.e2e

GI = 1024**3
T = TypeVar("T")


async def wait(cluster: TestCluster, probe: Callable[[], Awaitable[T | None]], message: str) -> T:
    return await cluster.wait_for(probe, timeout=30.0, message=message)


@pytest.fixture
async def go_driver(
    kube_cluster: TestCluster, sock_dir: pathlib.Path, hostpathplugin_binary: pathlib.Path
) -> AsyncIterator[GoHostpath]:
    name = f"{kube_cluster.unique_name('hostpath')}.csi.pyprovlib.io"
    node = kube_cluster.unique_name("node")
    async with go_hostpath(hostpathplugin_binary, sock_dir, name, node_id=node) as driver:
        yield driver


async def test_provision_attach_expand_detach_delete_on_hostpathplugin(
    kube_cluster: TestCluster, sock_dir: pathlib.Path, go_driver: GoHostpath
) -> None:
    cluster = kube_cluster
    api = cluster.api_client
    node = go_driver.node_id
    # The node the attachment names, with the driver's node id (what the kubelet registers).
    cluster.track(CSINODES, node)
    await ResourceClient(api, CSINODES).create(
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "CSINode",
            "metadata": {"name": node},
            "spec": {"drivers": [{"name": go_driver.name, "nodeID": node}]},
        }
    )
    connection = await CSIConnection.open(
        go_driver.endpoint,
        ConnectionOptions(timeout=10.0, exit_on_connection_loss=False),
        metrics=CSIMetrics(CollectorRegistry()),
    )
    async with csi_env(cluster, sock_dir, go=go_driver) as env:
        assert env.connection.driver_name == go_driver.name
        class_name = cluster.unique_name("sc")
        await ResourceClient(api, STORAGE_CLASSES).create(
            class_body(
                class_name, go_driver.name, allowVolumeExpansion=True, reclaimPolicy="Delete"
            )
        )
        cluster.track(STORAGE_CLASSES, class_name)

        # provision: CreateVolume on the Go driver, a PV naming its volume
        claim = await create_claim(env, class_name, size="1Gi")
        claim_name = claim["metadata"]["name"]
        bound = await wait_bound(env, claim_name, timeout=30.0)
        pv_name = bound["spec"]["volumeName"]
        pv = await get_volume(env, pv_name)
        assert pv is not None
        handle = pv["spec"]["csi"]["volumeHandle"]
        assert pv["spec"]["csi"]["driver"] == go_driver.name
        volumes = go_driver.volumes()
        assert handle in volumes, volumes
        assert volumes[handle]["VolSize"] == GI

        # attach and detach: ControllerPublish/UnpublishVolume
        attacher = CSIAttacher(connection)
        attach_options = AttachControllerOptions(**fast_values(0.2, {"timeout": 10.0}))
        vas = ResourceClient(api, VOLUME_ATTACHMENTS)
        va_name = cluster.unique_name("va")
        async with testing.running(AttachController(api, go_driver.name, attacher, attach_options)):
            cluster.track(VOLUME_ATTACHMENTS, va_name)
            await vas.create(attachment_body(va_name, go_driver.name, node, pv_name))

            async def attached() -> Obj | None:
                va: Obj = await vas.get(va_name)
                return va if (va.get("status") or {}).get("attached") else None

            await wait(cluster, attached, f"VolumeAttachment {va_name} attached")
            assert go_driver.volumes()[handle]["Attached"] is True
            await vas.delete(va_name)

            async def detached() -> bool:
                return not any(
                    v["metadata"]["name"] == va_name for v in (await vas.list())["items"]
                )

            await wait(cluster, detached, f"VolumeAttachment {va_name} gone")
            assert go_driver.volumes()[handle]["Attached"] is False

            # expand: ControllerExpandVolume, the PV's capacity follows
            resizer = CSIResizer(connection, api)
            resize_options = ResizeControllerOptions(**fast_values(0.2, {"timeout": 10.0}))
            async with testing.running(ResizeController(api, resizer, resize_options)):
                await ResourceClient(api, PERSISTENT_VOLUME_CLAIMS).patch(
                    claim_name,
                    {"spec": {"resources": {"requests": {"storage": "2Gi"}}}},
                    namespace=cluster.namespace,
                )

                async def expanded() -> Obj | None:
                    volume = await get_volume(env, pv_name)
                    grown = volume and volume["spec"]["capacity"]["storage"] == "2Gi"
                    return volume if grown else None

                await wait(cluster, expanded, f"PV {pv_name} expanded to 2Gi")
                assert go_driver.volumes()[handle]["VolSize"] == 2 * GI

            # delete: DeleteVolume on the Go driver, then the PV goes (the attach controller
            # still runs: it takes its finalizer off the PV being deleted)
            await ResourceClient(api, PERSISTENT_VOLUME_CLAIMS).delete(
                claim_name, cluster.namespace
            )
            await wait_volume_gone(env, pv_name)
            assert handle not in go_driver.volumes()
    connection.close()

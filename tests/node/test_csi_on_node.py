"""``python -m pyprovlib.csi`` on a real node, with the Go hostpath driver and with pyprovlib's
example driver as the node plugin (registered with the kubelet by node-driver-registrar): a
pod runs with the volume (CreateVolume and ControllerPublish from pyprovlib, NodeStage and
NodePublish from the kubelet), its data survives the pod, online expansion reaches the file
system (NodeExpandVolume) and clears the claim's condition, the volume is detached when the
pod goes and deleted with the claim — also when the sidecar is SIGKILLed between attach and
mount."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio
import stacks
from conftest import RealNode
from node_support import (
    MOUNT,
    bound_volume,
    claim,
    create,
    create_storage_class,
    delete,
    get,
    gone,
    http,
    ns_path,
    pod,
    pod_phase,
    read_back,
    until,
    write,
)

from pyprovlib.csi._connection import CSIConnection
from pyprovlib.csi._proto.csi import v1
from pyprovlib.kube._objects import Obj
from pyprovlib.testing._cluster import TestCluster

pytestmark = pytest.mark.node

VOLUME_ATTACHMENTS = "/apis/storage.k8s.io/v1/volumeattachments"


@pytest.fixture(scope="module", params=["pyprovlib", "example"])
def stack(request: pytest.FixtureRequest, real_node: RealNode) -> Iterator[stacks.Stack]:
    """A stack of ``python -m pyprovlib.csi`` and a node plugin, running on the node for the
    module's tests."""
    chosen = stacks.STACKS[request.param]
    asyncio.run(stacks.start_stack(real_node.node, chosen))
    try:
        yield chosen
    finally:
        asyncio.run(stacks.stop_stack(real_node.node, chosen))


@pytest_asyncio.fixture
async def cluster(real_node: RealNode) -> AsyncIterator[TestCluster]:
    async with TestCluster(control_plane=real_node.plane) as cluster:
        yield cluster


async def storage_class(cluster: TestCluster, stack: stacks.Stack) -> str:
    return await create_storage_class(
        cluster, f"csi-{cluster.namespace}", stack.driver, allowVolumeExpansion=True
    )


async def attachments(cluster: TestCluster, pv_name: str) -> list[Obj]:
    listing = await http(cluster).json("GET", VOLUME_ATTACHMENTS)
    return [
        va
        for va in listing.get("items") or []
        if (va["spec"].get("source") or {}).get("persistentVolumeName") == pv_name
    ]


async def driver_volumes(real_node: RealNode, stack: stacks.Stack) -> set[str]:
    """The volume ids the driver itself lists (Controller.ListVolumes)."""
    socket = real_node.node.csi_socket(stack.driver)
    async with await CSIConnection.open(f"unix://{socket}") as conn:
        answer = await conn.call("/csi.v1.Controller/ListVolumes", v1.ListVolumesRequest())
    return {entry.volume.volume_id for entry in answer.entries}


async def detached(cluster: TestCluster, pv_name: str) -> None:
    async def none_left() -> bool:
        return await attachments(cluster, pv_name) == []

    await until(none_left, f"the VolumeAttachment of {pv_name} to be deleted")


async def delete_claim_and_volume(
    real_node: RealNode, stack: stacks.Stack, cluster: TestCluster, pv: Obj
) -> None:
    handle = pv["spec"]["csi"]["volumeHandle"]
    await delete(cluster, ns_path(cluster, "persistentvolumeclaims", "data"))
    await gone(cluster, f"/api/v1/persistentvolumes/{pv['metadata']['name']}")

    async def deleted() -> bool:
        return handle not in await driver_volumes(real_node, stack)

    await until(deleted, f"DeleteVolume of {handle}")


async def test_pod_writes_and_data_survives_the_pod(
    real_node: RealNode, stack: stacks.Stack, cluster: TestCluster
) -> None:
    class_name = await storage_class(cluster, stack)
    await create(cluster, "persistentvolumeclaims", claim("data", class_name))
    await write(cluster, "data", "from-the-pod")
    pv = await bound_volume(cluster, "data")
    assert pv["spec"]["csi"]["driver"] == stack.driver
    assert pv["spec"]["csi"]["volumeHandle"] in await driver_volumes(real_node, stack)
    assert [
        a["status"].get("attached") for a in await attachments(cluster, pv["metadata"]["name"])
    ] == [True]

    await read_back(cluster, "data", "from-the-pod")
    # Unpublish, unstage, then detach (ControllerUnpublish) once no pod uses the volume.
    await detached(cluster, pv["metadata"]["name"])
    await delete_claim_and_volume(real_node, stack, cluster, pv)


def _capacity(obj: Obj) -> str:
    return str(((obj.get("status") or {}).get("capacity") or {}).get("storage"))


async def test_online_expansion_reaches_the_node(
    real_node: RealNode, stack: stacks.Stack, cluster: TestCluster
) -> None:
    class_name = await storage_class(cluster, stack)
    await create(cluster, "persistentvolumeclaims", claim("data", class_name, "1Mi"))
    await create(
        cluster,
        "pods",
        pod("user", "data", "trap 'exit 0' TERM; while true; do sleep 1; done", restart="Always"),
    )
    await pod_phase(cluster, "user", {"Running"})
    pv = await bound_volume(cluster, "data")
    path = ns_path(cluster, "persistentvolumeclaims", "data")
    await http(cluster).json(
        "PATCH",
        path,
        body={"spec": {"resources": {"requests": {"storage": "2Mi"}}}},
        content_type="application/merge-patch+json",
    )

    async def expanded() -> Obj | None:
        found = await get(cluster, path)
        status = (found or {}).get("status") or {}
        if _capacity(found or {}) == "2Mi" and not status.get("conditions"):
            return found
        return None

    # ControllerExpandVolume from pyprovlib's resizer, FileSystemResizePending, then the
    # kubelet's NodeExpandVolume while the pod runs, which clears the condition.
    await until(expanded, "the claim to report 2Mi with no resize condition left")
    volume = await get(cluster, f"/api/v1/persistentvolumes/{pv['metadata']['name']}")
    assert volume is not None
    assert volume["spec"]["capacity"]["storage"] == "2Mi"

    await delete(cluster, ns_path(cluster, "pods", "user"))
    await gone(cluster, ns_path(cluster, "pods", "user"))
    await detached(cluster, pv["metadata"]["name"])
    await delete_claim_and_volume(real_node, stack, cluster, pv)


async def test_sidecar_killed_between_attach_and_mount(
    real_node: RealNode, stack: stacks.Stack, cluster: TestCluster
) -> None:
    """SIGKILL ``python -m pyprovlib.csi`` the moment the volume is attached: the kubelet
    mounts without it, the pod starts; a new sidecar takes over, and when pod and claim go,
    nothing is left (no VolumeAttachment, PV or volume in the driver)."""
    node = real_node.node
    (name, argv), *_ = (
        (n, a) for n, a in stacks.controller_argvs(node, stack).items() if "pyprovlib-csi" in n
    )
    class_name = await storage_class(cluster, stack)
    await create(cluster, "persistentvolumeclaims", claim("data", class_name))
    await create(cluster, "pods", pod("user", "data", f"echo x > {MOUNT}/file; sleep 3600"))
    pv = await bound_volume(cluster, "data")

    async def attached() -> bool:
        return any(
            (a.get("status") or {}).get("attached")
            for a in await attachments(cluster, pv["metadata"]["name"])
        )

    await until(attached, "the volume to be attached")
    node.kill_process(name)
    try:
        await pod_phase(cluster, "user", {"Running"})
    finally:
        node.add_process(name, argv)
    await delete(cluster, ns_path(cluster, "pods", "user"))
    await gone(cluster, ns_path(cluster, "pods", "user"))
    await detached(cluster, pv["metadata"]["name"])
    await delete_claim_and_volume(real_node, stack, cluster, pv)

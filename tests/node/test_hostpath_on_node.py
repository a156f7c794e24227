"""The hostpath example on a real node: ``python -m pyprovlib.examples.hostpath`` in
helper-pod mode (its helper pods really run on the node) and in node mode (the provisioner on
the node itself, as its DaemonSet would run it). A pod writes into the claim, the data is in
``<basePath>/<pv name>`` on the node, a second pod reads it back (the data survives the first
pod), and deleting the claim removes the directory."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from conftest import RealNode
from node_support import (
    BUSYBOX,
    bound_volume,
    claim,
    create,
    create_storage_class,
    delete,
    events_for,
    get,
    gone,
    http,
    kubeconfig,
    ns_path,
    pod,
    python_module,
    read_back,
    until,
    write,
)

from pyprovlib.testing._cluster import TestCluster
from pyprovlib.testing._node import KubeletNode

pytestmark = pytest.mark.node

HELPER_LABEL = "app.kubernetes.io/managed-by=pyprovlib-hostpath"


@pytest_asyncio.fixture
async def cluster(real_node: RealNode) -> AsyncIterator[TestCluster]:
    async with TestCluster(control_plane=real_node.plane) as cluster:
        yield cluster


@pytest.fixture
def base_path(real_node: RealNode, request: pytest.FixtureRequest) -> Path:
    """The test's basePath on the node (under the node's directory, removed with it)."""
    assert real_node.node.directory is not None
    path = real_node.node.directory / "hostpath" / request.node.name
    path.mkdir(parents=True)
    return path


@contextlib.contextmanager
def provisioner(node: KubeletNode, cluster: TestCluster, mode: str, *flags: str) -> Iterator[str]:
    """``python -m pyprovlib.examples.hostpath`` as a process of the node, with a provisioner
    name of this test's own; yields the name."""
    name = f"pyprovlib.io/hostpath-{cluster.namespace}"
    process = f"hostpath-{cluster.namespace}"
    argv = python_module(
        "pyprovlib.examples.hostpath",
        f"--kubeconfig={kubeconfig(node)}",
        f"--provisioner-name={name}",
        f"--mode={mode}",
        "--log-format=console",
        "--kube-api-qps=50",
        "--kube-api-burst=100",
        *flags,
    )
    node.add_process(process, argv)
    try:
        yield name
    finally:
        with contextlib.suppress(KeyError):
            node.stop_process(process)


def helper_flags(cluster: TestCluster, image: str = BUSYBOX, timeout: str = "2m") -> list[str]:
    return [
        f"--helper-image={image}",
        f"--helper-namespace={cluster.namespace}",
        f"--helper-timeout={timeout}",
    ]


async def storage_class(cluster: TestCluster, provisioner_name: str, base: Path) -> str:
    return await create_storage_class(
        cluster,
        f"hostpath-{cluster.namespace}",
        provisioner_name,
        reclaimPolicy="Delete",
        parameters={"basePath": str(base)},
    )


async def helper_pods(cluster: TestCluster) -> list[str]:
    listing = await http(cluster).json(
        "GET", ns_path(cluster, "pods"), query={"labelSelector": HELPER_LABEL}
    )
    return [p["metadata"]["name"] for p in listing.get("items") or []]


async def write_read_delete(cluster: TestCluster, class_name: str, base: Path) -> None:
    """The life of a local volume as a user sees it, checked on the node's disk."""
    await create(cluster, "persistentvolumeclaims", claim("data", class_name))
    await write(cluster, "data", "written-by-pod")
    pv = await bound_volume(cluster, "data")
    directory = base / pv["metadata"]["name"]
    assert pv["spec"]["local"]["path"] == str(directory)
    assert (directory / "file").read_text() == "written-by-pod\n"

    await read_back(cluster, "data", "written-by-pod")
    await delete(cluster, ns_path(cluster, "persistentvolumeclaims", "data"))
    await gone(cluster, f"/api/v1/persistentvolumes/{pv['metadata']['name']}")
    await until(lambda: _absent(directory), f"{directory} to be removed")


async def _absent(path: Path) -> bool:
    return not await asyncio.to_thread(os.path.lexists, path)


async def test_helper_pod_mode_pod_writes_and_reads_back(
    real_node: RealNode, cluster: TestCluster, base_path: Path
) -> None:
    with provisioner(real_node.node, cluster, "helper-pod", *helper_flags(cluster)) as name:
        class_name = await storage_class(cluster, name, base_path)
        await write_read_delete(cluster, class_name, base_path)
        # The create and delete helper pods really ran on the node, and are gone.
        assert await helper_pods(cluster) == []


async def test_node_mode_pod_writes_and_reads_back(
    real_node: RealNode, cluster: TestCluster, base_path: Path
) -> None:
    node = real_node.node
    with provisioner(node, cluster, "node", f"--node-name={node.name}") as name:
        class_name = await storage_class(cluster, name, base_path)
        await write_read_delete(cluster, class_name, base_path)


@contextlib.contextmanager
def read_only(path: Path) -> Iterator[None]:
    """``path`` read-only for the node (a read-only tmpfs over it): creating a volume directory
    there fails in the helper pod."""
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(path)], check=True)
    try:
        yield
    finally:
        subprocess.run(["umount", str(path)], check=False)


async def test_failing_helper_pod_is_reported_and_removed(
    real_node: RealNode, cluster: TestCluster, base_path: Path
) -> None:
    node = real_node.node
    with (
        read_only(base_path),
        provisioner(node, cluster, "helper-pod", *helper_flags(cluster)) as name,
    ):
        class_name = await storage_class(cluster, name, base_path)
        await create(cluster, "persistentvolumeclaims", claim("data", class_name))
        await create(cluster, "pods", pod("consumer", "data", "true"))

        async def reported() -> bool:
            return any(
                e.get("reason") == "ProvisioningFailed" and "failed" in e.get("message", "")
                for e in await events_for(cluster, "data")
            )

        await until(reported, "a ProvisioningFailed event naming the failed helper pod")
        # The failed helper pod is deleted (a retry starts a fresh one); when the claim goes,
        # no helper pod is left.
        await delete(cluster, ns_path(cluster, "pods", "consumer"))
        await delete(cluster, ns_path(cluster, "persistentvolumeclaims", "data"))
        await gone(cluster, ns_path(cluster, "persistentvolumeclaims", "data"))

        async def no_helpers() -> bool:
            return await helper_pods(cluster) == []

        await until(no_helpers, "no helper pod left")


async def _cordon(cluster: TestCluster, node: str, unschedulable: bool) -> None:
    await http(cluster).json(
        "PATCH",
        f"/api/v1/nodes/{node}",
        body={"spec": {"unschedulable": unschedulable or None}},
        content_type="application/merge-patch+json",
    )


async def test_unschedulable_helper_pod_survives_a_restart_and_leaves_nothing(
    real_node: RealNode, cluster: TestCluster, base_path: Path
) -> None:
    """A helper pod that cannot be scheduled (its node cordoned after the consumer was placed)
    times out with an event; the provisioner is SIGKILLed and started again meanwhile, the
    claim is deleted, and once the node is back, the volume is created and removed again and
    no helper pod is left."""
    node = real_node.node
    flags = helper_flags(cluster, timeout="3s")
    with provisioner(node, cluster, "helper-pod", *flags) as name:
        class_name = await storage_class(cluster, name, base_path)
        await create(cluster, "persistentvolumeclaims", claim("data", class_name))
        try:
            await _cordon(cluster, node.name, True)
            # The scheduler's choice for a consumer placed before the cordon; the helper pod
            # the provisioner launches next must be scheduled, and cannot be.
            await http(cluster).json(
                "PATCH",
                ns_path(cluster, "persistentvolumeclaims", "data"),
                body={
                    "metadata": {"annotations": {"volume.kubernetes.io/selected-node": node.name}}
                },
                content_type="application/merge-patch+json",
            )

            async def timed_out() -> bool:
                return any(
                    e.get("reason") == "ProvisioningFailed"
                    and "did not finish" in e.get("message", "")
                    for e in await events_for(cluster, "data")
                )

            await until(timed_out, "a ProvisioningFailed event for the unscheduled helper pod")
            assert len(await helper_pods(cluster)) == 1
            node.kill_process(f"hostpath-{cluster.namespace}")
        finally:
            await _cordon(cluster, node.name, False)
    # The claim goes while nobody provisions it; a new provisioner finishes and undoes the
    # volume the deleted claim may have had, and releases the claim.
    await delete(cluster, ns_path(cluster, "persistentvolumeclaims", "data"))
    assert await get(cluster, ns_path(cluster, "persistentvolumeclaims", "data")) is not None
    with provisioner(node, cluster, "helper-pod", *flags):
        await gone(cluster, ns_path(cluster, "persistentvolumeclaims", "data"))

        async def no_helpers() -> bool:
            return await helper_pods(cluster) == []

        await until(no_helpers, "no helper pod left")
    assert await asyncio.to_thread(os.listdir, base_path) == []

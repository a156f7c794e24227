"""pyprovlib's CSI provisioner next to the Go ``csi-provisioner`` (kubernetes-csi/
external-provisioner), each on a Go ``hostpathplugin`` of its own, on a real control plane
(``PYPROVLIB_KUBE_ASSETS``, whose directory also holds ``csi-provisioner``):

- ``--controller-publish-readonly``: both mark the PV of a ReadOnlyMany claim read-only, and
  only that one;
- cloning protection: a source deleted while a clone of it waits for room in the driver stays,
  Terminating, with the finalizer. Then the driver has room: pyprovlib makes the clone (it
  existed before the deletion) and the source goes; the Go sidecar refuses to clone a source
  being deleted, so clone and source wait for each other until the clone is deleted — the
  difference docs/sidecars.md describes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pathlib
import sys
from collections.abc import AsyncIterator, Callable

import claim_support
import pytest
from claim_support import class_body
from csi_e2e import GoHostpath, go_hostpath, register_hostpath_node
from process_support import terminate

from pyprovlib import testing
from pyprovlib.csi.provisioner._data_source import CLONE_FINALIZER
from pyprovlib.kube._objects import Obj
from pyprovlib.kube._resources import (
    CSINODES,
    EVENTS,
    NODES,
    PERSISTENT_VOLUME_CLAIMS,
    PERSISTENT_VOLUMES,
    STORAGE_CLASSES,
)
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.testing._cluster import TestCluster

pytestmark = pytest.mark.e2e

PEERS = ("go", "py")
TIMEOUT = 60.0


@pytest.fixture
def go_provisioner(kube_cluster: TestCluster) -> pathlib.Path:
    if kube_cluster.kubeconfig is None or not kube_cluster.owns_cluster:
        pytest.skip("needs a real control plane of its own (PYPROVLIB_KUBE_ASSETS)")
    assets = os.environ.get("PYPROVLIB_KUBE_ASSETS", "")
    binary = pathlib.Path(assets) / "csi-provisioner"
    if not assets or not os.access(binary, os.X_OK):
        pytest.skip("PYPROVLIB_KUBE_ASSETS holds no csi-provisioner")
    return binary


@contextlib.asynccontextmanager
async def provisioner(
    peer: str,
    binary: pathlib.Path,
    cluster: TestCluster,
    driver: GoHostpath,
    workdir: pathlib.Path,
    *flags: str,
) -> AsyncIterator[asyncio.subprocess.Process]:
    """The Go csi-provisioner or ``python -m pyprovlib.csi.provisioner`` on ``driver``, with
    the same flags, retrying within a second; stopped with SIGTERM (then SIGKILL)."""
    common = [
        f"--kubeconfig={cluster.kubeconfig}",
        f"--csi-address={driver.endpoint}",
        "--retry-interval-start=100ms",
        "--retry-interval-max=1s",
        "--v=5",
        *flags,
    ]
    if peer == "go":
        argv = [str(binary), *common]
    else:
        argv = [sys.executable, "-m", "pyprovlib.csi.provisioner", "--log-format=json", *common]
    log = (workdir / f"{peer}-provisioner.log").open("wb")
    process = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=log,
        stderr=asyncio.subprocess.STDOUT,
        env=testing.child_env(),
    )
    try:
        yield process
    finally:
        await terminate(process, 30)
        log.close()


@contextlib.asynccontextmanager
async def hostpath(
    cluster: TestCluster, binary: pathlib.Path, directory: pathlib.Path, *extra: str
) -> AsyncIterator[GoHostpath]:
    """A hostpathplugin of its own (its own driver name and node), registered on a Node and
    its CSINode with the driver's topology key (the Go sidecar finds no topology without)."""
    await asyncio.to_thread(directory.mkdir)
    name = f"{cluster.unique_name('hostpath')}.csi.pyprovlib.io"
    node = cluster.unique_name("node")
    async with go_hostpath(binary, directory, name, node_id=node, extra_args=extra) as driver:
        cluster.track(NODES, node)
        cluster.track(CSINODES, node)
        await register_hostpath_node(cluster.api_client, name, node)
        yield driver


async def storage_class(cluster: TestCluster, driver: GoHostpath, **extra: object) -> str:
    name = cluster.unique_name("sc")
    await ResourceClient(cluster.api_client, STORAGE_CLASSES).create(
        class_body(name, driver.name, reclaimPolicy="Delete", **extra)
    )
    cluster.track(STORAGE_CLASSES, name)
    return name


async def bound(cluster: TestCluster, name: str, process: asyncio.subprocess.Process) -> Obj:
    async def check() -> Obj | None:
        if process.returncode is not None:
            raise AssertionError(f"the provisioner exited ({process.returncode})")
        claim = await claim_support.get_claim(cluster, name)
        return claim if claim and (claim.get("status") or {}).get("phase") == "Bound" else None

    result: Obj = await cluster.wait_for(check, timeout=TIMEOUT, message=f"claim {name} bound")
    return result


async def pv_of(cluster: TestCluster, claim: Obj) -> Obj:
    pv = await claim_support.get_volume(cluster.api_client, claim["spec"]["volumeName"])
    assert pv is not None
    return pv


async def delete_and_wait(cluster: TestCluster, *names: str) -> None:
    """Delete the claims and wait until they and their PVs are gone (the provisioner deletes
    the volumes while it still runs)."""
    claims = ResourceClient(cluster.api_client, PERSISTENT_VOLUME_CLAIMS)
    for name in names:
        await claims.delete(name, cluster.namespace)

    async def gone() -> bool:
        left = [await claim_support.get_claim(cluster, name) for name in names]
        volumes = (await ResourceClient(cluster.api_client, PERSISTENT_VOLUMES).list())["items"]
        ours = [
            v
            for v in volumes
            if ((v["spec"].get("claimRef") or {}).get("name") in names)
            and (v["spec"].get("claimRef") or {}).get("namespace") == cluster.namespace
        ]
        return not any(left) and not ours

    await cluster.wait_for(gone, timeout=TIMEOUT, message=f"claims {names} and their PVs gone")


async def test_controller_publish_readonly_side_by_side(
    kube_cluster: TestCluster,
    sock_dir: pathlib.Path,
    hostpathplugin_binary: pathlib.Path,
    go_provisioner: pathlib.Path,
) -> None:
    cluster = kube_cluster
    seen: dict[str, dict[str, object]] = {}
    for peer in PEERS:
        async with (
            hostpath(cluster, hostpathplugin_binary, sock_dir / peer) as driver,
            provisioner(
                peer,
                go_provisioner,
                cluster,
                driver,
                sock_dir,
                "--controller-publish-readonly",
            ) as process,
        ):
            class_name = await storage_class(cluster, driver)
            modes = {"rox": ["ReadOnlyMany"], "rwo": ["ReadWriteOnce"]}
            names = {}
            for key, access in modes.items():
                claim = await claim_support.create_claim(cluster, class_name, accessModes=access)
                names[key] = claim["metadata"]["name"]
            for key, name in names.items():
                pv = await pv_of(cluster, await bound(cluster, name, process))
                seen.setdefault(peer, {})[key] = pv["spec"]["csi"].get("readOnly")
            await delete_and_wait(cluster, *names.values())
    assert seen["go"] == seen["py"] == {"rox": True, "rwo": None}, seen


async def protected_and_terminating(cluster: TestCluster, name: str) -> bool:
    claim = await claim_support.get_claim(cluster, name)
    return (
        claim is not None
        and bool(claim["metadata"].get("deletionTimestamp"))
        and CLONE_FINALIZER in (claim["metadata"].get("finalizers") or [])
    )


async def failed_with(cluster: TestCluster, claim: str, text: str) -> bool:
    events = (await ResourceClient(cluster.api_client, EVENTS).list(cluster.namespace))["items"]
    return any(
        e["involvedObject"].get("name") == claim
        and e.get("reason") == "ProvisioningFailed"
        and text in (e.get("message") or "")
        for e in events
    )


@pytest.mark.parametrize("peer", PEERS)
async def test_a_source_deleted_while_its_clone_waits_side_by_side(
    kube_cluster: TestCluster,
    sock_dir: pathlib.Path,
    hostpathplugin_binary: pathlib.Path,
    go_provisioner: pathlib.Path,
    peer: str,
) -> None:
    cluster = kube_cluster
    claims = ResourceClient(cluster.api_client, PERSISTENT_VOLUME_CLAIMS)
    async with (
        # Room for two 1Gi volumes of kind "fast": the source and a filler.
        hostpath(cluster, hostpathplugin_binary, sock_dir / peer, "--capacity=fast=2Gi") as driver,
        provisioner(peer, go_provisioner, cluster, driver, sock_dir) as process,
    ):
        class_name = await storage_class(cluster, driver, parameters={"kind": "fast"})
        source = (await claim_support.create_claim(cluster, class_name))["metadata"]["name"]
        filler = (await claim_support.create_claim(cluster, class_name))["metadata"]["name"]
        for name in (source, filler):
            await bound(cluster, name, process)
        clone = await claim_support.create_claim(
            cluster,
            class_name,
            dataSource={"kind": "PersistentVolumeClaim", "name": source},
        )
        clone_name = clone["metadata"]["name"]

        async def refused_for_room() -> bool:
            return await failed_with(cluster, clone_name, "ResourceExhausted")

        await cluster.wait_for(refused_for_room, timeout=TIMEOUT, message="clone out of room")
        await claims.delete(source, cluster.namespace)

        async def held() -> bool:
            return await protected_and_terminating(cluster, source)

        await cluster.wait_for(held, timeout=TIMEOUT, message="source Terminating, protected")
        if peer == "go":
            # external-provisioner refuses to clone a source being deleted ...
            refusals = refusal_counter(sock_dir / "go-provisioner.log")
            await cluster.wait_for(
                lambda: _true(refusals() > 0), timeout=TIMEOUT, message="Go refuses the clone"
            )
        filler_handle = await volume_handle(cluster, filler)
        await claims.delete(filler, cluster.namespace)  # room for the clone
        await cluster.wait_for(
            lambda: _true(filler_handle not in driver.volumes()),
            timeout=TIMEOUT,
            message="the filler's volume deleted",
        )

        async def source_gone() -> bool:
            return await claim_support.get_claim(cluster, source) is None

        if peer == "py":
            await bound(cluster, clone_name, process)
            await cluster.wait_for(source_gone, timeout=TIMEOUT, message="source deleted")
            await delete_and_wait(cluster, clone_name)
            return
        # ... even once there is room: the clone stays Pending and keeps its source (Terminating)
        # until the clone is deleted.
        seen = refusals()
        await cluster.wait_for(
            lambda: _true(refusals() > seen), timeout=TIMEOUT, message="Go refuses again"
        )
        current = await claim_support.get_claim(cluster, clone_name)
        assert current is not None
        assert current["status"]["phase"] == "Pending"
        assert await protected_and_terminating(cluster, source)
        assert len(driver.volumes()) == 1  # the source's: no clone was made
        await claims.delete(clone_name, cluster.namespace)
        await cluster.wait_for(source_gone, timeout=TIMEOUT, message="source deleted")


async def _true(value: bool) -> bool:
    return value


def refusal_counter(log: pathlib.Path) -> Callable[[], int]:
    """How often the Go sidecar's log says it refused to clone a source being deleted."""

    def count() -> int:
        return log.read_text(errors="replace").count("is currently being deleted")

    return count


async def volume_handle(cluster: TestCluster, claim: str) -> str:
    current = await claim_support.get_claim(cluster, claim)
    assert current is not None
    handle: str = (await pv_of(cluster, current))["spec"]["csi"]["volumeHandle"]
    return handle

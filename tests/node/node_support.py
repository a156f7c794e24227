"""Helpers for the tests on a real node: pods that write and read a claim, waiting for pods
and objects, and pyprovlib's entry points as the node's processes."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from claim_support import claim_body, class_body
from kubernetes_asyncio.client.exceptions import ApiException

from pyprovlib.kube._objects import Obj
from pyprovlib.kube._resources import STORAGE_CLASSES
from pyprovlib.testing._binder import HttpTransport
from pyprovlib.testing._cluster import TestCluster
from pyprovlib.testing._node import KubeletNode

T = TypeVar("T")

BUSYBOX = "registry.k8s.io/e2e-test-images/busybox:1.37.0-1"
MOUNT = "/data"


def claim(name: str, storage_class: str, size: str = "1Mi") -> Obj:
    return claim_body(name, storage_class, size=size)


def pod(name: str, claim_name: str, script: str, *, restart: str = "Never") -> Obj:
    """A busybox pod running ``sh -c script`` with the claim mounted at :data:`MOUNT`."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": restart,
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": BUSYBOX,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["sh", "-c", script],
                    "volumeMounts": [{"name": "volume", "mountPath": MOUNT}],
                }
            ],
            "volumes": [{"name": "volume", "persistentVolumeClaim": {"claimName": claim_name}}],
        },
    }


async def until(probe: Callable[[], Awaitable[T | None]], what: str, *, within: float = 120.0) -> T:
    """Poll ``probe`` until it returns something other than None or False."""
    deadline = time.monotonic() + within
    while True:
        value = await probe()
        if value is not None and value is not False:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within:.0f}s waiting for {what}")
        await asyncio.sleep(0.5)


async def create_storage_class(
    cluster: TestCluster, name: str, provisioner: str, **fields: Any
) -> str:
    """The StorageClass ``name`` of ``provisioner`` binding on first consumer (``fields``
    added), removed with the cluster's objects; its name."""
    await http(cluster).json(
        "POST",
        STORAGE_CLASSES.path(),
        body=class_body(name, provisioner, volumeBindingMode="WaitForFirstConsumer", **fields),
    )
    cluster.track(STORAGE_CLASSES, name)
    return name


async def write(cluster: TestCluster, claim_name: str, text: str) -> None:
    """A pod ``writer`` writes ``text`` to a file on the claim's volume and completes."""
    await create(cluster, "pods", pod("writer", claim_name, f"echo {text} > {MOUNT}/file"))
    await pod_phase(cluster, "writer", {"Succeeded"})


async def read_back(cluster: TestCluster, claim_name: str, text: str) -> None:
    """Persistence: the ``writer`` pod gone, a new pod on the same claim finds ``text`` in the
    file; that pod is deleted and gone too."""
    await delete(cluster, ns_path(cluster, "pods", "writer"))
    await create(cluster, "pods", pod("reader", claim_name, f'test "$(cat {MOUNT}/file)" = {text}'))
    await pod_phase(cluster, "reader", {"Succeeded"})
    await delete(cluster, ns_path(cluster, "pods", "reader"))
    await gone(cluster, ns_path(cluster, "pods", "reader"))


def http(cluster: TestCluster) -> HttpTransport:
    return HttpTransport(cluster.api_client)


async def get(cluster: TestCluster, path: str) -> Obj | None:
    try:
        return await http(cluster).json("GET", path)
    except ApiException as err:
        if err.status == 404:
            return None
        raise


def ns_path(cluster: TestCluster, plural: str, name: str = "") -> str:
    base = f"/api/v1/namespaces/{cluster.namespace}/{plural}"
    return f"{base}/{name}" if name else base


async def create(cluster: TestCluster, plural: str, body: Obj) -> Obj:
    return await http(cluster).json("POST", ns_path(cluster, plural), body=body)


async def delete(cluster: TestCluster, path: str) -> None:
    try:
        await http(cluster).json("DELETE", path)
    except ApiException as err:
        if err.status != 404:
            raise


async def pod_phase(cluster: TestCluster, name: str, phases: set[str], **kw: Any) -> Obj:
    """Wait until pod ``name`` reaches one of ``phases``; a pod that ends in another final
    phase fails at once, with its status."""

    async def probe() -> Obj | None:
        found = await get(cluster, ns_path(cluster, "pods", name))
        phase = ((found or {}).get("status") or {}).get("phase")
        if phase in phases:
            return found
        if phase in ("Succeeded", "Failed"):
            raise AssertionError(
                f"pod {name} ended {phase}: {found.get('status') if found else ''}"
            )
        return None

    return await until(probe, f"pod {name} {'/'.join(sorted(phases))}", **kw)


async def gone(cluster: TestCluster, path: str, **kw: Any) -> None:
    async def probe() -> bool:
        return await get(cluster, path) is None

    await until(probe, f"{path} to be deleted", **kw)


async def bound_volume(cluster: TestCluster, claim_name: str, **kw: Any) -> Obj:
    """Wait for the claim to be Bound; returns its PersistentVolume."""

    async def probe() -> Obj | None:
        found = await get(cluster, ns_path(cluster, "persistentvolumeclaims", claim_name))
        if ((found or {}).get("status") or {}).get("phase") != "Bound":
            return None
        assert found is not None
        return await get(cluster, f"/api/v1/persistentvolumes/{found['spec']['volumeName']}")

    return await until(probe, f"claim {claim_name} Bound", **kw)


async def events_for(cluster: TestCluster, name: str) -> list[Obj]:
    listing = await http(cluster).json(
        "GET",
        ns_path(cluster, "events"),
        query={"fieldSelector": f"involvedObject.name={name}"},
    )
    return list(listing.get("items") or [])


def python_module(module: str, *argv: str) -> list[str]:
    return [sys.executable, "-m", module, *argv]


def kubeconfig(node: KubeletNode) -> str:
    path: Path | None = node.plane.kubeconfig_path
    assert path is not None
    return str(path)

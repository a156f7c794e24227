"""The binder plays kube-controller-manager's pvc-protection and pv-protection controllers: a
real kube-apiserver puts those finalizers on every claim and PV, and where the binder stands in
for kube-controller-manager nothing else removes them (no claim or PV could be deleted). The
in-memory server adds no such finalizer, so the tests put them on by hand."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException

from pyprovlib.kube._config import request_json
from pyprovlib.testing._binder import PVBinder
from pyprovlib.testing._server import ApiServer
from pyprovlib.testing._support import wait_idle

NS = "protection"
CLAIMS = f"/api/v1/namespaces/{NS}/persistentvolumeclaims"
PODS = f"/api/v1/namespaces/{NS}/pods"


async def gone(client: ApiClient, path: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            await request_json(client, "GET", path)
        except ApiException as err:
            if err.status == 404:
                return
            raise
        await asyncio.sleep(0.02)
    raise AssertionError(f"{path} still exists after {timeout}s")


def protected_claim(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "finalizers": ["kubernetes.io/pvc-protection"]},
        "spec": {
            "storageClassName": "",
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }


def pod_using(name: str, claim: str, node: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "image": "busybox"}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
        },
    }


async def test_a_deleting_claim_is_released_once_no_scheduled_pod_uses_it(
    apiserver: ApiServer,
) -> None:
    async with (
        apiserver.api_client() as client,
        apiserver.api_client() as binder_client,
        PVBinder(binder_client) as binder,
    ):
        await request_json(client, "POST", "/api/v1/namespaces", body={"metadata": {"name": NS}})
        await request_json(client, "POST", CLAIMS, body=protected_claim("used"))
        await request_json(client, "POST", PODS, body=pod_using("user", "used", "node-1"))
        # An unscheduled pod holds nothing (kubelet only starts scheduled pods).
        await request_json(client, "POST", PODS, body=pod_using("pending", "free", ""))
        await request_json(client, "POST", CLAIMS, body=protected_claim("free"))

        await request_json(client, "DELETE", f"{CLAIMS}/free")
        await gone(client, f"{CLAIMS}/free")

        deleting = await request_json(client, "DELETE", f"{CLAIMS}/used")
        await wait_idle(binder, deleting, timeout=20)
        kept = await request_json(client, "GET", f"{CLAIMS}/used")
        assert kept["metadata"]["finalizers"] == ["kubernetes.io/pvc-protection"]

        await request_json(client, "DELETE", f"{PODS}/user", body={"gracePeriodSeconds": 0})
        await gone(client, f"{PODS}/user")
        # The binder does not watch pods: its resync finds the claim unused.
        await gone(client, f"{CLAIMS}/used")


async def test_a_deleting_volume_is_released_once_it_is_not_bound(
    apiserver_with_binder: ApiServer,
) -> None:
    async with apiserver_with_binder.api_client() as client:
        volume = {
            "metadata": {"name": "pv-protected", "finalizers": ["kubernetes.io/pv-protection"]},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain",
                "hostPath": {"path": "/tmp/pv-protected"},
            },
        }
        await request_json(client, "POST", "/api/v1/persistentvolumes", body=volume)
        await request_json(client, "DELETE", "/api/v1/persistentvolumes/pv-protected")
        await gone(client, "/api/v1/persistentvolumes/pv-protected")

"""Cluster objects a kubelet-less control plane needs: Ready nodes, and waiting for objects and
CRDs to exist."""

from __future__ import annotations

import time
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

__all__ = ["register_ready_node"]


async def _exists(http: Any, path: str) -> bool:
    try:
        await http.json("GET", path)
    except ApiException as err:
        if err.status == 404:
            return False
        raise
    return True


async def _established(http: Any, path: str) -> bool:
    crd = await http.json("GET", path)
    conditions = (crd.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)


async def register_ready_node(http: Any, name: str, labels: dict[str, str] | None = None) -> Any:
    """Create a Node as a kubelet registering would, Ready with capacity, and without the
    ``node.kubernetes.io/not-ready`` taint the apiserver puts on new nodes — so the scheduler
    places pods on it (they never run: there is no kubelet)."""
    body = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                **(labels or {}),
            },
        },
    }
    path = f"/api/v1/nodes/{name}"
    try:
        await http.json("POST", "/api/v1/nodes", body=body)
    except ApiException as err:
        if err.status != 409:
            raise
    resources = {"cpu": "8", "memory": "32Gi", "pods": "110", "ephemeral-storage": "100Gi"}
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    ready = {
        "type": "Ready",
        "status": "True",
        "reason": "KubeletReady",
        "message": "pyprovlib: a kubelet-less node",
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }
    await http.json(
        "PATCH",
        f"{path}/status",
        body={"status": {"conditions": [ready], "capacity": resources, "allocatable": resources}},
        content_type="application/merge-patch+json",
    )
    return await http.json(
        "PATCH",
        path,
        body={"spec": {"taints": None}},
        content_type="application/merge-patch+json",
    )

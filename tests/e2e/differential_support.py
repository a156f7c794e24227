"""What the differential tests (``test_differential*.py``) share: the two sides (the in-memory
API server and a real kube-apiserver), requests and their observations, normalisation, object
builders, and the e2e mark with its skip when no real kube-apiserver is configured.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import secrets
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from claim_support import claim_body
from kubernetes_asyncio.client import ApiClient

from pyprovlib.testing._cluster import TestCluster
from pyprovlib.testing._server import ApiServer

# A real kube-apiserver comes from a kubeconfig or from the launcher of an assets directory.
_REAL_CLUSTER_ENV = ("PYPROVLIB_E2E_KUBECONFIG", "PYPROVLIB_KUBE_ASSETS", "KUBEBUILDER_ASSETS")

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        not any(os.environ.get(name) for name in _REAL_CLUSTER_ENV),
        reason="differential test: no real kube-apiserver (set PYPROVLIB_E2E_KUBECONFIG "
        "or PYPROVLIB_KUBE_ASSETS)",
    ),
]

JSON = "application/json"
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
# Classes nobody provisions: no controller of a real cluster acts on the claims of this file.
NO_CLASS = "pyprovlib-differential-none"
# The in-memory server answers /version with an all-zero commit; a real one never does.
IN_MEMORY_COMMIT = "0" * 40
# Finalizers the real apiserver's StorageObjectInUseProtection admission adds to every PV and
# PVC (a known difference, see the row "pvc-create-protection-finalizer"); other rows ignore them.
PROTECTION_FINALIZERS = ("kubernetes.io/pvc-protection", "kubernetes.io/pv-protection")

_VOLATILE_META = (
    "uid",
    "resourceVersion",
    "creationTimestamp",
    "managedFields",
    "selfLink",
    "generation",
)
_TIMESTAMPS = (
    "lastTransitionTime",
    "lastProbeTime",
    "lastPhaseTransitionTime",
    "lastHeartbeatTime",
)


@dataclass
class Response:
    code: int
    body: Any
    warnings: list[str]


@dataclass
class Side:
    """One server under test: a client, a namespace and a unique token for cluster-scoped names
    (the same token on both sides, so the names compare equal)."""

    name: str
    api: ApiClient
    namespace: str
    token: str
    keep_protection: bool = False
    transcript: list[tuple[str, Any]] = field(default_factory=list)
    cleanup: list[str] = field(default_factory=list)

    def cluster_name(self, base: str) -> str:
        return f"{base}-{self.token}"

    def ns_path(self, resource: str, name: str = "", sub: str = "") -> str:
        path = f"/api/v1/namespaces/{self.namespace}/{resource}"
        return path + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = JSON,
        query: dict[str, str] | None = None,
    ) -> Response:
        resp: aiohttp.ClientResponse = await self.api.call_api(
            path,
            method,
            query_params=list((query or {}).items()),
            header_params={"Content-Type": content_type, "Accept": JSON},
            body=body,
            auth_settings=["BearerToken"],
            _preload_content=False,
            _request_timeout=30.0,
        )
        try:
            data = await resp.read()
        finally:
            resp.release()
        warnings = resp.headers.getall("Warning", [])
        try:
            parsed = json.loads(data) if data else None
        except ValueError:
            parsed = data.decode(errors="replace")
        return Response(resp.status, parsed, list(warnings))

    def record(self, label: str, value: Any) -> None:
        self.transcript.append((label, value))

    async def do(
        self,
        label: str,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = JSON,
        query: dict[str, str] | None = None,
        warnings: bool = False,
    ) -> Response:
        """Send one request and record its status code, reason and normalised object."""
        resp = await self.request(method, path, body, content_type=content_type, query=query)
        seen = observe(resp, self)
        if warnings:
            seen["warnings"] = sorted(_normalise_warning(w) for w in resp.warnings)
        self.record(label, seen)
        return resp

    async def stream(self, path: str, query: dict[str, str]) -> list[dict[str, Any]]:
        """A watch's events until the server ends it (``timeoutSeconds`` in ``query``)."""
        resp: aiohttp.ClientResponse = await self.api.call_api(
            path,
            "GET",
            query_params=list(query.items()),
            header_params={"Accept": JSON},
            auth_settings=["BearerToken"],
            _preload_content=False,
            _request_timeout=aiohttp.ClientTimeout(total=60, sock_connect=10),
        )
        events: list[dict[str, Any]] = []
        try:
            if resp.status != 200:
                events.append({"code": resp.status})
                return events
            async for line in resp.content:
                if line.strip():
                    events.append(json.loads(line))
        finally:
            resp.release()
        return events


@contextlib.asynccontextmanager
async def two_sides(cluster: TestCluster, in_memory: ApiServer) -> AsyncIterator[tuple[Side, Side]]:
    """The in-memory side (its namespace created, named as the real one) and the real side,
    sharing one fresh token."""
    token = secrets.token_hex(4)
    async with in_memory.api_client() as mem_client:
        mem = Side("in-memory", mem_client, cluster.namespace, token)
        ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": mem.namespace}}
        assert (await mem.request("POST", "/api/v1/namespaces", ns)).code == 201
        yield mem, Side("real", cluster.api_client, cluster.namespace, token)


async def transcript_of(side: Side, row: Awaitable[None]) -> list[tuple[str, Any]]:
    """Run ``row`` (a row's steps on ``side``), then delete what it left; its transcript."""
    try:
        await row
    finally:
        for path in side.cleanup:
            await side.request("DELETE", path)
    return side.transcript


def assert_same_answers(
    row_id: str, summary: str, mem_t: list[tuple[str, Any]], real_t: list[tuple[str, Any]]
) -> None:
    """Print the two transcripts step by step (``DIFF`` rows with both answers), then fail on
    the first step the sides answered differently."""
    print(f"\n== row {row_id}: {summary}")
    for (label, mine), (_, theirs) in zip(mem_t, real_t, strict=False):
        mark = "same" if mine == theirs else "DIFF"
        print(f"  [{mark}] {label}: in-memory={json.dumps(mine, sort_keys=True)}")
        if mine != theirs:
            print(f"  [{mark}] {label}: real     ={json.dumps(theirs, sort_keys=True)}")
    assert [label for label, _ in mem_t] == [label for label, _ in real_t]
    for (label, mine), (_, theirs) in zip(mem_t, real_t, strict=True):
        assert mine == theirs, f"{row_id}: step {label!r} differs"


def _normalise_warning(text: str) -> str:
    # RFC 7234 warn-code and agent: "299 - "message""
    parts = text.split(" ", 2)
    return parts[2].strip('"') if len(parts) == 3 else text


def normalise(obj: Any, side: Side) -> Any:
    """The object without what legitimately differs between two servers."""
    if not isinstance(obj, dict):
        return obj
    out = copy.deepcopy(obj)
    meta = out.get("metadata")
    if isinstance(meta, dict):
        for key in _VOLATILE_META:
            meta.pop(key, None)
        if "deletionTimestamp" in meta:
            meta["deletionTimestamp"] = "<set>"
        if not side.keep_protection and "finalizers" in meta:
            kept = [f for f in meta["finalizers"] if f not in PROTECTION_FINALIZERS]
            if kept:
                meta["finalizers"] = kept
            else:
                del meta["finalizers"]
        if "continue" in meta:
            meta["continue"] = "<set>" if meta["continue"] else ""
        if not meta:
            del out["metadata"]
    status = out.get("status")
    if isinstance(status, dict):
        for key in _TIMESTAMPS:
            status.pop(key, None)
        for condition in status.get("conditions") or []:
            for key in _TIMESTAMPS:
                condition.pop(key, None)
    if isinstance(out.get("items"), list):
        out["items"] = [normalise(item, side) for item in out["items"]]
    return out


def observe(resp: Response, side: Side) -> dict[str, Any]:
    """What a response says: the code, and the Status' reason and causes or the object."""
    body = resp.body
    seen: dict[str, Any] = {"code": resp.code}
    if isinstance(body, dict) and body.get("kind") == "Status":
        seen["reason"] = body.get("reason", "")
        seen["status"] = body.get("status")
        causes = (body.get("details") or {}).get("causes") or []
        if causes:
            # a set: kube-apiserver repeats some causes (ObjectMeta validated twice on update)
            seen["causes"] = sorted({(c.get("reason", ""), c.get("field", "")) for c in causes})
    else:
        seen["object"] = normalise(body, side)
    return seen


# ---------------------------------------------------------------------------------------------
# Bodies


def claim(name: str, **spec: Any) -> dict[str, Any]:
    """A 1Gi claim of :data:`NO_CLASS` (no PV controller binds it), with ``spec`` added."""
    return claim_body(name, NO_CLASS, **spec)


DRIVER = "differential.pyprovlib.example.com"


def volume(
    name: str, *, storage_class: str = "pyprovlib-differential-pv-only", **spec: Any
) -> dict[str, Any]:
    """A retained 1Gi CSI PV of :data:`DRIVER` in ``storage_class``, with ``spec`` added."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "storageClassName": storage_class,
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "csi": {"driver": DRIVER, "volumeHandle": name},
            **spec,
        },
    }


def config_map(name: str, labels: dict[str, str] | None = None, **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "labels": labels or {}, **meta},
        "data": {"k": "v"},
    }


def core_event(name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name},
        "involvedObject": {"kind": "ConfigMap", "namespace": namespace, "name": "cm"},
        "reason": "Differential",
        "message": "a row of the differential test",
        "type": "Normal",
        "source": {"component": "differential"},
    }


async def require_real_apiserver(cluster: TestCluster) -> None:
    """Skip unless ``cluster`` is a real kube-apiserver."""
    if not cluster.is_real:
        pytest.skip("differential test: no real kube-apiserver (set PYPROVLIB_E2E_KUBECONFIG)")
    side = Side("real", cluster.api_client, cluster.namespace, "")
    resp = await side.request("GET", "/version")
    if not isinstance(resp.body, dict) or resp.body.get("gitCommit") == IN_MEMORY_COMMIT:
        pytest.skip(
            "differential test: the cluster is pyprovlib's in-memory server, not kube-apiserver"
        )

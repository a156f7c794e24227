"""Regression tests for the differences tests/e2e/test_differential.py found between the
in-memory server and kube-apiserver v1.36 (each answer here is what the real one gave)."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio.client import ApiClient

from pyprovlib.testing._server import ApiServer

NS = "/api/v1/namespaces/default"


async def call(
    client: ApiClient,
    method: str,
    path: str,
    body: Any = None,
    *,
    content_type: str = "application/json",
    **query: str,
) -> tuple[int, Any]:
    resp: aiohttp.ClientResponse = await client.call_api(
        path,
        method,
        query_params=list(query.items()),
        header_params={"Content-Type": content_type, "Accept": "application/json"},
        body=body,
        _preload_content=False,
    )
    try:
        return resp.status, json.loads(await resp.read())
    finally:
        resp.release()


def claim(name: str, modes: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name},
        "spec": {"accessModes": modes, "resources": {"requests": {"storage": "1Gi"}}},
    }


def causes(body: Any) -> list[tuple[str, str]]:
    return sorted((c["reason"], c["field"]) for c in body["details"]["causes"])


async def test_strategic_merge_puts_the_patch_items_first(kube_client: ApiClient) -> None:
    cm = {"metadata": {"name": "cm", "finalizers": ["example.com/a"]}}
    assert (await call(kube_client, "POST", f"{NS}/configmaps", cm))[0] == 201
    code, out = await call(
        kube_client,
        "PATCH",
        f"{NS}/configmaps/cm",
        {"metadata": {"finalizers": ["example.com/b"]}},
        content_type="application/strategic-merge-patch+json",
    )
    assert code == 200
    assert out["metadata"]["finalizers"] == ["example.com/b", "example.com/a"]


@pytest.mark.parametrize(
    ("query", "field"),
    [({"dryRun": "Some"}, "dryRun"), ({"fieldValidation": "Loud"}, "fieldValidation")],
)
async def test_invalid_write_options_are_422(
    kube_client: ApiClient, query: dict[str, str], field: str
) -> None:
    code, body = await call(
        kube_client, "POST", f"{NS}/persistentvolumeclaims", claim("c", ["ReadWriteOnce"]), **query
    )
    assert (code, body["reason"]) == (422, "Invalid")
    assert causes(body) == [("FieldValueNotSupported", field)]
    assert body["details"]["kind"] == "CreateOptions"


async def test_negative_limit_lists_everything(kube_client: ApiClient) -> None:
    for name in ("a", "b", "c"):
        await call(kube_client, "POST", f"{NS}/configmaps", {"metadata": {"name": name}})
    code, body = await call(kube_client, "GET", f"{NS}/configmaps", limit="-1")
    assert code == 200
    assert [i["metadata"]["name"] for i in body["items"]] == ["a", "b", "c"]
    assert "continue" not in body["metadata"]


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ({"sendInitialEvents": "true"}, [("FieldValueForbidden", "resourceVersionMatch")]),
        (
            {"resourceVersionMatch": "NotOlderThan"},
            [("FieldValueForbidden", "resourceVersionMatch")],
        ),
        (
            {"sendInitialEvents": "true", "resourceVersionMatch": "Exact"},
            [
                ("FieldValueForbidden", "resourceVersionMatch"),
                ("FieldValueNotSupported", "resourceVersionMatch"),
            ],
        ),
    ],
)
async def test_watch_options_are_validated(
    kube_client: ApiClient, query: dict[str, str], expected: list[tuple[str, str]]
) -> None:
    code, body = await call(kube_client, "GET", f"{NS}/configmaps", watch="1", **query)
    assert (code, body["reason"]) == (422, "Invalid")
    assert causes(body) == expected


@pytest.mark.parametrize(
    ("modes", "expected"),
    [
        (["ReadSometimes"], [("FieldValueNotSupported", "spec.accessModes")]),
        (["ReadWriteOncePod", "ReadWriteOnce"], [("FieldValueForbidden", "spec.accessModes")]),
    ],
)
async def test_access_modes_are_validated(
    apiserver: ApiServer, kube_client: ApiClient, modes: list[str], expected: Any
) -> None:
    code, body = await call(kube_client, "POST", f"{NS}/persistentvolumeclaims", claim("c", modes))
    assert code == 422
    assert causes(body) == expected
    volume = {
        "metadata": {"name": "pv"},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": modes,
            "csi": {"driver": "d", "volumeHandle": "h"},
        },
    }
    code, body = await call(kube_client, "POST", "/api/v1/persistentvolumes", volume)
    assert code == 422
    assert causes(body) == expected
    assert apiserver.storage.list("persistentvolumes") == []


async def test_volume_without_capacity_has_both_causes(kube_client: ApiClient) -> None:
    volume = {
        "metadata": {"name": "pv"},
        "spec": {"accessModes": ["ReadWriteOnce"], "csi": {"driver": "d", "volumeHandle": "h"}},
    }
    code, body = await call(kube_client, "POST", "/api/v1/persistentvolumes", volume)
    assert code == 422
    assert causes(body) == [
        ("FieldValueNotSupported", "spec.capacity"),
        ("FieldValueRequired", "spec.capacity"),
    ]

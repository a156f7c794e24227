"""Discovery, OpenAPI and Table output of pyprovlib.testing.ApiServer."""

from __future__ import annotations

import aiohttp
from kubernetes_asyncio.client import ApiClient, CoreV1Api, VersionApi
from server_support import get_json

from pyprovlib.kube._resources import RESOURCES
from pyprovlib.testing._discovery import human_duration
from pyprovlib.testing._server import ApiServer

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"


async def test_version_and_groups(apiserver: ApiServer, kube_client: ApiClient) -> None:
    info = await VersionApi(kube_client).get_code()
    assert info.major == "1"
    assert info.git_version.startswith("v1.")
    api = await get_json(apiserver, "/api")
    assert api["kind"] == "APIVersions"
    assert api["versions"] == ["v1"]
    groups = await get_json(apiserver, "/apis")
    names = {g["name"] for g in groups["groups"]}
    assert names == {
        "apps",
        "storage.k8s.io",
        "coordination.k8s.io",
        "events.k8s.io",
        "snapshot.storage.k8s.io",
    }
    group = await get_json(apiserver, "/apis/storage.k8s.io")
    assert group["preferredVersion"]["groupVersion"] == "storage.k8s.io/v1"


async def test_resource_lists_cover_every_resource(apiserver: ApiServer) -> None:
    for r in RESOURCES:
        path = "/api/v1" if not r.group else f"/apis/{r.group}/{r.version}"
        body = await get_json(apiserver, path)
        assert body["kind"] == "APIResourceList"
        entries = {e["name"]: e for e in body["resources"]}
        entry = entries[r.plural]
        assert entry["kind"] == r.kind
        assert entry["namespaced"] == r.namespaced
        assert "watch" in entry["verbs"]
        for sub in r.subresources:
            assert entries[f"{r.plural}/{sub}"]["verbs"] == ["get", "patch", "update"]
    core = await get_json(apiserver, "/api/v1")
    pvc = next(e for e in core["resources"] if e["name"] == "persistentvolumeclaims")
    assert pvc["shortNames"] == ["pvc"]
    assert pvc["singularName"] == "persistentvolumeclaim"


async def test_openapi_v3_advertises_field_validation(apiserver: ApiServer) -> None:
    root = await get_json(apiserver, "/openapi/v3")
    url = root["paths"]["apis/storage.k8s.io/v1"]["serverRelativeURL"]
    doc = await get_json(apiserver, url)
    item = doc["paths"]["/apis/storage.k8s.io/v1/storageclasses/{name}"]
    patch = item["patch"]
    assert patch["x-kubernetes-group-version-kind"] == {
        "group": "storage.k8s.io",
        "version": "v1",
        "kind": "StorageClass",
    }
    assert "fieldValidation" in {p["name"] for p in patch["parameters"]}


async def test_health_endpoints(apiserver: ApiServer) -> None:
    async with aiohttp.ClientSession() as session:
        for path in ("/healthz", "/readyz", "/livez"):
            async with session.get(apiserver.url + path) as resp:
                assert resp.status == 200
                assert await resp.text() == "ok"


async def test_table_output(apiserver: ApiServer, kube_client: ApiClient) -> None:
    v1 = CoreV1Api(kube_client)
    await v1.create_persistent_volume(
        {
            "metadata": {"name": "pv1"},
            "spec": {
                "capacity": {"storage": "5Gi"},
                "accessModes": ["ReadWriteOnce", "ReadOnlyMany"],
                "hostPath": {"path": "/x"},
                "storageClassName": "fast",
                "claimRef": {"namespace": "default", "name": "c"},
            },
        }
    )
    table = await get_json(apiserver, "/api/v1/persistentvolumes", TABLE)
    assert (table["kind"], table["apiVersion"]) == ("Table", "meta.k8s.io/v1")
    columns = [c["name"] for c in table["columnDefinitions"] if c["priority"] == 0]
    assert columns[:7] == [
        "Name",
        "Capacity",
        "Access Modes",
        "Reclaim Policy",
        "Status",
        "Claim",
        "StorageClass",
    ]
    assert columns[-1] == "Age"
    cells = table["rows"][0]["cells"]
    assert cells[:7] == ["pv1", "5Gi", "RWO,ROX", "Retain", "Pending", "default/c", "fast"]
    assert table["rows"][0]["object"]["kind"] == "PartialObjectMetadata"
    one = await get_json(apiserver, "/api/v1/namespaces/default", TABLE)
    assert one["rows"][0]["cells"][:2] == ["default", "Active"]
    plain = await get_json(apiserver, "/api/v1/namespaces/default")
    assert plain["kind"] == "Namespace"


def test_human_duration() -> None:
    assert human_duration(5) == "5s"
    assert human_duration(130) == "2m10s"
    assert human_duration(3600 * 5 + 60) == "5h1m"
    assert human_duration(86400 * 3) == "3d"
    assert human_duration(86400 * 30) == "30d"

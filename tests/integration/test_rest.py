"""ResourceClient against the in-memory API server over HTTP: CRUD, patches, pagination,
watch streaming (events, server timeout, 410) and errors as ApiException."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from api_support import error_body
from claim_support import volume_body
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException

from pyprovlib.kube._errors import is_conflict, is_gone, is_not_found, retry_after_seconds
from pyprovlib.kube._objects import Obj
from pyprovlib.kube._resources import NAMESPACES, PERSISTENT_VOLUME_CLAIMS, PERSISTENT_VOLUMES
from pyprovlib.kube._rest import ResourceClient, WatchExpiredError, iterate_pages
from pyprovlib.testing import eventually
from pyprovlib.testing._server import ApiServer


def claim(name: str, ns: str = "default", size: str = "1Gi") -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": "x"}},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": size}},
            "storageClassName": "fast",
        },
    }


@pytest.fixture
def pvcs(kube_client: ApiClient) -> ResourceClient:
    return ResourceClient(kube_client, PERSISTENT_VOLUME_CLAIMS)


async def test_crud_and_patches_round_trip_json(pvcs: ResourceClient) -> None:
    created = await pvcs.create(claim("c1"))
    assert created["metadata"]["uid"]
    rv1 = created["metadata"]["resourceVersion"]
    got = await pvcs.get("c1", "default")
    assert got == created

    got["metadata"].setdefault("annotations", {})["a"] = "1"
    replaced = await pvcs.replace(got)
    assert replaced["metadata"]["annotations"] == {"a": "1"}
    assert replaced["metadata"]["resourceVersion"] != rv1

    with pytest.raises(ApiException) as stale:
        await pvcs.replace(created)  # old resourceVersion
    assert is_conflict(stale.value)

    merged = await pvcs.patch("c1", {"metadata": {"labels": {"b": "2"}}}, namespace="default")
    assert merged["metadata"]["labels"] == {"app": "x", "b": "2"}
    jsonp = await pvcs.patch(
        "c1",
        [{"op": "add", "path": "/metadata/annotations/c", "value": "3"}],
        namespace="default",
        patch_type="json",
    )
    assert jsonp["metadata"]["annotations"] == {"a": "1", "c": "3"}
    strategic = await pvcs.patch(
        "c1", {"metadata": {"finalizers": ["x/y"]}}, namespace="default", patch_type="strategic"
    )
    assert strategic["metadata"]["finalizers"] == ["x/y"]

    status = dict(strategic)
    status["status"] = {"phase": "Bound"}
    after_status = await pvcs.replace_status(status)
    assert after_status["status"]["phase"] == "Bound"
    status_patch = await pvcs.patch(
        "c1", {"status": {"phase": "Lost"}}, namespace="default", subresource="status"
    )
    assert status_patch["status"]["phase"] == "Lost"

    # A finalizer keeps the object: delete returns it with a deletionTimestamp.
    held = await pvcs.delete("c1", "default")
    assert held is not None
    assert held["metadata"]["deletionTimestamp"]
    await pvcs.patch("c1", {"metadata": {"finalizers": None}}, namespace="default")
    with pytest.raises(ApiException) as missing:
        await pvcs.get("c1", "default")
    assert is_not_found(missing.value)


async def test_delete_preconditions_and_cluster_scoped(kube_client: ApiClient) -> None:
    pvs = ResourceClient(kube_client, PERSISTENT_VOLUMES)
    pv = await pvs.create(volume_body("pv-1"))
    with pytest.raises(ApiException) as wrong_uid:
        await pvs.delete("pv-1", preconditions={"uid": "not-the-uid"})
    assert wrong_uid.value.status == 409
    await pvs.delete("pv-1", preconditions={"uid": pv["metadata"]["uid"]})
    with pytest.raises(ApiException) as gone:
        await pvs.get("pv-1")
    assert is_not_found(gone.value)


async def test_paginated_list_with_selectors(kube_client: ApiClient, pvcs: ResourceClient) -> None:
    namespaces = ResourceClient(kube_client, NAMESPACES)
    for ns in ("ns-a", "ns-b"):
        await namespaces.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    for i in range(7):
        c = claim(f"p{i}", ns="ns-a" if i % 2 else "ns-b")
        if i == 3:
            c["metadata"]["labels"] = {"app": "other"}
        await pvcs.create(c)
    first = await pvcs.list(limit=3)
    assert len(first["items"]) == 3
    assert first["metadata"]["continue"]
    names = sorted([o["metadata"]["name"] async for o in iterate_pages(pvcs, limit=2)])
    assert names == [f"p{i}" for i in range(7)]
    ns_a = await pvcs.list("ns-a")
    assert sorted(o["metadata"]["name"] for o in ns_a["items"]) == ["p1", "p3", "p5"]
    labelled = await pvcs.list(label_selector="app=x")
    assert len(labelled["items"]) == 6
    by_field = await pvcs.list(field_selector="metadata.name=p4")
    assert [o["metadata"]["name"] for o in by_field["items"]] == ["p4"]


async def test_watch_streams_events_and_closes_on_exit(
    apiserver: ApiServer, pvcs: ResourceClient
) -> None:
    listed = await pvcs.list()
    rv = listed["metadata"]["resourceVersion"]
    seen: list[tuple[str, str]] = []
    async with pvcs.watch(resource_version=rv, timeout_seconds=30) as events:
        await pvcs.create(claim("w1"))
        await pvcs.patch("w1", {"metadata": {"labels": {"z": "1"}}}, namespace="default")
        await pvcs.delete("w1", "default")
        async for event in events:
            if event["type"] == "BOOKMARK":
                continue
            seen.append((event["type"], event["object"]["metadata"]["name"]))
            if len(seen) == 3:
                break
    assert seen == [("ADDED", "w1"), ("MODIFIED", "w1"), ("DELETED", "w1")]
    await _until(lambda: apiserver.open_watches == 0, "server-side watch closed")


async def test_watch_server_timeout_ends_iteration_normally(pvcs: ResourceClient) -> None:
    listed = await pvcs.list()
    async with pvcs.watch(
        resource_version=listed["metadata"]["resourceVersion"],
        timeout_seconds=1,
        allow_bookmarks=False,
    ) as events:
        got = [e async for e in events]
    assert got == []


async def test_watch_from_compacted_version_raises_expired(
    apiserver: ApiServer, pvcs: ResourceClient
) -> None:
    await pvcs.create(claim("old"))
    rv = (await pvcs.list())["metadata"]["resourceVersion"]
    await pvcs.create(claim("new"))
    apiserver.compact()

    async def drain() -> None:
        async with pvcs.watch(resource_version=rv, timeout_seconds=10) as events:
            async for _ in events:
                pass

    with pytest.raises(WatchExpiredError) as err:
        await drain()
    assert is_gone(err.value)
    assert err.value.status_object["code"] == 410


async def test_http_errors_surface_as_api_exception(
    apiserver: ApiServer, pvcs: ResourceClient
) -> None:
    apiserver.faults.fail(429, verb="list", resource="persistentvolumeclaims", retry_after=3)
    with pytest.raises(ApiException) as throttled:
        await pvcs.list()
    assert throttled.value.status == 429
    assert retry_after_seconds(throttled.value) == 3
    assert error_body(throttled.value)["code"] == 429
    apiserver.faults.fail(500, verb="watch", resource="persistentvolumeclaims")
    with pytest.raises(ApiException) as broken:
        async with pvcs.watch(timeout_seconds=5):
            pass
    assert broken.value.status == 500


async def _until(cond: Callable[[], object], what: str) -> None:
    await eventually(cond, timeout=5, message=what)

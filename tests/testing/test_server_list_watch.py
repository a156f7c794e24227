"""LIST and WATCH of pyprovlib.testing.ApiServer: selectors, pagination, resourceVersion
semantics, bookmarks, timeouts, 410 Expired, dropped watches."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from api_support import error_body
from kubernetes_asyncio import watch
from kubernetes_asyncio.client import ApiClient, CoreV1Api
from kubernetes_asyncio.client.exceptions import ApiException

from pyprovlib.testing._selectors import parse_field_selector, parse_label_selector
from pyprovlib.testing._server import ApiServer
from pyprovlib.testing._status import ApiError

CM = "/api/v1/namespaces/default/configmaps"


async def make_cm(v1: CoreV1Api, name: str, labels: dict[str, str] | None = None) -> Any:
    return await v1.create_namespaced_config_map(
        "default", {"metadata": {"name": name, "labels": labels or {}}}
    )


class Stream:
    """A raw watch stream read line by line."""

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self.resp = resp

    async def next(self, timeout: float = 5.0) -> dict[str, Any] | None:
        line = await asyncio.wait_for(self.resp.content.readline(), timeout)
        if not line:
            return None
        event: dict[str, Any] = json.loads(line)
        return event

    async def take(self, n: int, timeout: float = 5.0) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for _ in range(n):
            event = await self.next(timeout)
            assert event is not None, f"stream ended after {out}"
            out.append(event)
        return out

    async def rest(self, timeout: float = 5.0) -> list[dict[str, Any]]:
        out = []
        while (event := await self.next(timeout)) is not None:
            out.append(event)
        return out


async def open_watch(
    server: ApiServer, path: str, session: aiohttp.ClientSession, **params: str
) -> Stream:
    resp = await session.get(server.url + path, params={"watch": "true", **params})
    assert resp.status == 200
    return Stream(resp)


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def test_label_and_field_selectors(kube_client: ApiClient) -> None:
    v1 = CoreV1Api(kube_client)
    await make_cm(v1, "a", {"app": "x", "tier": "1"})
    await make_cm(v1, "b", {"app": "y"})
    await make_cm(v1, "c", {})

    async def names(**kw: Any) -> list[str]:
        out = await v1.list_namespaced_config_map("default", **kw)
        return [i.metadata.name for i in out.items]

    assert await names(label_selector="app=x") == ["a"]
    assert await names(label_selector="app==x") == ["a"]
    assert await names(label_selector="app!=x") == ["b", "c"]
    assert await names(label_selector="app in (x,y)") == ["a", "b"]
    assert await names(label_selector="app notin (x)") == ["b", "c"]
    assert await names(label_selector="app") == ["a", "b"]
    assert await names(label_selector="!app") == ["c"]
    assert await names(label_selector="app=x,tier=1") == ["a"]
    assert await names(field_selector="metadata.name=b") == ["b"]
    assert await names(field_selector="metadata.name!=b") == ["a", "c"]
    assert await names(field_selector="metadata.namespace=default,metadata.name=c") == ["c"]
    with pytest.raises(ApiException) as e:
        await names(field_selector="spec.nodeName=x")
    assert e.value.status == 400
    assert error_body(e.value)["message"] == "field label not supported: spec.nodeName"


async def test_per_type_field_selectors(kube_client: ApiClient) -> None:
    v1 = CoreV1Api(kube_client)
    for name, node in (("p1", "n1"), ("p2", "n2")):
        await v1.create_namespaced_pod(
            "default",
            {
                "metadata": {"name": name},
                "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]},
            },
        )
    pods = await v1.list_pod_for_all_namespaces(field_selector="spec.nodeName=n2")
    assert [p.metadata.name for p in pods.items] == ["p2"]
    pods = await v1.list_namespaced_pod("default", field_selector="status.phase=Pending")
    assert len(pods.items) == 2
    await v1.create_namespaced_secret(
        "default", {"metadata": {"name": "s"}, "type": "kubernetes.io/tls"}
    )
    await v1.create_namespaced_secret("default", {"metadata": {"name": "o"}})
    secrets = await v1.list_namespaced_secret("default", field_selector="type=Opaque")
    assert [s.metadata.name for s in secrets.items] == ["o"]
    await v1.create_namespaced_event(
        "default",
        {
            "metadata": {"name": "e1"},
            "involvedObject": {
                "kind": "PersistentVolumeClaim",
                "name": "c",
                "namespace": "default",
            },
            "reason": "Provisioning",
            "type": "Normal",
        },
    )
    events = await v1.list_namespaced_event(
        "default", field_selector="involvedObject.kind=PersistentVolumeClaim,involvedObject.name=c"
    )
    assert [e.metadata.name for e in events.items] == ["e1"]
    namespaces = await v1.list_namespace(field_selector="status.phase=Active")
    assert len(namespaces.items) == 4


def test_selector_parsing() -> None:
    sel = parse_label_selector("a in (1, 2), b notin (3),!c,d")
    assert sel.matches({"metadata": {"labels": {"a": "1", "d": ""}}})
    assert not sel.matches({"metadata": {"labels": {"a": "1", "b": "3", "d": ""}}})
    assert not sel.matches({"metadata": {"labels": {"a": "1", "c": "x", "d": ""}}})
    with pytest.raises(ApiError):
        parse_label_selector("a=(")
    with pytest.raises(ApiError) as e:
        parse_field_selector("spec.volumeName=x", "", "persistentvolumeclaims")
    assert e.value.code == 400
    nodes = parse_field_selector("spec.unschedulable=false", "", "nodes")
    assert nodes.matches({"metadata": {"name": "n"}, "spec": {}})


async def test_pagination_and_expired_continue(
    apiserver: ApiServer, kube_client: ApiClient
) -> None:
    v1 = CoreV1Api(kube_client)
    for i in range(7):
        await make_cm(v1, f"cm-{i}")
    seen: list[str] = []
    token = None
    pages = 0
    first_rv = None
    while True:
        page = await v1.list_namespaced_config_map("default", limit=3, _continue=token)
        pages += 1
        first_rv = first_rv or page.metadata.resource_version
        seen += [i.metadata.name for i in page.items]
        token = page.metadata._continue
        if not token:
            break
        assert page.metadata.remaining_item_count == 7 - len(seen)
    assert pages == 3
    assert seen == [f"cm-{i}" for i in range(7)]

    page = await v1.list_namespaced_config_map("default", limit=2)
    await make_cm(v1, "after")
    apiserver.compact()
    with pytest.raises(ApiException) as e:
        await v1.list_namespaced_config_map("default", limit=2, _continue=page.metadata._continue)
    assert e.value.status == 410
    assert error_body(e.value)["reason"] == "Expired"
    assert "continue parameter is too old" in error_body(e.value)["message"]
    with pytest.raises(ApiException) as e:
        await v1.list_namespaced_config_map("default", _continue="garbage!")
    assert e.value.status == 400


async def test_list_resource_version_too_large(kube_client: ApiClient) -> None:
    v1 = CoreV1Api(kube_client)
    with pytest.raises(ApiException) as e:
        await v1.list_namespaced_config_map("default", resource_version="999999999")
    assert e.value.status == 504
    ok = await v1.list_namespaced_config_map("default", resource_version="0")
    assert ok.metadata.resource_version.isdigit()
    with pytest.raises(ApiException) as e:
        await v1.list_namespaced_config_map("default", resource_version_match="NotOlderThan")
    assert e.value.status == 422
    with pytest.raises(ApiException) as e:
        await v1.list_namespaced_config_map(
            "default", resource_version="0", resource_version_match="Exact"
        )
    assert e.value.status == 422
    exact = await v1.list_namespaced_config_map(
        "default", resource_version=ok.metadata.resource_version, resource_version_match="Exact"
    )
    assert exact.metadata.resource_version == ok.metadata.resource_version


async def test_watch_from_resource_version(
    apiserver: ApiServer, kube_client: ApiClient, session: aiohttp.ClientSession
) -> None:
    v1 = CoreV1Api(kube_client)
    a = await make_cm(v1, "a")
    rv = a.metadata.resource_version
    await make_cm(v1, "b")
    await v1.patch_namespaced_config_map("a", "default", {"data": {"k": "v"}})
    await v1.delete_namespaced_config_map("b", "default")
    stream = await open_watch(apiserver, CM, session, resourceVersion=rv)
    events = await stream.take(3)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "b"),
        ("MODIFIED", "a"),
        ("DELETED", "b"),
    ]
    assert all(e["object"]["kind"] == "ConfigMap" for e in events)
    rvs = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert rvs == sorted(rvs)
    assert rvs[0] > int(rv)


async def test_watch_without_rv_sends_current_state_then_live(
    apiserver: ApiServer, kube_client: ApiClient, session: aiohttp.ClientSession
) -> None:
    v1 = CoreV1Api(kube_client)
    await make_cm(v1, "old")
    stream = await open_watch(apiserver, CM, session)
    first = await stream.next()
    assert first is not None
    assert (first["type"], first["object"]["metadata"]["name"]) == (
        "ADDED",
        "old",
    )
    await make_cm(v1, "new")
    live = await stream.next()
    assert live is not None
    assert live["object"]["metadata"]["name"] == "new"
    assert apiserver.drop_watches() == 1
    assert await stream.next() is None


async def test_bookmarks_and_timeout(session: aiohttp.ClientSession) -> None:
    async with ApiServer(bookmark_interval=0.1) as server:
        stream = await open_watch(
            server, CM, session, resourceVersion="1", allowWatchBookmarks="true", timeoutSeconds="1"
        )
        events = await stream.rest(timeout=5)
        bookmarks = [e for e in events if e["type"] == "BOOKMARK"]
        assert len(bookmarks) >= 3
        obj = bookmarks[0]["object"]
        assert set(obj) == {"kind", "apiVersion", "metadata"}
        assert obj["kind"] == "ConfigMap"
        assert list(obj["metadata"]) == ["resourceVersion"]


async def test_expired_watch_streams_error_event(
    apiserver: ApiServer, kube_client: ApiClient, session: aiohttp.ClientSession
) -> None:
    v1 = CoreV1Api(kube_client)
    a = await make_cm(v1, "a")
    await make_cm(v1, "b")
    apiserver.compact()
    stream = await open_watch(apiserver, CM, session, resourceVersion=a.metadata.resource_version)
    events = await stream.rest()
    assert len(events) == 1
    assert events[0]["type"] == "ERROR"
    status = events[0]["object"]
    assert (status["kind"], status["code"], status["reason"]) == ("Status", 410, "Expired")
    assert status["message"].startswith(
        f"too old resource version: {a.metadata.resource_version} ("
    )


async def test_small_watch_window_expires(session: aiohttp.ClientSession) -> None:
    async with ApiServer(watch_window=3) as server, server.api_client() as client:
        v1 = CoreV1Api(client)
        first = await make_cm(v1, "w0")
        for i in range(1, 5):
            await make_cm(v1, f"w{i}")
        stream = await open_watch(
            server, CM, session, resourceVersion=first.metadata.resource_version
        )
        events = await stream.rest()
        assert events[0]["type"] == "ERROR"
        assert events[0]["object"]["code"] == 410


async def test_watch_selector_transitions(
    apiserver: ApiServer, kube_client: ApiClient, session: aiohttp.ClientSession
) -> None:
    v1 = CoreV1Api(kube_client)
    start = await make_cm(v1, "t", {"role": "other"})
    stream = await open_watch(
        apiserver,
        CM,
        session,
        resourceVersion=start.metadata.resource_version,
        labelSelector="role=db",
    )
    await v1.patch_namespaced_config_map("t", "default", {"metadata": {"labels": {"role": "db"}}})
    await v1.patch_namespaced_config_map("t", "default", {"data": {"x": "1"}})
    gone = await v1.patch_namespaced_config_map(
        "t", "default", {"metadata": {"labels": {"role": "web"}}}
    )
    events = await stream.take(3)
    assert [e["type"] for e in events] == ["ADDED", "MODIFIED", "DELETED"]
    # the DELETED event carries the last matching state at the new resourceVersion
    assert events[2]["object"]["metadata"]["labels"] == {"role": "db"}
    assert events[2]["object"]["metadata"]["resourceVersion"] == gone.metadata.resource_version


async def test_watch_with_kubernetes_asyncio(apiserver: ApiServer, kube_client: ApiClient) -> None:
    v1 = CoreV1Api(kube_client)
    listed = await v1.list_namespaced_config_map("default")
    w = watch.Watch()
    seen: list[tuple[str, str]] = []

    async def produce() -> None:
        await make_cm(v1, "k1")
        await v1.delete_namespaced_config_map("k1", "default")

    async with asyncio.TaskGroup() as tg:
        tg.create_task(produce())
        async for event in w.stream(
            v1.list_namespaced_config_map,
            "default",
            resource_version=listed.metadata.resource_version,
            timeout_seconds=2,
        ):
            seen.append((event["type"], event["object"].metadata.name))
            if len(seen) == 2:
                w.stop()
    assert seen == [("ADDED", "k1"), ("DELETED", "k1")]
    assert apiserver.requests.count("watch", "configmaps") >= 1


async def test_send_initial_events_bookmark(
    apiserver: ApiServer, kube_client: ApiClient, session: aiohttp.ClientSession
) -> None:
    await make_cm(CoreV1Api(kube_client), "i")
    stream = await open_watch(
        apiserver,
        CM,
        session,
        sendInitialEvents="true",
        resourceVersionMatch="NotOlderThan",
        allowWatchBookmarks="true",
        timeoutSeconds="1",
    )
    first = await stream.next()
    second = await stream.next()
    assert first is not None
    assert first["type"] == "ADDED"
    assert second is not None
    assert second["type"] == "BOOKMARK"
    assert second["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}


async def test_namespace_scoped_watch_and_legacy_path(
    apiserver: ApiServer, kube_client: ApiClient, session: aiohttp.ClientSession
) -> None:
    v1 = CoreV1Api(kube_client)
    await v1.create_namespace({"metadata": {"name": "ns2"}})
    start = apiserver.storage.resource_version
    await v1.create_namespaced_config_map("ns2", {"metadata": {"name": "x"}})
    await make_cm(v1, "y")
    resp = await session.get(
        apiserver.url + "/api/v1/watch/namespaces/default/configmaps",
        params={"resourceVersion": str(start)},
    )
    await make_cm(v1, "z")
    events = await Stream(resp).take(2)
    assert [e["object"]["metadata"]["name"] for e in events] == ["y", "z"]
    stream = await open_watch(apiserver, "/api/v1/configmaps", session, resourceVersion=str(start))
    assert [e["object"]["metadata"]["name"] for e in await stream.take(3)] == ["x", "y", "z"]


async def test_history_is_not_rewritten_by_later_writes(
    apiserver: ApiServer, kube_client: ApiClient, session: aiohttp.ClientSession
) -> None:
    v1 = CoreV1Api(kube_client)
    start = apiserver.storage.resource_version
    created = await make_cm(v1, "h")
    patched = await v1.patch_namespaced_config_map(
        "h", "default", {"data": {"k": "v"}}, _content_type="application/merge-patch+json"
    )
    stream = await open_watch(apiserver, CM, session, resourceVersion=str(start))
    added, modified = await stream.take(2)
    assert added["object"]["metadata"]["resourceVersion"] == created.metadata.resource_version
    assert "data" not in added["object"]
    assert modified["object"]["metadata"]["resourceVersion"] == patched.metadata.resource_version

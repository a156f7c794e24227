"""The in-memory API server fed malformed requests over raw HTTP (issue 11, "Hostile input").

Bad JSON, wrong JSON types, huge bodies, bad paths, bad query parameters, bad content types and
methods: each answer is a proper status code (4xx with a ``Status`` body where the real server
sends one — never a 500), and the server keeps serving afterwards.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import aiohttp
import pytest
import pytest_asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyprovlib.testing._server import ApiServer

PVCS = "/api/v1/namespaces/default/persistentvolumeclaims"
PVS = "/api/v1/persistentvolumes"
VAS = "/apis/storage.k8s.io/v1/volumeattachments"


@pytest_asyncio.fixture
async def http() -> AsyncIterator[tuple[ApiServer, aiohttp.ClientSession]]:
    async with ApiServer() as server, aiohttp.ClientSession(server.url) as session:
        yield server, session


async def status_of(
    session: aiohttp.ClientSession, method: str, path: str, **kwargs: object
) -> tuple[int, object]:
    async with session.request(method, path, **kwargs) as resp:  # type: ignore[arg-type]
        raw = await resp.read()
        try:
            body: object = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode(errors="replace")
        return resp.status, body


async def still_serving(session: aiohttp.ClientSession) -> None:
    status, body = await status_of(session, "GET", PVCS)
    assert status == 200
    assert isinstance(body, dict)
    assert body["kind"] == "PersistentVolumeClaimList"


def assert_client_error(status: int, body: object, expected: set[int] | None = None) -> None:
    assert 400 <= status < 500, (status, body)
    if expected is not None:
        assert status in expected, (status, body)
    if isinstance(body, dict):
        assert body.get("kind") == "Status", body
        assert body.get("code") == status, body


CASES: list[tuple[str, str, dict[str, object], set[int]]] = [
    # bad JSON
    ("POST", PVCS, {"data": b"{not json", "headers": {"Content-Type": "application/json"}}, {400}),
    (
        "POST",
        PVCS,
        {"data": b"\xff\xfe\x00", "headers": {"Content-Type": "application/json"}},
        {400},
    ),
    ("POST", PVCS, {"data": b'{"a": 1', "headers": {"Content-Type": "application/json"}}, {400}),
    ("POST", PVCS, {"data": b"NaN", "headers": {"Content-Type": "application/json"}}, {400, 422}),
    # wrong JSON types
    ("POST", PVCS, {"json": []}, {400, 422}),
    ("POST", PVCS, {"json": "a string"}, {400, 422}),
    ("POST", PVCS, {"json": 12}, {400, 422}),
    ("POST", PVCS, {"json": None}, {400, 422}),
    ("POST", PVCS, {"json": {"metadata": "x"}}, {400, 422}),
    ("POST", PVCS, {"json": {"metadata": {"name": 5}}}, {400, 422}),
    ("POST", PVCS, {"json": {"metadata": {"name": "a", "labels": []}}}, {400, 422}),
    ("POST", PVCS, {"json": {"metadata": {"name": "a"}, "spec": []}}, {400, 422}),
    (
        "POST",
        PVCS,
        {"json": {"metadata": {"name": "a"}, "spec": {"resources": {"requests": {"storage": 5}}}}},
        {400, 422},
    ),
    ("POST", PVS, {"json": {"metadata": {"name": "a" * 300}}}, {400, 422}),
    ("POST", PVS, {"json": {"metadata": {"name": "../etc"}}}, {400, 422}),
    ("POST", VAS, {"json": {"metadata": {"name": "va"}, "spec": "attach"}}, {400, 422}),
    ("PUT", PVCS + "/x", {"json": {"metadata": {"name": "y"}}}, {400, 404, 422}),
    (
        "DELETE",
        PVCS + "/x",
        {"data": b"[1,2]", "headers": {"Content-Type": "application/json"}},
        {400, 404},
    ),
    (
        "DELETE",
        PVCS + "/x",
        {"data": b"{bad", "headers": {"Content-Type": "application/json"}},
        {400, 404},
    ),
    # patches
    (
        "PATCH",
        PVCS + "/x",
        {"data": b"{}", "headers": {"Content-Type": "application/bogus-patch"}},
        {404, 415},
    ),
    (
        "PATCH",
        PVS + "/x",
        {"data": b"not json", "headers": {"Content-Type": "application/merge-patch+json"}},
        {400, 404},
    ),
    # bad paths
    ("GET", "/api/v1/namespaces/default/nonsense", {}, {404}),
    ("GET", "/api/v1/namespaces/default/persistentvolumeclaims/a/b/c", {}, {404}),
    ("GET", "/api/v1/namespaces/default/persistentvolumes", {}, {404}),
    ("GET", "/apis/nope.io/v1/things", {}, {404}),
    ("GET", "/api/v99/pods", {}, {404}),
    # ".." is resolved by the HTTP layer (Go's mux redirects to the cleaned path): at worst
    # the cluster-wide list, never a file path
    ("GET", "/api/v1/namespaces/%2e%2e/persistentvolumeclaims", {}, {200, 301, 400, 404}),
    ("GET", "/api/v1/persistentvolumes/%00", {}, {404, 400}),
    ("GET", "/../../etc/passwd", {}, {404}),
    ("GET", "/api/v1/namespaces/default/persistentvolumeclaims/x/status/extra", {}, {404}),
    ("POST", "/version", {"json": {}}, {404, 405}),
    ("TRACE", PVCS, {}, {405}),
    # bad query parameters
    ("GET", PVCS + "?limit=abc", {}, {400}),
    ("GET", PVCS + "?limit=-5", {}, {200}),  # the real server ignores limit <= 0
    ("GET", PVCS + "?resourceVersion=abc", {}, {400}),
    ("GET", PVCS + "?resourceVersion=99999999999", {}, {504}),  # real: "Too large resource version"
    ("GET", PVCS + "?resourceVersionMatch=Bogus&resourceVersion=1", {}, {422}),
    ("GET", PVCS + "?labelSelector=a%20in%20(", {}, {400}),
    ("GET", PVCS + "?labelSelector=%3D%3D%3D", {}, {400}),
    ("GET", PVCS + "?fieldSelector=spec.nonsense%3Dx", {}, {400}),
    ("GET", PVCS + "?fieldSelector=%21%21%21", {}, {400}),
    ("GET", PVCS + "?continue=garbage", {}, {400, 410}),
    ("GET", PVCS + "?watch=true&timeoutSeconds=abc", {}, {400}),
    ("GET", PVCS + "?watch=true&resourceVersion=abc", {}, {400}),
    # CreateOptions validation: 422 Invalid, as kube-apiserver answers
    ("POST", PVCS + "?dryRun=Sometimes", {"json": {"metadata": {"name": "d"}}}, {422}),
    ("DELETE", PVCS + "/x?gracePeriodSeconds=soon", {}, {400, 404}),
    # bad content type
    ("POST", PVCS, {"data": b"<xml/>", "headers": {"Content-Type": "application/xml"}}, {415}),
    ("POST", PVCS, {"data": b"a: [", "headers": {"Content-Type": "application/yaml"}}, {400}),
]


@pytest.mark.parametrize(("method", "path", "kwargs", "expected"), CASES)
async def test_malformed_request(
    http: tuple[ApiServer, aiohttp.ClientSession],
    method: str,
    path: str,
    kwargs: dict[str, object],
    expected: set[int],
) -> None:
    _server, session = http
    status, body = await status_of(session, method, path, **kwargs)
    if 400 <= status < 500:
        assert_client_error(status, body, expected)
    else:
        assert status in expected, (status, body)
    await still_serving(session)


async def test_huge_body_is_refused_and_the_server_lives(
    http: tuple[ApiServer, aiohttp.ClientSession],
) -> None:
    _server, session = http
    huge = b'{"metadata": {"name": "big"}, "data": {"x": "' + b"a" * (70 * 1024 * 1024) + b'"}}'
    status, _body = await status_of(
        session,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        data=huge,
        headers={"Content-Type": "application/json"},
    )
    assert status == 413
    await still_serving(session)


async def test_deeply_nested_json_is_a_client_error(
    http: tuple[ApiServer, aiohttp.ClientSession],
) -> None:
    _server, session = http
    deep = b'{"metadata": {"name": "deep"}, "spec": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    status, body = await status_of(
        session, "POST", PVCS, data=deep, headers={"Content-Type": "application/json"}
    )
    assert_client_error(status, body, {400})
    # Deep enough to parse but not to copy: also refused, and not half-stored.
    deep = b'{"metadata": {"name": "deep"}, "spec": {"x": ' + b"[" * 900 + b"]" * 900 + b"}}"
    status, body = await status_of(
        session, "POST", PVCS, data=deep, headers={"Content-Type": "application/json"}
    )
    assert_client_error(status, body, {400})
    status, _ = await status_of(session, "GET", PVCS + "/deep")
    assert status == 404
    await still_serving(session)


async def test_abrupt_disconnects_mid_body_and_mid_watch(
    http: tuple[ApiServer, aiohttp.ClientSession],
) -> None:
    server, session = http
    import asyncio

    reader, writer = await asyncio.open_connection(server.host, server.port)
    writer.write(
        f"POST {PVCS} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        'Content-Length: 100000\r\n\r\n{"metadata":'.encode()
    )
    await writer.drain()
    writer.close()
    # A watch whose client vanishes.
    reader, writer = await asyncio.open_connection(server.host, server.port)
    writer.write(f"GET {PVCS}?watch=true HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    await reader.readline()
    writer.close()
    # Garbage that is not HTTP at all.
    reader, writer = await asyncio.open_connection(server.host, server.port)
    writer.write(b"\x16\x03\x01\x02\x00 definitely not http\r\n\r\n")
    await writer.drain()
    line = await reader.readline()
    assert line == b"" or (line.startswith(b"HTTP/1.") and b" 400 " in line), line
    writer.close()
    await still_serving(session)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    segment=st.text(
        st.characters(codec="utf-8", exclude_characters="/?#"), min_size=1, max_size=40
    ),
    query=st.dictionaries(
        st.sampled_from(
            [
                "limit",
                "continue",
                "resourceVersion",
                "resourceVersionMatch",
                "labelSelector",
                "fieldSelector",
                "timeoutSeconds",
                "watch",
                "allowWatchBookmarks",
                "sendInitialEvents",
                "dryRun",
            ]
        ),
        st.text(max_size=12),
        max_size=4,
    ),
)
async def test_any_path_segment_and_query_is_answered_without_500(
    segment: str, query: dict[str, str]
) -> None:
    query = {k: v for k, v in query.items() if k != "watch" or v.lower() not in ("true", "1")}
    async with ApiServer() as server, aiohttp.ClientSession(server.url) as session:
        for path in (
            f"/api/v1/namespaces/{segment}/persistentvolumeclaims",
            f"/api/v1/persistentvolumes/{segment}",
            f"/apis/storage.k8s.io/v1/{segment}",
        ):
            async with session.get(
                path, params=query, timeout=aiohttp.ClientTimeout(total=5)
            ) as resp:
                await resp.read()
                assert resp.status < 500 or resp.status == 504, (path, query, resp.status)
        await still_serving(session)

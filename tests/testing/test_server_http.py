"""The in-memory server's HTTP layer (aiohttp's web server) over raw sockets — keep-alive,
pipelining, chunked request bodies, ``Expect: 100-continue``, HEAD, HTTP/1.0, malformed
requests, the body limit, chunked watch streams and a client leaving mid-watch — plus the PV
binder's in-process transport and the storage bookkeeping that makes writes and relists
cheap."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from pyprovlib import testing
from pyprovlib.kube import _resources as R
from pyprovlib.kube._config import request_json
from pyprovlib.testing._binder import BINDER_USER_AGENT, PVBinder
from pyprovlib.testing._server import ApiServer, InProcessTransport
from pyprovlib.testing._storage import Storage

CM = "/api/v1/namespaces/default/configmaps"


def cm(name: str, data: dict[str, str] | None = None) -> bytes:
    return json.dumps({"metadata": {"name": name}, "data": data or {"k": "v"}}).encode()


class Conn:
    """One raw TCP connection to the server, reading HTTP responses off it."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def head(self) -> tuple[int, dict[str, str]]:
        status_line = await asyncio.wait_for(self.reader.readline(), 5)
        # aiohttp answers an HTTP/1.0 request in HTTP/1.0
        assert status_line.startswith((b"HTTP/1.1 ", b"HTTP/1.0 ")), status_line
        status = int(status_line.split(b" ")[1])
        headers: dict[str, str] = {}
        while True:
            line = await asyncio.wait_for(self.reader.readline(), 5)
            if line in (b"\r\n", b""):
                return status, headers
            name, _, value = line.decode().partition(":")
            headers[name.strip().lower()] = value.strip()

    async def response(self) -> tuple[int, dict[str, str], bytes]:
        status, headers = await self.head()
        body = await asyncio.wait_for(
            self.reader.readexactly(int(headers.get("content-length", "0"))), 5
        )
        return status, headers, body

    async def chunk(self) -> bytes | None:
        """The next chunk of a chunked body; None at its end."""
        size = int((await asyncio.wait_for(self.reader.readline(), 5)).strip(), 16)
        if size == 0:
            assert await asyncio.wait_for(self.reader.readline(), 5) == b"\r\n"
            return None
        data = await asyncio.wait_for(self.reader.readexactly(size + 2), 5)
        return data[:-2]

    async def closed(self) -> bool:
        return await asyncio.wait_for(self.reader.read(), 5) == b""


@pytest.fixture
async def conn(apiserver: ApiServer) -> AsyncIterator[Conn]:
    reader, writer = await asyncio.open_connection(apiserver.host, apiserver.port)
    try:
        yield Conn(reader, writer)
    finally:
        writer.close()
        await writer.wait_closed()


def post(path: str, body: bytes, *extra: str) -> bytes:
    head = [
        f"POST {path} HTTP/1.1",
        "Host: x",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        *extra,
    ]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def eventually(what: str, predicate: Callable[[], bool]) -> None:
    await testing.eventually(predicate, timeout=10, message=what)


async def test_keep_alive_and_pipelined_requests_answer_in_order(conn: Conn) -> None:
    await conn.send(
        post(CM, cm("a"))
        + b"\r\nGET /api/v1/namespaces/default/configmaps/a HTTP/1.1\r\nHost: x\r\n\r\n"
        + b"GET /api/v1/namespaces/default/configmaps/missing HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    status, headers, body = await conn.response()
    assert status == 201
    assert headers["content-type"] == "application/json"
    created = json.loads(body)
    status, _, body = await conn.response()
    assert (status, json.loads(body)) == (200, created)
    status, _, body = await conn.response()
    assert status == 404
    assert json.loads(body)["reason"] == "NotFound"
    # the connection is still usable
    await conn.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (await conn.response())[::2] == (200, b"ok")


async def test_chunked_request_body(conn: Conn, apiserver: ApiServer) -> None:
    body = cm("chunky", {"big": "x" * 5000})
    pieces = [body[:10], body[10:4000], body[4000:]]
    chunked = (
        b"".join(b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\nTrailer: t\r\n\r\n"
    )
    head = (
        f"POST {CM} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
    ).encode()
    # sent in pieces, as a streaming client does
    for i in range(0, len(head + chunked), 777):
        await conn.send((head + chunked)[i : i + 777])
    status, _, reply = await conn.response()
    assert status == 201, reply
    stored = apiserver.storage.get("configmaps", "default", "chunky")
    assert stored is not None
    assert stored["data"]["big"] == "x" * 5000


async def test_expect_100_continue(conn: Conn) -> None:
    body = cm("expected")
    head = post(CM, body, "Expect: 100-continue")[: -len(body)]
    await conn.send(head)
    status, _ = await conn.head()
    assert status == 100
    await conn.send(body)
    assert (await conn.response())[0] == 201


async def test_head_has_no_body_and_http10_closes(conn: Conn) -> None:
    await conn.send(b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    status, headers = await conn.head()
    assert (status, headers["content-length"]) == (200, "2")
    await conn.send(b"GET /healthz HTTP/1.0\r\n\r\n")
    status, _, body = await conn.response()
    assert (status, body) == (200, b"ok")
    # no keep-alive asked for: the server closes the connection
    assert await conn.closed()


async def test_malformed_request_gets_400_and_close(conn: Conn) -> None:
    await conn.send(b"this is not http\r\n\r\n")
    status, _, _ = await conn.response()
    assert status == 400
    assert await conn.closed()


async def test_invalid_content_length_gets_400(conn: Conn) -> None:
    await conn.send(b"POST /api/v1/namespaces HTTP/1.1\r\nContent-Length: -1\r\n\r\n")
    assert (await conn.response())[0] == 400
    assert await conn.closed()


async def test_body_over_the_limit_gets_the_servers_413(conn: Conn) -> None:
    await conn.send(
        f"POST {CM} HTTP/1.1\r\nHost: x\r\nContent-Length: {64 * 1024 * 1024 + 1}\r\n\r\n".encode()
    )
    status, _, body = await conn.response()
    assert status == 413
    assert json.loads(body)["reason"] == "RequestEntityTooLarge"
    assert await conn.closed()


async def test_watch_is_chunked_and_the_connection_survives_its_end(
    conn: Conn, apiserver: ApiServer
) -> None:
    await conn.send(post(CM, cm("before")))
    assert (await conn.response())[0] == 201
    await conn.send(f"GET {CM}?watch=1&timeoutSeconds=30 HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    status, headers = await conn.head()
    assert (status, headers["transfer-encoding"]) == (200, "chunked")
    first = await conn.chunk()
    assert first is not None
    assert json.loads(first)["object"]["metadata"]["name"] == "before"
    async with apiserver.api_client() as client:
        await request_json(client, "POST", CM, body=json.loads(cm("during")))
    during = await conn.chunk()
    assert during is not None
    assert json.loads(during)["object"]["metadata"]["name"] == "during"
    assert apiserver.drop_watches() == 1
    assert await conn.chunk() is None
    # the stream ended properly: the same connection serves the next request
    await conn.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (await conn.response())[::2] == (200, b"ok")


async def test_client_leaving_mid_watch_ends_the_watch(apiserver: ApiServer) -> None:
    reader, writer = await asyncio.open_connection(apiserver.host, apiserver.port)
    writer.write(f"GET {CM}?watch=1 HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    await Conn(reader, writer).head()
    await eventually("the watch to open", lambda: apiserver.open_watches == 1)
    writer.close()
    await writer.wait_closed()
    await eventually("the watch to end", lambda: apiserver.open_watches == 0)


async def test_client_leaving_mid_request_cancels_it(apiserver: ApiServer) -> None:
    """A request held by injected latency whose client goes away (a killed process: its
    sockets close) has no effect, as with aiohttp's server and Go's; a reliability test kills
    controllers exactly there."""
    apiserver.faults.latency(0.3, verb="create", resource="configmaps", count=1)
    _reader, writer = await asyncio.open_connection(apiserver.host, apiserver.port)
    writer.write(post(CM, cm("abandoned")))
    await writer.drain()
    await eventually(
        "the request to arrive", lambda: apiserver.requests.count("create", "configmaps") == 1
    )
    assert apiserver.in_flight == 1  # held by the latency
    writer.close()
    await writer.wait_closed()
    # The request ended: cancelled, or (were it not) answered after creating the object.
    await eventually("the request to end", lambda: apiserver.in_flight == 0)
    assert apiserver.storage.get("configmaps", "default", "abandoned") is None
    async with apiserver.api_client() as client:
        await request_json(client, "POST", CM, body=json.loads(cm("kept")))
    assert apiserver.storage.get("configmaps", "default", "kept") is not None


async def test_restart_closes_idle_keep_alive_connections(conn: Conn, apiserver: ApiServer) -> None:
    await conn.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (await conn.response())[0] == 200
    await apiserver.restart()
    assert await conn.closed()


async def test_percent_encoded_path_and_query(conn: Conn) -> None:
    labelled = json.dumps(
        {"metadata": {"name": "sel", "labels": {"tier": "a b"}}, "data": {}}
    ).encode()
    await conn.send(post(CM, labelled))
    assert (await conn.response())[0] == 201
    await conn.send(
        b"GET /api/v1/namespaces/default/configmaps?labelSelector=tier%20in%20(a%20b%2Cc)"
        b" HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    status, _, body = await conn.response()
    # "a b" is not a valid label value: the selector is refused, as by the real server
    assert status == 400, body
    await conn.send(
        b"GET /api/v1/namespaces/default/configmaps?labelSelector=tier%3Dother"
        b"&fieldSelector=metadata.name%3Dsel HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    status, _, body = await conn.response()
    assert (status, json.loads(body)["items"]) == (200, [])
    await conn.send(b"GET /api/v1/namespaces/default/configmaps/s%65l HTTP/1.1\r\nHost: x\r\n\r\n")
    status, _, body = await conn.response()
    assert (status, json.loads(body)["metadata"]["name"]) == (200, "sel")


# --- the binder's in-process transport ---------------------------------------------------------


async def test_in_process_requests_go_through_the_pipeline(apiserver: ApiServer) -> None:
    transport = InProcessTransport(apiserver, BINDER_USER_AGENT)
    created = await transport.json(
        "POST", CM, body={"metadata": {"name": "ip"}, "data": {"a": "1"}}
    )
    assert created["metadata"]["resourceVersion"]
    assert apiserver.requests.count("create", "configmaps") == 1
    assert apiserver.requests.user_agents[-1] == BINDER_USER_AGENT
    apiserver.faults.fail(409, verb="update", resource="configmaps")
    with pytest.raises(ApiException) as failed:
        await transport.json("PUT", f"{CM}/ip", body=created)
    assert failed.value.status == 409
    assert json.loads(failed.value.body or b"{}")["reason"] == "Conflict"
    with pytest.raises(ApiException) as invalid:
        await transport.json("POST", CM, body={"metadata": {"name": "Bad_Name"}})
    assert invalid.value.status == 422


async def test_in_process_watch_streams_and_ends_with_drop(apiserver: ApiServer) -> None:
    transport = InProcessTransport(apiserver, BINDER_USER_AGENT)
    listed = await transport.json("GET", CM)
    lines: list[dict[str, Any]] = []
    async with transport.stream(
        CM, query={"watch": "true", "resourceVersion": listed["metadata"]["resourceVersion"]}
    ) as chunks:
        await transport.json("POST", CM, body={"metadata": {"name": "w1"}})
        await transport.json("POST", CM, body={"metadata": {"name": "w2"}})
        async for chunk in chunks:
            lines.extend(json.loads(line) for line in chunk.split(b"\n") if line)
            if len(lines) == 2:
                assert apiserver.drop_watches() == 1
        assert [e["object"]["metadata"]["name"] for e in lines] == ["w1", "w2"]
    assert apiserver.open_watches == 0


async def test_in_process_requests_fail_while_the_server_is_down() -> None:
    server = ApiServer()
    transport = InProcessTransport(server, BINDER_USER_AGENT)
    with pytest.raises(aiohttp.ClientConnectionError):
        await transport.json("GET", CM)
    async with server:
        assert (await transport.json("GET", "/api/v1/namespaces/default"))["metadata"]
    with pytest.raises(aiohttp.ClientConnectionError):
        await transport.json("GET", CM)


def test_binder_needs_exactly_one_way_to_the_server() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        PVBinder()


async def test_binder_in_the_server_is_counted_as_a_client(
    apiserver_with_binder: ApiServer,
) -> None:
    server = apiserver_with_binder
    await eventually(
        "the binder's watches",
        lambda: server.requests.count("watch", "persistentvolumeclaims") >= 1,
    )
    assert BINDER_USER_AGENT in server.requests.user_agents
    assert server.open_watches == 3  # claims, volumes, classes


# --- storage bookkeeping -----------------------------------------------------------------------


def _obj(ns: str, name: str, rv: int) -> dict[str, Any]:
    return {"metadata": {"namespace": ns, "name": name, "resourceVersion": str(rv)}}


def test_sorted_keys_and_namespace_counts_follow_puts_and_removes() -> None:
    storage = Storage()
    r = R.CONFIGMAPS
    for ns, name in [("b", "2"), ("a", "9"), ("b", "1")]:
        storage.put(r, _obj(ns, name, storage.next_rv()), storage.rv, "ADDED")
    assert storage.sorted_keys(r) == [("a", "9"), ("b", "1"), ("b", "2")]
    # kept in step from now on, not rebuilt
    storage.put(r, _obj("a", "0", storage.next_rv()), storage.rv, "ADDED")
    storage.put(r, _obj("b", "1", storage.next_rv()), storage.rv, "MODIFIED")
    storage.remove(r, _obj("b", "2", storage.next_rv()), storage.rv)
    assert storage.sorted_keys(r) == [("a", "0"), ("a", "9"), ("b", "1")]
    assert [k for k, _ in storage.iter_from(r, "a", None)] == [("a", "0"), ("a", "9")]
    assert not storage.namespace_empty("a")
    storage.remove(r, _obj("a", "0", storage.next_rv()), storage.rv)
    storage.remove(r, _obj("a", "9", storage.next_rv()), storage.rv)
    storage.remove(r, _obj("a", "9", storage.next_rv()), storage.rv)  # already gone
    assert storage.namespace_empty("a")
    assert not storage.namespace_empty("b")


def test_encoded_bytes_are_reused_only_for_the_same_object() -> None:
    storage = Storage()
    r = R.CONFIGMAPS
    first = _obj("a", "x", storage.next_rv())
    event = storage.put(r, first, storage.rv, "ADDED")
    assert storage.encoded(first) is event.data()
    assert storage.encoded_item(r, ("a", "x"), first) is event.data()
    assert event.line() == b'{"type":"ADDED","object":%s}\n' % event.data()
    second = _obj("a", "x", storage.next_rv())
    storage.put(r, second, storage.rv, "MODIFIED")
    fresh = storage.encoded_item(r, ("a", "x"), second)
    assert json.loads(fresh) == second
    # an object that is not the stored one (a converted view) is encoded, never cached
    view = dict(second)
    assert storage.encoded_item(r, ("a", "x"), view) is not fresh
    assert storage.encoded_item(r, ("a", "x"), second) is fresh


async def test_relist_after_writes_shows_the_latest_versions(apiserver: ApiServer) -> None:
    async with apiserver.api_client() as client:
        for i in range(3):
            await request_json(client, "POST", CM, body={"metadata": {"name": f"r{i}"}})
        first = await request_json(client, "GET", CM)
        await request_json(
            client,
            "PATCH",
            f"{CM}/r1",
            body={"data": {"new": "yes"}},
            content_type="application/merge-patch+json",
        )
        await request_json(client, "DELETE", f"{CM}/r2")
        second = await request_json(client, "GET", CM)
        got = await request_json(client, "GET", f"{CM}/r1")
    assert [i["metadata"]["name"] for i in first["items"]] == ["r0", "r1", "r2"]
    assert [i["metadata"]["name"] for i in second["items"]] == ["r0", "r1"]
    assert second["items"][0] == first["items"][0]
    assert second["items"][1] == got
    assert got["data"] == {"new": "yes"}


async def test_deleting_a_namespace_with_many_objects(apiserver: ApiServer) -> None:
    async with apiserver.api_client() as client:
        await request_json(client, "POST", "/api/v1/namespaces", body={"metadata": {"name": "big"}})
        for i in range(300):
            await request_json(
                client,
                "POST",
                "/api/v1/namespaces/big/configmaps",
                body={"metadata": {"name": f"c{i}"}},
            )
        await request_json(client, "DELETE", "/api/v1/namespaces/big")
    assert apiserver.storage.get("namespaces", None, "big") is None
    assert apiserver.storage.list("configmaps", "big") == []

"""The lean HTTP/1.1 transport (pyprovlib.kube.transport) behind LimitedApiClient's raw
requests: what it sends (auth, user agent, bodies), keep-alive and the connection limit,
response framing (Content-Length, chunked, until close, gzip, interim 1xx) fed in every
possible split, watches and flow control, TLS with a client certificate, and failures
(refused, disconnects, read-idle and total timeouts, cancellation) surfacing as the same
aiohttp exceptions as kubernetes-asyncio's own path.

Servers here are raw asyncio servers scripting the bytes on the wire, or the in-memory
API server where a real API is needed.
"""

from __future__ import annotations

import asyncio
import gzip
import itertools
import json
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import trustme
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes_asyncio.client import Configuration

import pyprovlib.kube.config as kube_config
import pyprovlib.kube.rest as kube_rest
from pyprovlib.kube.config import LimitedApiClient, request_json, send_request
from pyprovlib.kube.errors import ApiException
from pyprovlib.kube.ratelimit import TokenBucket
from pyprovlib.kube.resources import NAMESPACES
from pyprovlib.kube.rest import ResourceClient
from pyprovlib.kube.transport import (
    HttpProtocolError,
    HttpResponse,
    HttpTransport,
    _Connection,
    _Exchange,
)
from pyprovlib.testing.server import ApiServer


@dataclass
class Request:
    """One request as a scripted server read it."""

    method: str
    target: str
    headers: dict[str, str]
    body: bytes
    connection: int


Respond = Callable[[Request, asyncio.StreamWriter], Awaitable[str | None]]


@dataclass
class Scripted:
    """A raw HTTP/1.1 server: reads each request (head and Content-Length body) and lets
    ``respond`` write whatever bytes it wants; ``respond`` returning "close" closes the
    connection."""

    respond: Respond
    requests: list[Request] = field(default_factory=list)
    connections: int = 0
    open_now: int = 0
    max_open: int = 0
    peer_subjects: list[Any] = field(default_factory=list)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        self.open_now += 1
        self.max_open = max(self.max_open, self.open_now)
        peer = writer.get_extra_info("peercert")
        if peer is not None:
            self.peer_subjects.append(peer.get("subject"))
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    if line:
                        name, _, value = line.partition(":")
                        headers[name.strip().lower()] = value.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                request = Request(method, target, headers, body, number)
                self.requests.append(request)
                if await self.respond(request, writer) == "close":
                    return
        finally:
            self.open_now -= 1
            writer.close()


@asynccontextmanager
async def scripted(
    respond: Respond, *, ssl_context: ssl.SSLContext | None = None
) -> AsyncIterator[tuple[Scripted, str]]:
    server = Scripted(respond)
    srv = await asyncio.start_server(server.handle, "127.0.0.1", 0, ssl=ssl_context)
    port = srv.sockets[0].getsockname()[1]
    scheme = "https" if ssl_context else "http"
    async with srv:
        yield server, f"{scheme}://127.0.0.1:{port}"
        srv.close()


def response(status: int, body: bytes = b"", *extra: str, reason: str = "OK") -> bytes:
    head = [f"HTTP/1.1 {status} {reason}", f"Content-Length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


def json_ok(payload: Any = None) -> Respond:
    body = json.dumps(payload if payload is not None else {"kind": "Status"}).encode()

    async def respond(request: Request, writer: asyncio.StreamWriter) -> None:
        writer.write(response(200, body, "Content-Type: application/json"))

    return respond


def client(host: str, **kwargs: Any) -> LimitedApiClient:
    configuration = Configuration()
    configuration.host = host
    for name, value in kwargs.items():
        setattr(configuration, name, value)
    return LimitedApiClient(configuration, limiter=TokenBucket(0, 0), environ={})


# -- what goes on the wire ---------------------------------------------------------------


async def test_requests_carry_auth_user_agent_and_json_bodies() -> None:
    refreshed: list[int] = []

    def refresh(configuration: Configuration) -> None:
        refreshed.append(1)
        configuration.api_key["BearerToken"] = f"token-{len(refreshed)}"

    async with scripted(json_ok({"kind": "X", "n": 1})) as (server, url), client(url) as api:
        # As kubernetes-asyncio's exec/OIDC loaders set it up: a token and a refresh hook.
        api.configuration.api_key["BearerToken"] = "token-0"
        api.configuration.api_key_prefix["BearerToken"] = "Bearer"
        api.configuration.refresh_api_key_hook = refresh
        got = await request_json(api, "POST", "/api/v1/things", body={"a": [1, "é"]})
        await request_json(
            api,
            "PATCH",
            "/api/v1/things/x",
            body={"b": None},
            content_type="application/merge-patch+json",
            query=[("fieldManager", "me & you")],
        )
        await request_json(api, "GET", "/api/v1/things", query=[("watch", "false")])
        await request_json(api, "DELETE", "/api/v1/things/x", body={"kind": "DeleteOptions"})
        assert api.http_transport is not None
        assert api.http_transport.connections == 1  # kept alive and reused
    assert got == {"kind": "X", "n": 1}
    post, patch, get, delete = server.requests
    assert (post.method, post.target) == ("POST", "/api/v1/things")
    assert json.loads(post.body) == {"a": [1, "é"]}
    assert post.headers["content-type"] == "application/json"
    assert post.headers["accept"] == "application/json"
    assert post.headers["user-agent"] == kube_config.DEFAULT_USER_AGENT
    assert post.headers["host"] == url.removeprefix("http://")
    # The refresh hook runs before every request, as in kubernetes-asyncio's call_api.
    assert [r.headers["authorization"] for r in server.requests] == [
        "Bearer token-1",
        "Bearer token-2",
        "Bearer token-3",
        "Bearer token-4",
    ]
    assert patch.target == "/api/v1/things/x?fieldManager=me+%26+you"
    assert patch.headers["content-type"] == "application/merge-patch+json"
    assert json.loads(patch.body) == {"b": None}
    assert get.target == "/api/v1/things?watch=false"
    assert "content-length" not in get.headers
    assert get.body == b""
    assert json.loads(delete.body) == {"kind": "DeleteOptions"}
    assert {r.connection for r in server.requests} == {1}


async def test_path_prefix_and_unsafe_characters_are_kept_and_quoted() -> None:
    async with scripted(json_ok()) as (server, url), client(url + "/k8s/clusters/c-1/") as api:
        await request_json(api, "GET", "/api/v1/namespaces/a b")
    assert server.requests[0].target == "/k8s/clusters/c-1/api/v1/namespaces/a%20b"


async def test_a_header_with_a_line_break_is_refused() -> None:
    async with scripted(json_ok()) as (server, url), client(url) as api:
        api.configuration.api_key["BearerToken"] = "x\r\nX-Injected: 1"
        with pytest.raises(ValueError, match="line break"):
            await request_json(api, "GET", "/api/v1/x")
    assert server.requests == []


async def test_a_subclass_overriding_request_sees_every_raw_request() -> None:
    seen: list[str] = []

    class Tracing(LimitedApiClient):
        async def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            seen.append(f"{method} {url}")
            return await super().request(method, url, *args, **kwargs)

    async with scripted(json_ok()) as (_, url):
        configuration = Configuration()
        configuration.host = url
        async with Tracing(configuration, limiter=TokenBucket(0, 0), environ={}) as api:
            await request_json(api, "GET", "/api/v1/x")
            assert api.http_transport is None  # aiohttp carried it
    assert seen == [f"GET {url}/api/v1/x"]


async def test_lean_transport_can_be_turned_off() -> None:
    async with scripted(json_ok()) as (server, url):
        configuration = Configuration()
        configuration.host = url
        async with LimitedApiClient(
            configuration, limiter=TokenBucket(0, 0), environ={}, lean_transport=False
        ) as api:
            await request_json(api, "GET", "/api/v1/x")
            assert api.http_transport is None
    assert server.requests[0].headers["user-agent"] == kube_config.DEFAULT_USER_AGENT


async def test_resource_client_and_watch_against_the_api_server(apiserver: ApiServer) -> None:
    async with LimitedApiClient(
        apiserver.configuration(), limiter=TokenBucket(0, 0), environ={}
    ) as api:
        namespaces = ResourceClient(api, NAMESPACES)
        listed = await namespaces.list()
        created = await namespaces.create({"metadata": {"name": "lean"}})
        assert created["metadata"]["name"] == "lean"
        async with namespaces.watch(
            resource_version=listed["metadata"]["resourceVersion"], timeout_seconds=5
        ) as stream:
            names = []
            for i in range(3):
                await namespaces.create({"metadata": {"name": f"w{i}"}})
            async for event in stream:
                if event["type"] == "ADDED":
                    names.append(event["object"]["metadata"]["name"])
                if len(names) == 4:
                    break
        assert names == ["lean", "w0", "w1", "w2"]
        with pytest.raises(ApiException) as caught:
            await namespaces.create({"metadata": {"name": "lean"}})
        assert caught.value.status == 409
        assert api.http_transport is not None
    assert apiserver.requests.user_agents[-1] == kube_config.DEFAULT_USER_AGENT


# -- connections ---------------------------------------------------------------------------


async def test_at_most_limit_requests_in_flight() -> None:
    async def slow(request: Request, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(0.02)
        writer.write(response(200, b"{}"))

    async with scripted(slow) as (server, url), client(url, connection_pool_maxsize=3) as api:
        await asyncio.gather(*(request_json(api, "GET", f"/x/{i}") for i in range(12)))
    assert len(server.requests) == 12
    assert server.max_open == 3
    assert server.connections == 3


async def test_connection_close_and_idle_expiry_are_honoured() -> None:
    async def closing(request: Request, writer: asyncio.StreamWriter) -> str | None:
        if request.target == "/close":
            writer.write(response(200, b"{}", "Connection: close"))
            return "close"
        writer.write(response(200, b"{}"))
        return None

    async with scripted(closing) as (server, url), client(url) as api:
        await request_json(api, "GET", "/close")
        await request_json(api, "GET", "/keep")
        await request_json(api, "GET", "/keep")
        transport = api.http_transport
        assert transport is not None
        transport.keepalive_timeout = 0.05
        await asyncio.sleep(0.1)
        await request_json(api, "GET", "/keep")
    # A new connection after the close, kept for the next; another after the idle expiry.
    assert [r.connection for r in server.requests] == [1, 2, 2, 3]


async def test_a_closed_client_closes_its_connections_and_refuses_requests() -> None:
    async with scripted(json_ok()) as (server, url):
        api = client(url)
        await request_json(api, "GET", "/x")
        transport = api.http_transport
        assert transport is not None
        assert transport.connections == 1
        await api.close()
        assert transport.closed
        assert transport.connections == 0
        await asyncio.sleep(0.05)
        assert server.open_now == 0
        with pytest.raises(RuntimeError):
            await transport.request("GET", "/x", headers={})


# -- framing -------------------------------------------------------------------------------


async def _exchange_bytes(pieces: list[bytes], method: str = "GET") -> tuple[HttpResponse, bool]:
    """Feed ``pieces`` (a whole answer) to a connection; the response and whether the
    connection went back to the pool."""

    class Wire(asyncio.Transport):
        def __init__(self) -> None:
            super().__init__()
            self.written = b""
            self.aborted = False

        def write(self, data: Any) -> None:
            self.written += bytes(data)

        def abort(self) -> None:
            self.aborted = True

        def is_closing(self) -> bool:
            return self.aborted

        def pause_reading(self) -> None:
            pass

        def resume_reading(self) -> None:
            pass

    configuration = Configuration()
    configuration.host = "http://127.0.0.1:9"
    pool = HttpTransport(configuration)
    connection = _Connection(pool)
    wire = Wire()
    connection.connection_made(wire)
    waiter = connection.send(b"GET / HTTP/1.1\r\n\r\n", _Exchange(pool, method, None))
    for piece in pieces:
        connection.data_received(piece)
    answer = await waiter
    return answer, connection in pool._idle and not wire.aborted


def _splits(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(data)) for c in cuts})
    edges = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges) if b > a]


bodies = st.lists(st.binary(min_size=0, max_size=40), min_size=0, max_size=6)


@settings(max_examples=150, deadline=None)
@given(
    chunks=bodies,
    cuts=st.lists(st.integers(0, 400), max_size=12),
    extension=st.booleans(),
    trailer=st.booleans(),
    gzipped=st.booleans(),
)
def test_chunked_bodies_parse_whatever_the_splits(
    chunks: list[bytes], cuts: list[int], extension: bool, trailer: bool, gzipped: bool
) -> None:
    payload = b"".join(chunks)
    wire_chunks = [c for c in chunks if c]
    if gzipped:
        compressed = gzip.compress(payload)
        wire_chunks = [compressed[i : i + 7] for i in range(0, len(compressed), 7)]
    raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n"
    if gzipped:
        raw += b"Content-Encoding: gzip\r\n"
    raw += b"\r\n"
    for chunk in wire_chunks:
        raw += f"{len(chunk):x}".encode() + (b";x=1" if extension else b"") + b"\r\n"
        raw += chunk + b"\r\n"
    raw += b"0\r\n" + (b"X-Trailer: yes\r\n" if trailer else b"") + b"\r\n"

    async def run() -> None:
        answer, reusable = await _exchange_bytes(_splits(raw, cuts))
        assert await answer.read() == payload
        assert reusable

    asyncio.run(run())


@settings(max_examples=100, deadline=None)
@given(body=st.binary(max_size=300), cuts=st.lists(st.integers(0, 400), max_size=10))
def test_content_length_bodies_parse_whatever_the_splits(body: bytes, cuts: list[int]) -> None:
    raw = response(201, body, "Content-Type: application/octet-stream", reason="Created")

    async def run() -> None:
        answer, reusable = await _exchange_bytes(_splits(raw, cuts))
        assert (answer.status, answer.reason) == (201, "Created")
        assert answer.headers["content-type"] == "application/octet-stream"
        assert await answer.read() == body
        assert reusable

    asyncio.run(run())


@settings(max_examples=60, deadline=None)
@given(
    lines=st.lists(st.binary(max_size=30).map(lambda b: b.replace(b"\n", b"")), max_size=8),
    tail=st.binary(max_size=10).map(lambda b: b.replace(b"\n", b"")),
    cuts=st.lists(st.integers(0, 400), max_size=10),
)
def test_read_lines_returns_lines_in_order(
    lines: list[bytes], tail: bytes, cuts: list[int]
) -> None:
    text = b"".join(line + b"\n" for line in lines) + tail
    raw = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + text

    async def run() -> None:
        answer, _ = await _exchange_bytes(_splits(raw, cuts))
        if answer._connection is not None:
            answer._connection.connection_lost(None)  # the server closes: the body ends
        got: list[bytes] = []
        while batch := await answer.read_lines():
            got.extend(batch)
        expected = [line + b"\n" for line in lines] + ([tail] if tail else [])
        assert got == expected

    asyncio.run(run())


async def test_interim_answers_no_body_statuses_and_head() -> None:
    answer, reusable = await _exchange_bytes(
        [b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\nX: y\r\n\r\n"]
    )
    assert answer.status == 204
    assert await answer.read() == b""
    assert reusable
    answer, reusable = await _exchange_bytes(
        [b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n"], method="HEAD"
    )
    assert await answer.read() == b""
    assert reusable


async def test_http_1_0_reads_until_close_and_is_not_reused() -> None:
    answer, reusable = await _exchange_bytes([b"HTTP/1.0 200 OK\r\n\r\nhello"])
    assert not reusable
    assert answer._connection is not None
    answer._connection.connection_lost(None)
    assert await answer.read() == b"hello"


@pytest.mark.parametrize(
    "raw",
    [
        b"HTTX/1.1 200 OK\r\n\r\n",
        b"HTTP/1.1 abc OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Encoding: br\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nab\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nab",
    ],
)
async def test_malformed_answers_fail_as_client_errors(raw: bytes) -> None:
    async def exchange() -> bytes:
        answer, _ = await _exchange_bytes([raw])
        return await answer.read()

    with pytest.raises(HttpProtocolError) as caught:
        await exchange()
    assert isinstance(caught.value, aiohttp.ClientError)


async def test_gzip_body_is_decoded() -> None:
    payload = json.dumps({"items": ["x" * 50] * 200}).encode()

    async def gzipped(request: Request, writer: asyncio.StreamWriter) -> None:
        assert request.headers["accept-encoding"] == "gzip"
        writer.write(response(200, gzip.compress(payload), "Content-Encoding: gzip"))

    async with scripted(gzipped) as (_, url), client(url) as api:
        assert await request_json(api, "GET", "/x") == json.loads(payload)


# -- streams and flow control --------------------------------------------------------------


async def test_a_stream_faster_than_its_reader_is_paused_and_arrives_whole() -> None:
    line = json.dumps({"type": "ADDED", "object": {"pad": "p" * 1000}}).encode() + b"\n"
    count = 6000  # ~6 MB, more than the high-water mark many times over

    async def stream(request: Request, writer: asyncio.StreamWriter) -> str:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(count // 100):
            block = line * 100
            writer.write(f"{len(block):x}\r\n".encode() + block + b"\r\n")
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return "close"

    async with scripted(stream) as (_, url), client(url) as api:
        answer = await send_request(api, "GET", "/watch")
        assert isinstance(answer, HttpResponse)
        await asyncio.sleep(0.3)  # let the sender run ahead of us
        assert len(answer._body) - answer._pos < 4 << 20  # bounded, not 6 MB
        got = 0
        while batch := await answer.read_lines():
            got += len(batch)
            assert all(item == line for item in batch)
        answer.release()
    assert got == count


# -- failures ------------------------------------------------------------------------------


async def test_refused_connection_is_a_connector_error() -> None:
    srv = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    srv.close()
    await srv.wait_closed()
    async with client(f"http://127.0.0.1:{port}") as api:
        with pytest.raises(aiohttp.ClientConnectorError):
            await request_json(api, "GET", "/x")


async def test_a_pooled_connection_closed_by_the_server_is_retried_for_gets_only() -> None:
    served: dict[int, int] = {}

    async def second_request_closes(request: Request, writer: asyncio.StreamWriter) -> str | None:
        # Every connection answers once, then closes on the next request without an answer:
        # a keep-alive connection the server dropped just as the client reused it.
        served[request.connection] = served.get(request.connection, 0) + 1
        if served[request.connection] > 1:
            return "close"
        writer.write(response(200, b'{"ok":true}'))
        return None

    async with scripted(second_request_closes) as (server, url), client(url) as api:
        await request_json(api, "GET", "/a")
        assert await request_json(api, "GET", "/b") == {"ok": True}  # retried
        with pytest.raises((aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)):
            await request_json(api, "POST", "/c", body={})  # not idempotent: no retry
    assert [(r.target, r.connection) for r in server.requests] == [
        ("/a", 1),
        ("/b", 1),
        ("/b", 2),
        ("/c", 2),
    ]


async def test_disconnect_mid_body_is_a_payload_error() -> None:
    async def truncated(request: Request, writer: asyncio.StreamWriter) -> str:
        writer.write(b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"partial":')
        await writer.drain()
        return "close"

    async with scripted(truncated) as (_, url), client(url) as api:
        with pytest.raises(aiohttp.ClientPayloadError):
            await request_json(api, "GET", "/x")


async def test_read_idle_timeout_fails_requests_and_watches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(kube_config, "READ_IDLE_TIMEOUT", 0.2)
    monkeypatch.setattr(kube_rest, "READ_IDLE_TIMEOUT", 0.2)

    async def silent(request: Request, writer: asyncio.StreamWriter) -> None:
        if "watch=true" in request.target:
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            line = b'{"type":"ADDED","object":{}}\n'
            writer.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
        await asyncio.sleep(3600)  # then nothing, connection open: a dead peer

    async with scripted(silent) as (_, url), client(url) as api:
        started = time.monotonic()
        with pytest.raises(aiohttp.ServerTimeoutError):
            await request_json(api, "GET", "/x")
        assert time.monotonic() - started < 2
        stream = ResourceClient(api, NAMESPACES).watch(resource_version="1")
        events: list[Any] = []

        async def drain() -> None:
            async with stream:
                async for event in stream:
                    events.append(event)

        # aiohttp.ClientError: what the informer takes as a broken stream and resumes.
        with pytest.raises(aiohttp.ClientError):
            await drain()
        assert events == [{"type": "ADDED", "object": {}}]


async def test_total_timeout_and_client_request_timeout() -> None:
    async def slow(request: Request, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(3600)

    async with scripted(slow) as (_, url):
        configuration = Configuration()
        configuration.host = url
        async with LimitedApiClient(
            configuration, limiter=TokenBucket(0, 0), environ={}, request_timeout=0.1
        ) as api:
            with pytest.raises(asyncio.TimeoutError):
                await request_json(api, "GET", "/x")
            # A watch is long-running: the client's request timeout does not apply to it.
            pending = asyncio.create_task(request_json(api, "GET", "/y", query=[("watch", "true")]))
            await asyncio.sleep(0.3)
            assert not pending.done()
            pending.cancel()
            with pytest.raises(asyncio.CancelledError):
                await pending


async def test_cancelled_request_frees_its_slot_and_connection() -> None:
    gate = asyncio.Event()

    async def held(request: Request, writer: asyncio.StreamWriter) -> None:
        if request.target == "/hold":
            await gate.wait()
        writer.write(response(200, b"{}"))

    async with scripted(held) as (server, url), client(url, connection_pool_maxsize=1) as api:
        task = asyncio.create_task(request_json(api, "GET", "/hold"))
        while not server.requests:
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # The only slot is free again; the abandoned connection is not reused.
        async with asyncio.timeout(5):
            assert await request_json(api, "GET", "/next") == {}
        gate.set()
    assert [r.connection for r in server.requests] == [1, 2]


# -- TLS -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1 and apiserver.test, a client certificate
    (CN client) and an unrelated CA, as files (trustme)."""
    d = tmp_path_factory.mktemp("pki")
    ca, other_ca = trustme.CA(), trustme.CA()
    files: dict[str, Path] = {"ca": d / "ca.crt", "other-ca": d / "other-ca.crt"}
    ca.cert_pem.write_to_path(str(files["ca"]))
    other_ca.cert_pem.write_to_path(str(files["other-ca"]))
    leaves = {
        "server": ca.issue_cert("127.0.0.1", "apiserver.test"),
        "client": ca.issue_cert("client.test", common_name="client"),
    }
    for name, leaf in leaves.items():
        files[name] = d / f"{name}.crt"
        files[f"{name}.key"] = d / f"{name}.key"
        leaf.cert_chain_pems[0].write_to_path(str(files[name]))
        leaf.private_key_pem.write_to_path(str(files[f"{name}.key"]))
    return files


def _server_context(pki: dict[str, Path]) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(pki["ca"]))
    context.load_cert_chain(str(pki["server"]), str(pki["server.key"]))
    context.verify_mode = ssl.CERT_REQUIRED
    return context


async def test_tls_with_a_client_certificate(pki: dict[str, Path]) -> None:
    async with scripted(json_ok({"kind": "Tls"}), ssl_context=_server_context(pki)) as (
        server,
        url,
    ):
        async with client(
            url,
            ssl_ca_cert=str(pki["ca"]),
            cert_file=str(pki["client"]),
            key_file=str(pki["client.key"]),
        ) as api:
            assert await request_json(api, "GET", "/x") == {"kind": "Tls"}
            assert api.http_transport is not None
            assert api.http_transport.is_ssl
        # SNI/verification against another name than the URL's host (tls-server-name).
        async with client(
            url,
            ssl_ca_cert=str(pki["ca"]),
            cert_file=str(pki["client"]),
            key_file=str(pki["client.key"]),
            tls_server_name="apiserver.test",
        ) as api:
            assert await request_json(api, "GET", "/x") == {"kind": "Tls"}
    assert (("commonName", "client"),) in server.peer_subjects[0]


async def test_tls_verification_failures_and_verify_ssl_off(pki: dict[str, Path]) -> None:
    async with scripted(json_ok(), ssl_context=_server_context(pki)) as (_, url):
        async with client(
            url,
            ssl_ca_cert=str(pki["other-ca"]),
            cert_file=str(pki["client"]),
            key_file=str(pki["client.key"]),
        ) as api:
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                await request_json(api, "GET", "/x")
        async with client(
            url,
            ssl_ca_cert=str(pki["ca"]),
            cert_file=str(pki["client"]),
            key_file=str(pki["client.key"]),
            tls_server_name="wrong.test",
        ) as api:
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                await request_json(api, "GET", "/x")
        async with client(
            url,
            ssl_ca_cert=str(pki["other-ca"]),
            cert_file=str(pki["client"]),
            key_file=str(pki["client.key"]),
            verify_ssl=False,
        ) as api:
            assert await request_json(api, "GET", "/x") == {"kind": "Status"}

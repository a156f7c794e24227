"""The in-memory API server's HTTP/1.1 transport: a small asyncio protocol instead of
aiohttp's web server, whose request and response objects cost about as much CPU as serving the
request itself (two thirds of a GET).

It speaks what Kubernetes clients use: keep-alive and pipelined requests, Content-Length and
chunked request bodies, ``Expect: 100-continue``, HEAD, chunked responses for watch streams
with flow control, and a cancelled handler when the client goes away or stops sending (a watch
ends with its connection; a request still held by injected latency has no effect), as with
aiohttp's server before. Malformed requests get a 400 and the connection is closed; bodies over
the limit get the server's 413 Status.
"""

from __future__ import annotations

import asyncio
import contextlib
import http
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from typing import Protocol
from urllib.parse import parse_qsl, unquote

from multidict import CIMultiDict, MultiDict, MultiMapping

from pyprovlib._logging import get_logger

__all__ = ["HttpServer", "Reply", "Request", "Stream", "WireRequest"]

log = get_logger(__name__)

_JSON = "application/json"
_JSON_HEADERS: Mapping[str, str] = {"Content-Type": _JSON}
_MAX_HEAD_BYTES = 1024 * 1024
_REASONS = {s.value: s.phrase.encode() for s in http.HTTPStatus}


class Reply:
    """A complete response: status, body and headers."""

    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, body: bytes, headers: Mapping[str, str] = _JSON_HEADERS):
        self.status = status
        self.body = body
        self.headers = headers


class Stream:
    """A streamed (watch) response: its chunks, produced as they happen. Close ``chunks``
    (``contextlib.aclosing``) when done with it: that ends the watch."""

    __slots__ = ("chunks",)

    def __init__(self, chunks: AsyncGenerator[bytes, None]) -> None:
        self.chunks = chunks


class Request(Protocol):
    """What serving a request reads of it, whichever way it came."""

    @property
    def method(self) -> str: ...

    @property
    def path(self) -> str: ...

    @property
    def query(self) -> MultiMapping[str]: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    @property
    def content_type(self) -> str: ...

    async def read(self) -> bytes: ...


Handler = Callable[[Request], Awaitable[Reply | Stream]]


class WireRequest:
    """A request as parsed off the wire (or built in process): everything, body included."""

    __slots__ = ("_body", "content_type", "headers", "method", "path", "query", "version")

    def __init__(
        self,
        method: str,
        path: str,
        *,
        query: MultiDict[str],
        headers: CIMultiDict[str] | Mapping[str, str],
        body: bytes,
        version: str = "HTTP/1.1",
        content_type: str | None = None,
    ) -> None:
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.version = version
        self._body = body
        if content_type is None:
            # the media type alone, as aiohttp's request.content_type gives it
            raw = headers.get("Content-Type", "")
            content_type = raw.split(";", 1)[0].strip().lower() if raw else ""
        self.content_type = content_type

    async def read(self) -> bytes:
        """The whole body."""
        return self._body


class _BadRequest:
    """A request the connection could not parse: answered with ``status``, then closed."""

    __slots__ = ("message", "status")

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        self.message = message


class _Head:
    """A parsed request head waiting for its body."""

    __slots__ = ("chunked", "headers", "length", "method", "target", "version")

    def __init__(
        self,
        method: str,
        target: str,
        version: str,
        *,
        headers: CIMultiDict[str],
        length: int,
        chunked: bool,
    ) -> None:
        self.method = method
        self.target = target
        self.version = version
        self.headers = headers
        self.length = length
        self.chunked = chunked


def _parse_head(data: bytes, max_body: int) -> _Head | _BadRequest:
    try:
        text = data.decode("latin-1")
    except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes every byte
        return _BadRequest(400, "undecodable request head")
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[0].isalpha() or not parts[1]:
        return _BadRequest(400, f"malformed request line {lines[0][:100]!r}")
    method, target, version = parts
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        return _BadRequest(505 if version.startswith("HTTP/") else 400, "unsupported version")
    headers: CIMultiDict[str] = CIMultiDict()
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            return _BadRequest(400, f"malformed header line {line[:100]!r}")
        headers.add(name, value.strip())
    chunked = False
    length = 0
    encoding = headers.get("Transfer-Encoding")
    if encoding is not None:
        if encoding.lower() != "chunked":
            return _BadRequest(501, f"unsupported Transfer-Encoding {encoding!r}")
        if "Content-Length" in headers:
            return _BadRequest(400, "both Content-Length and Transfer-Encoding")
        chunked = True
    elif "Content-Length" in headers:
        values = headers.getall("Content-Length")
        raw = values[0]
        if len(set(values)) != 1 or not raw.isdigit():
            return _BadRequest(400, f"invalid Content-Length {raw!r}")
        length = int(raw)
        if length > max_body:
            return _BadRequest(413, "")
    return _Head(method, target, version, headers=headers, length=length, chunked=chunked)


def _parse_chunked(buf: bytearray, max_body: int) -> tuple[bytes, int] | _BadRequest | None:
    """A complete chunked body at the start of ``buf``: (body, bytes used); None when more
    is needed."""
    pos = 0
    out = bytearray()
    while True:
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            return None
        size_text = bytes(buf[pos:eol]).split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            return _BadRequest(400, "malformed chunk size")
        if size < 0:
            return _BadRequest(400, "malformed chunk size")
        pos = eol + 2
        if size == 0:
            # trailers, up to an empty line
            while True:
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    return None
                if eol == pos:
                    return bytes(out), eol + 2
                pos = eol + 2
        if len(out) + size > max_body:
            return _BadRequest(413, "")
        if len(buf) < pos + size + 2:
            return None
        out += buf[pos : pos + size]
        if buf[pos + size : pos + size + 2] != b"\r\n":
            return _BadRequest(400, "malformed chunk")
        pos += size + 2


def _split_target(target: str) -> tuple[str, MultiDict[str]]:
    if target.startswith(("http://", "https://")):
        # absolute form: drop scheme and authority
        slash = target.find("/", target.find("//") + 2)
        target = target[slash:] if slash >= 0 else "/"
    path, _, query = target.partition("?")
    return unquote(path), MultiDict(parse_qsl(query, keep_blank_values=True))


class _Connection(asyncio.Protocol):
    """One client connection: parses requests as bytes arrive; a task per connection
    answers them in order."""

    def __init__(self, server: HttpServer) -> None:
        self._server = server
        self._loop = server.loop
        self._transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._head: _Head | None = None
        self._continued = False
        self._ready: deque[WireRequest | _BadRequest] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._drain: asyncio.Future[None] | None = None
        self._paused = False
        self._broken = False  # a parse error is queued: read nothing more
        self.lost = False
        self.idle = True
        self.closing = False
        self.task: asyncio.Task[None] | None = None

    # --- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._server.connections.add(self)
        self.task = self._loop.create_task(self._run())
        self.task.add_done_callback(_retrieve)

    def data_received(self, data: bytes) -> None:
        if self._broken:
            return
        self._buf += data
        self._parse()
        self._wake()

    def eof_received(self) -> bool:
        # A client that stops sending has gone away: close, which cancels a request still
        # being served (a watch, or one held by injected latency) so that it has no effect —
        # as aiohttp's server did, and as Go's cancels the request's context.
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._server.connections.discard(self)
        # A client gone mid-request cancels its handler (an open watch ends), as aiohttp's
        # handler_cancellation did.
        if self.task is not None and not self.task.done():
            self.task.cancel()
        self._wake()
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    # --- parsing ---------------------------------------------------------------------------

    def _parse(self) -> None:
        buf = self._buf
        max_body = self._server.max_body
        while not self._broken:
            head = self._head
            if head is None:
                while buf.startswith(b"\r\n"):
                    # empty lines before a request line are ignored (RFC 9112 2.2)
                    del buf[:2]
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(buf) > _MAX_HEAD_BYTES:
                        self._fail(_BadRequest(431, "request header fields too large"))
                    return
                parsed = _parse_head(bytes(buf[:end]), max_body)
                del buf[: end + 4]
                if isinstance(parsed, _BadRequest):
                    self._fail(parsed)
                    return
                self._head = head = parsed
                self._continued = False
            if head.chunked:
                result = _parse_chunked(buf, max_body)
                if isinstance(result, _BadRequest):
                    self._fail(result)
                    return
                if result is None:
                    self._maybe_continue(head)
                    return
                body, used = result
                del buf[:used]
            else:
                if len(buf) < head.length:
                    self._maybe_continue(head)
                    return
                body = bytes(buf[: head.length])
                del buf[: head.length]
            self._head = None
            path, query = _split_target(head.target)
            self._ready.append(
                WireRequest(
                    head.method,
                    path,
                    query=query,
                    headers=head.headers,
                    body=body,
                    version=head.version,
                )
            )

    def _maybe_continue(self, head: _Head) -> None:
        if (
            not self._continued
            and head.version == "HTTP/1.1"
            and head.headers.get("Expect", "").lower() == "100-continue"
            and self._transport is not None
        ):
            self._continued = True
            self._transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def _fail(self, bad: _BadRequest) -> None:
        self._broken = True
        self._buf.clear()
        self._ready.append(bad)

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # --- answering -------------------------------------------------------------------------

    async def _next(self) -> WireRequest | _BadRequest | None:
        while not self._ready:
            if self.lost or self.closing:
                return None
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._ready.popleft()

    async def _run(self) -> None:
        try:
            while True:
                self.idle = True
                request = await self._next()
                self.idle = False
                if request is None:
                    break
                if isinstance(request, _BadRequest):
                    self._write_bad(request)
                    break
                if not await self._answer(request):
                    break
        finally:
            self.idle = True
            transport = self._transport
            if transport is not None and not transport.is_closing():
                transport.close()

    def _keep_alive(self, request: WireRequest) -> bool:
        connection = request.headers.get("Connection", "").lower()
        if request.version == "HTTP/1.0":
            return connection == "keep-alive"
        return connection != "close"

    async def _answer(self, request: WireRequest) -> bool:
        reply = await self._server.handler(request)
        keep_alive = self._keep_alive(request) and not self.closing
        if isinstance(reply, Reply):
            self._write_reply(request, reply, keep_alive)
            return keep_alive
        return await self._write_stream(request, reply, keep_alive)

    def _head_bytes(
        self, status: int, headers: Mapping[str, str], framing: bytes, keep_alive: bool
    ) -> bytes:
        lines = [b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b"Unknown"))]
        for name, value in headers.items():
            lines.append(b"%s: %s\r\n" % (name.encode(), value.encode()))
        lines.append(framing)
        if not keep_alive:
            lines.append(b"Connection: close\r\n")
        lines.append(b"\r\n")
        return b"".join(lines)

    def _write_reply(self, request: WireRequest, reply: Reply, keep_alive: bool) -> None:
        transport = self._transport
        if transport is None or self.lost:
            return
        head = self._head_bytes(
            reply.status, reply.headers, b"Content-Length: %d\r\n" % len(reply.body), keep_alive
        )
        transport.write(head if request.method == "HEAD" else head + reply.body)

    def _write_bad(self, bad: _BadRequest) -> None:
        if bad.status == 413:
            reply = self._server.too_large()
        else:
            reply = Reply(
                bad.status, bad.message.encode(), {"Content-Type": "text/plain; charset=utf-8"}
            )
        transport = self._transport
        if transport is not None and not self.lost:
            head = self._head_bytes(
                reply.status, reply.headers, b"Content-Length: %d\r\n" % len(reply.body), False
            )
            transport.write(head + reply.body)

    async def _write_stream(self, request: WireRequest, stream: Stream, keep_alive: bool) -> bool:
        transport = self._transport
        assert transport is not None
        head = self._head_bytes(200, _JSON_HEADERS, b"Transfer-Encoding: chunked\r\n", keep_alive)
        if request.method == "HEAD":
            # the head alone; the watch is not started
            await stream.chunks.aclose()
            transport.write(head)
            return keep_alive
        async with contextlib.aclosing(stream.chunks) as chunks:
            sent_head = False
            async for chunk in chunks:
                if self.lost:
                    return False
                out = b"" if sent_head else head
                sent_head = True
                if chunk:
                    # an empty chunk would end the stream: b"" only flushes the head
                    out += b"%x\r\n%s\r\n" % (len(chunk), chunk)
                if out:
                    transport.write(out)
                if self._paused:
                    await self._drained()
            if self.lost:
                return False
            transport.write((b"" if sent_head else head) + b"0\r\n\r\n")
        return keep_alive

    async def _drained(self) -> None:
        while self._paused and not self.lost:
            self._drain = self._loop.create_future()
            try:
                await self._drain
            finally:
                self._drain = None

    def shut(self) -> None:
        """Stop taking requests: an idle connection closes now, a busy one after its answer."""
        self.closing = True
        if self.idle and self._transport is not None:
            self._transport.close()
        self._wake()

    def abort(self) -> None:
        """Drop the connection now (its handler is cancelled)."""
        if self._transport is not None:
            self._transport.abort()
        if self.task is not None and not self.task.done():
            self.task.cancel()


def _retrieve(task: asyncio.Task[None]) -> None:
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None and not isinstance(exc, (ConnectionError, OSError)):
        log.error("apiserver connection failed", error=repr(exc))


class HttpServer:
    """Listens on host:port and answers every request with ``handler``."""

    def __init__(
        self,
        handler: Handler,
        *,
        max_body: int,
        too_large: Callable[[], Reply],
    ) -> None:
        self.handler = handler
        self.max_body = max_body
        self.too_large = too_large
        self.loop = asyncio.get_running_loop()
        self.connections: set[_Connection] = set()
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen; returns the port (the real one when 0 was asked for)."""
        self._server = await self.loop.create_server(
            lambda: _Connection(self), host, port, reuse_address=True
        )
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self, timeout: float) -> None:  # noqa: ASYNC109
        """Stop listening and close every connection: idle ones at once, busy ones once
        answered, within ``timeout`` seconds (then they are dropped)."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for conn in list(self.connections):
            conn.shut()
        busy = [c.task for c in self.connections if c.task is not None and not c.task.done()]
        if busy:
            await asyncio.wait(busy, timeout=timeout)
        for conn in list(self.connections):
            conn.abort()
        tasks = [c.task for c in self.connections if c.task is not None]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self.connections.clear()
        if server is not None:
            await server.wait_closed()

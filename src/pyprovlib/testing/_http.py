"""The in-memory API server's HTTP transport, on aiohttp's (low-level) web server.

aiohttp speaks what Kubernetes clients use (keep-alive and pipelined requests, chunked request
bodies, HEAD, malformed requests answered with 400); this module only turns its requests into
the server's :class:`Request` (answering ``Expect: 100-continue`` as aiohttp's router would)
and the server's answers into aiohttp responses: a :class:`Reply` as one response, a
:class:`Stream` (a watch) as a chunked response written as each chunk is produced. With
``handler_cancellation`` a client that goes away cancels its request: an open watch ends, and
a request held by injected latency has no effect, as Go's server cancels the request's
context. Bodies over the limit get the server's 413 Status and the connection is closed.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import KW_ONLY, dataclass
from typing import Protocol

from aiohttp import HttpVersion11, web
from multidict import CIMultiDict, MultiMapping

from pyprovlib._logging import get_logger

__all__ = ["HttpServer", "Reply", "Request", "Stream", "WireRequest"]

log = get_logger(__name__)

_JSON = "application/json"
_JSON_HEADERS: Mapping[str, str] = {"Content-Type": _JSON}


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


@dataclass(slots=True, eq=False)
class WireRequest:
    """A request with its whole body read (off the wire, or built in process)."""

    method: str
    path: str
    _: KW_ONLY
    query: MultiMapping[str]
    headers: CIMultiDict[str] | Mapping[str, str]
    body: bytes
    content_type: str
    """The media type alone, empty when the request names none (see :func:`media_type`)."""
    version: str = "HTTP/1.1"

    async def read(self) -> bytes:
        """The whole body."""
        return self.body


def media_type(headers: Mapping[str, str]) -> str:
    """The media type of a ``Content-Type`` header, without parameters; empty when there is
    none (aiohttp's ``request.content_type`` would say application/octet-stream)."""
    raw = headers.get("Content-Type", "")
    return raw.split(";", 1)[0].strip().lower() if raw else ""


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
        self._runner: web.ServerRunner | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen; returns the port (the real one when 0 was asked for)."""
        # aiohttp's low-level server: the API server routes by itself.
        server = web.Server(
            self._handle,
            handler_cancellation=True,
            access_log=None,
            # A body refused as too large is not read: close at once, as the real server
            # does, rather than reading and dropping it for up to 10 s first.
            lingering_time=0,
        )
        runner = web.ServerRunner(server, handle_signals=False, shutdown_timeout=0.5)
        await runner.setup()
        try:
            site = web.TCPSite(runner, host, port, reuse_address=True)
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        return int(runner.addresses[0][1])

    async def close(self) -> None:
        """Stop listening and close every connection: idle ones at once, busy ones once
        answered, within the shutdown timeout (then they are dropped)."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        if (request.content_length or 0) > self.max_body:
            return self._reply(self.too_large(), close=True)
        body = b""
        if request.body_exists:
            if (
                request.version == HttpVersion11
                and request.headers.get("Expect", "").lower() == "100-continue"
            ):
                # What aiohttp's router does for a route's requests.
                await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            data = bytearray()
            async for piece in request.content.iter_any():
                data += piece
                if len(data) > self.max_body:
                    return self._reply(self.too_large(), close=True)
            body = bytes(data)
        wire = WireRequest(
            request.method,
            request.path,
            query=request.query,
            headers=request.headers,
            body=body,
            content_type=media_type(request.headers),
            version="HTTP/1.1" if request.version == HttpVersion11 else "HTTP/1.0",
        )
        reply = await self.handler(wire)
        if isinstance(reply, Reply):
            return self._reply(reply)
        return await self._stream(request, reply)

    @staticmethod
    def _reply(reply: Reply, *, close: bool = False) -> web.Response:
        response = web.Response(status=reply.status, body=reply.body, headers=reply.headers)
        if close:
            response.force_close()
        return response

    @staticmethod
    async def _stream(request: web.BaseRequest, stream: Stream) -> web.StreamResponse:
        response = web.StreamResponse(headers=_JSON_HEADERS)
        response.enable_chunked_encoding()
        async with contextlib.aclosing(stream.chunks) as chunks:
            # The head goes out at once (a client sees its watch open before any event); a
            # HEAD request gets the head alone and the watch is not started.
            await response.prepare(request)
            if request.method != "HEAD":
                async for chunk in chunks:
                    if chunk:
                        # each event is flushed as it happens; b"" only opened the stream
                        await response.write(chunk)
        await response.write_eof()
        return response

"""A lean HTTP/1.1 client for pyprovlib's raw-JSON requests and watches.

:func:`pyprovlib.kube.config.send_request` (every ResourceClient call, informer LIST and WATCH,
event write and lease update) sends through :class:`HttpTransport` when the client talks to
the API server directly. aiohttp's general-purpose request path — URL objects, header
multidicts, the payload registry, tracing hooks, per-chunk timers, stream readers — costs
~100-150 µs of CPU per request on a loopback connection; this one speaks just the HTTP/1.1
the Kubernetes API needs (keep-alive, Content-Length and chunked bodies, gzip) at about half
of that. TLS uses an ``ssl.SSLContext`` built exactly as kubernetes-asyncio builds its own
(CA bundle, client certificate, ``verify_ssl``, ``tls_server_name``), and the timeouts keep
aiohttp's meaning and exception types (``aiohttp.ClientTimeout``: ``total``, ``connect``,
``sock_connect``, ``sock_read``), so callers see the same errors either way. Requests through
a proxy stay on aiohttp (see :meth:`pyprovlib.kube.config.LimitedApiClient.send`).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import ssl
import zlib
from collections import deque
from collections.abc import Mapping
from typing import Any, Protocol
from urllib.parse import quote, urlsplit

import aiohttp
from aiohttp.client_reqrep import ConnectionKey
from kubernetes_asyncio.client import Configuration
from multidict import CIMultiDict, CIMultiDictProxy

__all__ = [
    "KEEPALIVE_TIMEOUT",
    "HttpProtocolError",
    "HttpResponse",
    "HttpTransport",
    "RawResponse",
    "ssl_context_for",
]

KEEPALIVE_TIMEOUT = 15.0
"""Seconds an idle pooled connection is kept (aiohttp's ``TCPConnector`` default)."""

# Request methods a disconnect may be retried for once (RFC 9112 section 9.3.1.1; aiohttp
# retries these too when a pooled connection turns out to be closed).
_IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})
_NO_BODY_STATUS = frozenset({204, 304})
_MAX_HEAD = 1 << 20
# A streamed body (a watch) stops being read from the socket while this much waits for the
# consumer, and resumes below the low mark: memory stays bounded if events come faster than
# they are handled. aiohttp's session reads with a 2 MiB buffer for the same reason.
_HIGH_WATER = 1 << 21
_LOW_WATER = 1 << 19
# Characters a request target may carry as they are (RFC 3986 pchar, "/", "?" and "%" of
# an existing escape); anything else is percent-encoded, as yarl does for aiohttp.
_SAFE_TARGET = re.compile(r"[A-Za-z0-9\-._~!$&'()*+,;=:@/?%]*")


class HttpProtocolError(aiohttp.ClientConnectionError):
    """The server's answer was not valid HTTP/1.1 (a broken or hostile peer)."""


class RawContent(Protocol):
    """The body reader of a :class:`RawResponse` (aiohttp's ``StreamReader`` subset)."""

    async def read(self, n: int = -1) -> bytes:
        """The rest of the body."""

    async def readline(self) -> bytes:
        """The next line, ``\\n`` included; the unterminated tail at the end; b"" after it."""


class RawResponse(Protocol):
    """What :func:`pyprovlib.kube.config.send_request` returns: an :class:`HttpResponse` or an
    ``aiohttp.ClientResponse`` (both satisfy it)."""

    @property
    def status(self) -> int:
        """The HTTP status code."""

    @property
    def reason(self) -> str | None:
        """The status line's reason phrase."""

    @property
    def headers(self) -> CIMultiDictProxy[str]:
        """The response headers."""

    @property
    def content(self) -> RawContent:
        """The body."""

    def release(self) -> Any:
        """Done with the response: its connection goes back to the pool if reusable."""

    def close(self) -> None:
        """Close the response's connection."""


def ssl_context_for(configuration: Configuration) -> ssl.SSLContext:
    """The TLS context kubernetes-asyncio's ``RESTClientObject`` builds for
    ``configuration``: the CA bundle (``ssl_ca_cert``, else the system's), the client
    certificate and key, ``verify_ssl`` and ``disable_strict_ssl_verification``."""
    context = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
    if configuration.cert_file:
        context.load_cert_chain(configuration.cert_file, keyfile=configuration.key_file)
    if not configuration.verify_ssl:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if getattr(configuration, "disable_strict_ssl_verification", False):
        context.verify_flags &= ~ssl.VERIFY_X509_STRICT
    return context


def _values(lower_head: str, name: str) -> list[str]:
    """The values of every ``name`` header (lower case) in a lower-cased response head."""
    values: list[str] = []
    marker = f"\r\n{name}:"
    start = lower_head.find(marker)
    while start >= 0:
        start += len(marker)
        end = lower_head.find("\r\n", start)
        values.append(lower_head[start : end if end >= 0 else None].strip(" \t"))
        start = lower_head.find(marker, start)
    return values


def _tokens(values: list[str]) -> list[str]:
    """The comma-separated tokens of header values, in order."""
    return [token for value in values for token in map(str.strip, value.split(",")) if token]


class _Exchange:
    """One request from start to the end of its response: the slot it holds, its timeouts."""

    __slots__ = ("method", "pool", "read_timeout", "slot_held", "total_handle")

    def __init__(self, pool: HttpTransport, method: str, read_timeout: float | None) -> None:
        self.pool = pool
        self.method = method
        self.read_timeout = read_timeout
        self.total_handle: asyncio.TimerHandle | None = None
        self.slot_held = False

    def end(self) -> None:
        """Free the slot and stop the total timer (idempotent)."""
        if self.total_handle is not None:
            self.total_handle.cancel()
            self.total_handle = None
        if self.slot_held:
            self.slot_held = False
            self.pool._release_slot()


class HttpResponse:
    """One response of an :class:`HttpTransport`: status, headers and a body that arrives
    in the background. Read the body with :meth:`read`, :meth:`readline` or
    :meth:`read_lines` (``content`` is the response itself, for aiohttp-style
    ``response.content.read()``), then :meth:`release` it. The connection goes back to the
    pool as soon as the body is complete; :meth:`release` or :meth:`close` before that
    closes it."""

    def __init__(self, connection: _Connection, status: int, reason: str) -> None:
        self._connection: _Connection | None = connection
        self.status = status
        self.reason: str | None = reason
        self.version = (1, 1)
        self._head = ""
        self._headers: CIMultiDictProxy[str] | None = None
        self._body = bytearray()
        self._pos = 0
        self._eof = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._decoder: Any = None
        self._reading_all = False

    def __repr__(self) -> str:
        return f"<HttpResponse {self.status} {self.reason or ''}>"

    @property
    def headers(self) -> CIMultiDictProxy[str]:
        """The response headers (case-insensitive)."""
        if self._headers is None:
            headers: CIMultiDict[str] = CIMultiDict()
            for line in self._head.split("\r\n")[1:]:
                name, sep, value = line.partition(":")
                if sep and name and name == name.strip():
                    headers.add(name, value.strip(" \t"))
            self._headers = CIMultiDictProxy(headers)
        return self._headers

    @property
    def content(self) -> HttpResponse:
        """The body reader: the response itself."""
        return self

    # -- fed by the connection -----------------------------------------------------------

    def _feed(self, data: bytes) -> None:
        if self._decoder is not None:
            try:
                data = self._decoder.decompress(data)
            except zlib.error as err:
                raise HttpProtocolError(f"cannot decompress the body: {err}") from None
            if not data:
                return
        self._body += data
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)
        elif (
            not self._reading_all
            and len(self._body) - self._pos > _HIGH_WATER
            and self._connection is not None
        ):
            self._connection.pause()

    def _feed_eof(self) -> None:
        if self._decoder is not None:
            try:
                tail = self._decoder.flush()
            except zlib.error as err:  # pragma: no cover - flush reports truncation via eof
                raise HttpProtocolError(f"cannot decompress the body: {err}") from None
            if tail:
                self._body += tail
            if not self._decoder.eof:
                raise HttpProtocolError("the compressed body is truncated")
        self._eof = True
        self._wake()

    def _feed_error(self, error: BaseException) -> None:
        if self._eof or self._error is not None:
            return
        self._error = error
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def _wait(self) -> None:
        connection = self._connection
        if connection is None:  # ended without an error or eof: cannot happen
            raise aiohttp.ClientConnectionError("response already closed")
        connection.resume()
        waiter = connection.loop.create_future()
        self._waiter = waiter
        try:
            await waiter
        finally:
            self._waiter = None

    def _take(self, end: int) -> bytes:
        body = self._body
        chunk = bytes(body[self._pos : end])
        self._pos = end
        if end == len(body):
            body.clear()
            self._pos = 0
        elif end > 65536 and end * 2 > len(body):
            del body[:end]
            self._pos = 0
        connection = self._connection
        if connection is not None and connection.paused and len(body) - self._pos < _LOW_WATER:
            connection.resume()
        return chunk

    # -- the body --------------------------------------------------------------------------

    async def read(self, n: int = -1) -> bytes:
        """The rest of the body (with ``n`` >= 0: up to ``n`` bytes, waiting for one).

        Raises ``aiohttp.ClientPayloadError`` when the connection broke before the end of
        the body, ``aiohttp.ServerTimeoutError`` after ``sock_read`` seconds of silence and
        ``TimeoutError`` when the ``total`` timeout expired."""
        if n < 0:
            self._reading_all = True
            while not self._eof:
                if self._error is not None:
                    raise self._error
                await self._wait()
            return self._take(len(self._body))
        while len(self._body) == self._pos and not self._eof:
            if self._error is not None:
                raise self._error
            await self._wait()
        return self._take(min(len(self._body), self._pos + n))

    async def readline(self) -> bytes:
        """The next line of the body, ``\\n`` included; at the end of the body the
        unterminated rest; b"" once everything was read."""
        while True:
            end = self._body.find(b"\n", self._pos)
            if end >= 0:
                return self._take(end + 1)
            if self._eof:
                return self._take(len(self._body))
            if self._error is not None:
                raise self._error
            await self._wait()

    async def read_lines(self) -> list[bytes]:
        """Every complete line available now (``\\n`` included), waiting for at least one;
        at the end of the body the unterminated rest as the last item; [] once everything
        was read. A watch handles all the events one network read brought in one go."""
        while True:
            end = self._body.rfind(b"\n", self._pos)
            if end >= 0:
                parts = self._take(end + 1).split(b"\n")
                parts.pop()  # empty: the chunk ends with a newline
                return [part + b"\n" for part in parts]
            if self._eof:
                tail = self._take(len(self._body))
                return [tail] if tail else []
            if self._error is not None:
                raise self._error
            await self._wait()

    # -- lifecycle -------------------------------------------------------------------------

    def release(self) -> None:
        """Done with the response. Its connection is back in the pool already if the body
        was complete; otherwise it is closed (an unread body cannot be skipped)."""
        self.close()

    def close(self) -> None:
        """Close the connection if the body is still arriving."""
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.discard(self)
            if not self._eof and self._error is None:
                self._error = aiohttp.ClientConnectionError("response closed")
        self._wake()


class _Connection(asyncio.Protocol):
    """One keep-alive connection: writes a request, parses the answer into its response."""

    def __init__(self, pool: HttpTransport) -> None:
        self.pool = pool
        self.loop = pool.loop
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self.last_io = 0.0
        self.paused = False
        self._buf = bytearray()
        self._exchange: _Exchange | None = None
        self._head_waiter: asyncio.Future[HttpResponse] | None = None
        self._response: HttpResponse | None = None
        self._watchdog: asyncio.TimerHandle | None = None
        self._watchdog_due = 0.0
        # Framing of the body being received: "head", "length", "chunk-size", "chunk-data",
        # "chunk-crlf", "trailer", "eof" (until the connection closes), "done".
        self._state = "done"
        self._remaining = 0
        self._keep_alive = True

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.last_io = self.loop.time()
        if self._exchange is None:
            # Nothing was asked: a server saying goodbye (408) or garbage. Not reusable.
            self.abort()
            return
        try:
            if self._state == "head":
                self._parse_head(data)
            else:
                self._parse_body(data)
        except HttpProtocolError as err:
            self._fail(err)
            self.abort()

    def eof_received(self) -> bool:
        return False  # close the transport: connection_lost ends the exchange

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool._forget(self)
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        if self._exchange is None:
            return
        if self._state == "eof" and self._response is not None:
            try:
                self._finish_body()
            except HttpProtocolError as err:
                self._fail(err)
            return
        error: BaseException
        if self._response is not None:
            error = aiohttp.ClientPayloadError("Response payload is not completed")
        elif exc is not None and isinstance(exc, OSError):
            error = aiohttp.ClientOSError(*exc.args)
        else:
            error = aiohttp.ServerDisconnectedError()
        self._fail(error)

    # -- one exchange ----------------------------------------------------------------------

    def send(self, data: bytes, exchange: _Exchange) -> asyncio.Future[HttpResponse]:
        """Write one request; the future resolves with the response once its head came."""
        assert self.transport is not None
        self._exchange = exchange
        self._state = "head"
        self._buf.clear()
        self._keep_alive = True
        waiter: asyncio.Future[HttpResponse] = self.loop.create_future()
        self._head_waiter = waiter
        now = self.loop.time()
        self.last_io = now
        if exchange.read_timeout is not None:
            self._arm_watchdog(now + exchange.read_timeout)
        self.transport.write(data)
        return waiter

    def _parse_head(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > _MAX_HEAD:
                    raise HttpProtocolError("response head too large")
                return
            head = bytes(buf[:end])
            del buf[: end + 4]
            if self._start_response(head.decode("latin-1")):
                break
            # An interim 1xx answer: the final one follows.
        rest = bytes(buf)
        buf.clear()
        self._parse_body(rest)

    def _start_response(self, head: str) -> bool:
        line_end = head.find("\r\n")
        status_line = head if line_end < 0 else head[:line_end]
        parts = status_line.split(" ", 2)
        if len(parts) < 2 or parts[0] not in ("HTTP/1.1", "HTTP/1.0") or not parts[1].isdigit():
            raise HttpProtocolError(f"bad status line {status_line[:80]!r}")
        status = int(parts[1])
        if 100 <= status < 200 and status != 101:
            return False
        response = HttpResponse(self, status, parts[2] if len(parts) > 2 else "")
        response._head = head
        # Only the framing headers are needed now; the rest is parsed if someone asks.
        lower = head.lower()
        if parts[0] == "HTTP/1.0":
            response.version = (1, 0)
            self._keep_alive = "keep-alive" in _tokens(_values(lower, "connection"))
        elif "close" in _tokens(_values(lower, "connection")):
            self._keep_alive = False
        lengths = _values(lower, "content-length")
        length: int | None = None
        if lengths:
            if any(not value.isdigit() for value in lengths) or len(set(lengths)) > 1:
                raise HttpProtocolError(f"bad Content-Length {lengths[0][:20]!r}")
            length = int(lengths[0])
        codings = _tokens(_values(lower, "transfer-encoding"))
        assert self._exchange is not None
        if self._exchange.method == "HEAD" or status in _NO_BODY_STATUS:
            self._state = "done"
        else:
            encodings = _tokens(_values(lower, "content-encoding"))
            encoding = encodings[-1] if encodings else ""
            if encoding in ("gzip", "x-gzip"):
                response._decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
            elif encoding == "deflate":
                response._decoder = zlib.decompressobj()
            elif encoding not in ("", "identity") or len(encodings) > 1:
                raise HttpProtocolError(f"unsupported Content-Encoding {', '.join(encodings)!r}")
            if status == 101:
                self._state = "eof"  # not HTTP any more: the rest is the body, till close
                self._keep_alive = False
            elif codings:
                if codings[-1] == "chunked":
                    self._state = "chunk-size"
                else:
                    self._state = "eof"
                    self._keep_alive = False
            elif length is not None:
                self._remaining = length
                self._state = "length" if length else "done"
            else:
                self._state = "eof"
                self._keep_alive = False
        self._response = response
        waiter, self._head_waiter = self._head_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(response)
        return True

    def _parse_body(self, data: bytes) -> None:
        response = self._response
        assert response is not None
        state = self._state
        if state == "length":
            n = len(data)
            if n < self._remaining:
                self._remaining -= n
                response._feed(data)
                return
            if n > self._remaining:
                raise HttpProtocolError("more body than its Content-Length")
            self._remaining = 0
            response._feed(data)
            self._finish_body()
        elif state == "done":
            if data:
                raise HttpProtocolError("data after the end of the response")
            self._finish_body()
        elif state == "eof":
            if data:
                response._feed(data)
        else:
            self._parse_chunked(data)

    def _parse_chunked(self, data: bytes) -> None:
        response = self._response
        assert response is not None
        buf = self._buf
        if buf:
            buf += data
            view = bytes(buf)
            buf.clear()
        else:
            view = data
        pos = 0
        size_end = len(view)
        while True:
            state = self._state
            if state == "chunk-data":
                available = size_end - pos
                if available <= 0:
                    return
                if available < self._remaining:
                    response._feed(view[pos:] if pos else view)
                    self._remaining -= available
                    return
                end = pos + self._remaining
                response._feed(view[pos:end])
                pos = end
                self._remaining = 0
                self._state = "chunk-crlf"
            elif state == "chunk-crlf":
                if size_end - pos < 2:
                    break
                if view[pos : pos + 2] != b"\r\n":
                    raise HttpProtocolError("a chunk not followed by CRLF")
                pos += 2
                self._state = "chunk-size"
            elif state == "chunk-size":
                end = view.find(b"\r\n", pos)
                if end < 0:
                    if size_end - pos > 4096:
                        raise HttpProtocolError("chunk size line too long")
                    break
                size_text = view[pos:end].split(b";", 1)[0].strip()
                if not size_text or size_text.lstrip(b"0123456789abcdefABCDEF"):
                    raise HttpProtocolError(f"bad chunk size {size_text[:20]!r}")
                size = int(size_text, 16)
                pos = end + 2
                if size:
                    self._remaining = size
                    self._state = "chunk-data"
                else:
                    self._state = "trailer"
            else:  # trailer: header lines, then an empty line
                end = view.find(b"\r\n", pos)
                if end < 0:
                    if size_end - pos > _MAX_HEAD:
                        raise HttpProtocolError("chunked trailer too large")
                    break
                empty = end == pos
                pos = end + 2
                if empty:
                    if pos != size_end:
                        raise HttpProtocolError("data after the end of the response")
                    self._finish_body()
                    return
        if pos < size_end:
            buf += view[pos:]

    def _finish_body(self) -> None:
        response, exchange = self._response, self._exchange
        assert response is not None
        assert exchange is not None
        self._state = "done"
        response._feed_eof()
        self._response = None
        self._exchange = None
        exchange.end()
        response._connection = None
        if self._keep_alive and not self.closed:
            if self.paused:
                self.paused = False
                if self.transport is not None:
                    self.transport.resume_reading()
            self.pool._put_idle(self)
        else:
            self.abort()

    def _fail(self, error: BaseException) -> None:
        """End the exchange with ``error``: the request's caller or the response's reader
        gets it."""
        waiter, self._head_waiter = self._head_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)
        response, self._response = self._response, None
        exchange, self._exchange = self._exchange, None
        if response is not None:
            response._feed_error(error)
            response._connection = None
            if exchange is not None:
                exchange.end()
        # Before a response, the request decides: retry on another connection or give up.
        self._state = "done"

    def discard(self, response: HttpResponse) -> None:
        """``response`` was closed before its body ended: the connection is no use."""
        if self._response is response:
            self._response = None
            exchange, self._exchange = self._exchange, None
            if exchange is not None:
                exchange.end()
        self.abort()

    def expire(self, exchange: _Exchange) -> None:
        """``exchange``'s total timeout passed."""
        if self._exchange is exchange:
            self._fail(TimeoutError())
            self.abort()

    # -- flow control and the read-idle timeout --------------------------------------------

    def pause(self) -> None:
        if not self.paused and self.transport is not None and not self.closed:
            self.paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.paused and self.transport is not None and not self.closed:
            self.paused = False
            self.last_io = self.loop.time()
            self.transport.resume_reading()

    def _arm_watchdog(self, due: float) -> None:
        if self._watchdog is not None:
            if self._watchdog_due <= due:
                return  # fires sooner; it re-arms itself for the rest
            self._watchdog.cancel()
        self._watchdog_due = due
        self._watchdog = self.loop.call_at(due, self._check_idle)

    def _check_idle(self) -> None:
        # One timer per connection, re-armed lazily when it fires: resetting a timer on
        # every read, as aiohttp does, costs more than parsing a small response.
        self._watchdog = None
        exchange = self._exchange
        if exchange is None or exchange.read_timeout is None or self.closed:
            return
        now = self.loop.time()
        if self.paused:  # the consumer is behind, not the server
            self._arm_watchdog(now + exchange.read_timeout)
            return
        due = self.last_io + exchange.read_timeout
        if now < due:
            self._arm_watchdog(due)
            return
        self._fail(aiohttp.ServerTimeoutError("Timeout on reading data from socket"))
        self.abort()

    def abort(self) -> None:
        """Close the connection at once."""
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.abort()
        self.pool._forget(self)


class HttpTransport:
    """A pool of keep-alive HTTP/1.1 connections to the API server that
    ``configuration.host`` names (``http`` or ``https``, with an optional path prefix).

    At most ``limit`` requests are in flight at once (kubernetes-asyncio's
    ``connection_pool_maxsize``; None or 0: unlimited), counted until each response's body
    ended or the response was released; idle connections are closed after
    ``keepalive_timeout`` seconds. Create it inside the event loop that uses it; close it
    with :meth:`close`.
    """

    def __init__(
        self,
        configuration: Configuration,
        *,
        limit: int | None = 100,
        keepalive_timeout: float = KEEPALIVE_TIMEOUT,
    ) -> None:
        parts = urlsplit(configuration.host or "")
        scheme = (parts.scheme or "").lower()
        if scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"unsupported API server URL {configuration.host!r}")
        self.loop = asyncio.get_running_loop()
        self.host = parts.hostname
        self.port = parts.port or (443 if scheme == "https" else 80)
        self.is_ssl = scheme == "https"
        self.ssl: ssl.SSLContext | None = ssl_context_for(configuration) if self.is_ssl else None
        self.server_hostname: str | None = None
        if self.is_ssl:
            self.server_hostname = getattr(configuration, "tls_server_name", None) or self.host
        host_header = f"[{self.host}]" if ":" in self.host else self.host
        if parts.port is not None:
            host_header += f":{parts.port}"
        self._head_tail = f" HTTP/1.1\r\nHost: {host_header}\r\n"
        self.base_path = parts.path.rstrip("/")
        self.limit = limit or None
        self.keepalive_timeout = keepalive_timeout
        # Slots: requests in flight, and futures of requests waiting for one (FIFO).
        self._in_flight = 0
        self._slot_waiters: deque[asyncio.Future[None]] = deque()
        self._idle: list[_Connection] = []
        self._all: set[_Connection] = set()
        self._sweeper: asyncio.TimerHandle | None = None
        self._closed = False

    def __repr__(self) -> str:
        scheme = "https" if self.is_ssl else "http"
        return f"HttpTransport({scheme}://{self.host}:{self.port})"

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    @property
    def connections(self) -> int:
        """Open connections, idle or busy."""
        return len(self._all)

    def encode_request(
        self, method: str, path: str, query: str, headers: Mapping[str, str], body: bytes | None
    ) -> bytes:
        """The bytes of one request: request line, Host, ``headers``, Content-Length, body.
        Raises ``ValueError`` for a header carrying a line break (no header injection)."""
        target = self.base_path + path
        if not _SAFE_TARGET.fullmatch(target):
            target = quote(target, safe="/:@!$&'()*+,;=-._~%")
        if query:
            target += "?" + query
        fields = [f"{name}: {value}\r\n" for name, value in headers.items()]
        block = "".join(fields)
        if block.count("\n") != len(fields) or block.count("\r") != len(fields):
            bad = next(n for n, v in headers.items() if "\n" in n + v or "\r" in n + v)
            raise ValueError(f"header {bad!r} contains a line break")
        head = [method, " ", target, self._head_tail, block]
        if not any(name.lower() == "accept-encoding" for name in headers):
            # Like aiohttp and Go's transport: the API server gzips large LIST answers.
            head.append("Accept-Encoding: gzip\r\n")
        if body is not None:
            head += ("Content-Length: ", str(len(body)), "\r\n\r\n")
        elif method in ("POST", "PUT", "PATCH"):
            head.append("Content-Length: 0\r\n\r\n")
        else:
            head.append("\r\n")
        data = "".join(head).encode("latin-1")
        return data + body if body else data

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: str = "",
        headers: Mapping[str, str],
        body: bytes | None = None,
        client_timeout: aiohttp.ClientTimeout | None = None,
    ) -> HttpResponse:
        """Send ``method`` ``path`` (``query`` already encoded) and return the response
        once its head arrived; the body follows in the background, for the caller to read
        and release.

        Errors are aiohttp's, as from a ``ClientSession``: ``ClientConnectorError`` (and its
        certificate/SSL subclasses) when the server cannot be reached,
        ``ServerDisconnectedError``/``ClientOSError`` when the connection broke (retried
        once for idempotent methods), ``ServerTimeoutError`` for ``sock_read``,
        ``sock_connect`` and ``connect``, ``TimeoutError`` for ``total``."""
        if self._closed:
            raise RuntimeError("HttpTransport is closed")
        timeout = client_timeout or aiohttp.ClientTimeout()
        data = self.encode_request(method, path, query, headers, body)
        loop = self.loop
        exchange = _Exchange(self, method, timeout.sock_read)
        deadline = loop.time() + timeout.total if timeout.total else None
        connect_deadline = loop.time() + timeout.connect if timeout.connect else None
        if deadline is not None and connect_deadline is not None:
            connect_deadline = min(deadline, connect_deadline)
        elif deadline is not None:
            connect_deadline = deadline
        connection: _Connection | None = None
        try:
            retried = False
            while True:
                if connect_deadline is None:
                    connection = await self._connect(exchange, timeout)
                else:
                    try:
                        async with asyncio.timeout_at(connect_deadline):
                            connection = await self._connect(exchange, timeout)
                    except TimeoutError:
                        raise aiohttp.ServerTimeoutError(
                            f"Connection timeout to host {self.host}:{self.port}"
                        ) from None
                if deadline is not None:
                    if exchange.total_handle is not None:
                        exchange.total_handle.cancel()
                    exchange.total_handle = loop.call_at(deadline, connection.expire, exchange)
                try:
                    return await connection.send(data, exchange)
                except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
                    connection.abort()
                    if retried or method not in _IDEMPOTENT:
                        raise
                    retried = True
        except BaseException:
            if connection is not None and connection._exchange is exchange:
                # Cancelled while waiting, or the answer came just as the caller gave up.
                response = connection._response
                connection._fail(aiohttp.ClientConnectionError("request abandoned"))
                if response is not None:
                    response.close()
                connection.abort()
            exchange.end()
            raise

    async def _connect(
        self, exchange: _Exchange, client_timeout: aiohttp.ClientTimeout
    ) -> _Connection:
        """A slot for ``exchange`` (kept across a retry), then a pooled or new connection."""
        if not exchange.slot_held:
            await self._acquire_slot()
            exchange.slot_held = True
        now = self.loop.time()
        while self._idle:
            connection = self._idle.pop()
            if connection.closed:
                continue
            if now - connection.idle_since > self.keepalive_timeout:
                connection.abort()
                continue
            return connection
        key = ConnectionKey(self.host, self.port, self.is_ssl, self.ssl or True, None, None, None)
        try:
            async with asyncio.timeout(client_timeout.sock_connect or None):
                _, protocol = await self.loop.create_connection(
                    lambda: _Connection(self),
                    self.host,
                    self.port,
                    ssl=self.ssl,
                    server_hostname=self.server_hostname,
                )
        except TimeoutError:
            raise aiohttp.ServerTimeoutError(
                f"Connection timeout to host {self.host}:{self.port}"
            ) from None
        except ssl.SSLCertVerificationError as err:
            raise aiohttp.ClientConnectorCertificateError(key, err) from err
        except ssl.SSLError as err:
            raise aiohttp.ClientConnectorSSLError(key, err) from err
        except OSError as err:
            raise aiohttp.ClientConnectorError(key, err) from err
        assert isinstance(protocol, _Connection)
        if self._closed:
            protocol.abort()
            raise RuntimeError("HttpTransport is closed")
        self._all.add(protocol)
        return protocol

    async def _acquire_slot(self) -> None:
        limit = self.limit
        if limit is None or (self._in_flight < limit and not self._slot_waiters):
            self._in_flight += 1
            return
        waiter: asyncio.Future[None] = self.loop.create_future()
        self._slot_waiters.append(waiter)
        try:
            await waiter  # resolved by _release_slot, which hands its slot over
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self._release_slot()  # handed a slot we will not use: pass it on
            else:
                with contextlib.suppress(ValueError):
                    self._slot_waiters.remove(waiter)
            raise

    def _release_slot(self) -> None:
        while self._slot_waiters:
            waiter = self._slot_waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot passes to the waiter as it is
                return
        self._in_flight -= 1

    def _put_idle(self, connection: _Connection) -> None:
        if self._closed:
            connection.abort()
            return
        connection.idle_since = self.loop.time()
        self._idle.append(connection)
        if self._sweeper is None:
            self._sweeper = self.loop.call_later(self.keepalive_timeout, self._sweep)

    def _sweep(self) -> None:
        self._sweeper = None
        now = self.loop.time()
        keep: list[_Connection] = []
        for connection in self._idle:
            if connection.closed:
                continue
            if now - connection.idle_since >= self.keepalive_timeout:
                connection.abort()
            else:
                keep.append(connection)
        self._idle = keep
        if keep:
            due = min(c.idle_since for c in keep) + self.keepalive_timeout
            self._sweeper = self.loop.call_at(due, self._sweep)

    def _forget(self, connection: _Connection) -> None:
        self._all.discard(connection)

    async def close(self) -> None:
        """Close every connection: requests and bodies in flight fail with
        ``aiohttp.ClientConnectionError``, further requests raise ``RuntimeError``."""
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        self._idle.clear()
        for connection in list(self._all):
            if connection._exchange is not None:
                connection._fail(aiohttp.ClientConnectionError("HTTP transport closed"))
            connection.abort()
        self._all.clear()
        # Let the transports' connection_lost callbacks run before the loop may close.
        await asyncio.sleep(0)

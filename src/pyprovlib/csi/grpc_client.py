"""A lean gRPC client for unary calls over cleartext HTTP/2 (h2c), for the CSI hot path.

Why it exists: every CSI call of a sidecar is one unary gRPC call on a local socket, and
grpclib spends ~300 CPU µs on each — h2's pure-Python state machine (event objects, header
validation, HPACK encoding with Huffman and indexing, per-frame bookkeeping) plus grpclib's
stream wrappers and event dispatch. :class:`GrpcClient` speaks just what a unary call needs,
directly on an :class:`asyncio.Protocol`: the request's header block is precomputed per method
(HPACK literals without indexing and plain static-table references: stateless and valid),
a request's HEADERS and DATA frames go out in one write, the control frames of one loop
iteration in one more, and the frames of the answers are parsed in place. Serialisation is
betterproto2's (``bytes(msg)``, ``Type.parse``).

It is still a complete HTTP/2 (RFC 9113) client for what it does: connection preface and
SETTINGS (push disabled, 4 MiB stream windows, a 16 MiB connection window), the server's
SETTINGS applied and acknowledged (INITIAL_WINDOW_SIZE adjusts open streams, MAX_FRAME_SIZE
splits DATA, MAX_CONCURRENT_STREAMS makes further calls wait), PING answered, GOAWAY honoured
(calls on streams the server did not process fail as retryable transport errors; no new stream
on that connection), RST_STREAM mapped to gRPC codes as grpc-go does, flow control both ways,
CONTINUATION frames and padding, PRIORITY and unknown frames ignored, a peer's protocol error
answered with GOAWAY and the connection closed. Responses are decoded with ``hpack.Decoder``
(every header block, in order, with a 64 KiB header-list limit like h2's). One connection is
used at a time, multiplexing the calls; it is (re)opened lazily by the next call after a loss,
and replaced once its stream ids run out.

The gRPC side: ``:method POST``, ``:scheme http``, ``:path``, ``:authority`` (as grpclib sends
it: ``host:port``, ``127.0.0.1:50051`` for a unix socket), ``te: trailers``, ``content-type:
application/grpc``, ``grpc-timeout`` when the call has a timeout, ``user-agent``; a
length-prefixed uncompressed request; normal and Trailers-Only responses; ``grpc-status`` and
the percent-decoded ``grpc-message``; a non-200 ``:status`` mapped per gRPC's "HTTP to gRPC
status code mapping". Failures raise what grpclib's channel raises, so callers map them the
same way: :class:`grpclib.exceptions.GRPCError` for a gRPC status, :class:`TimeoutError` when
the deadline passes (the stream is reset with CANCEL), :class:`OSError` when the socket cannot
be reached, :class:`ConnectionTerminatedError` (a
:class:`grpclib.exceptions.StreamTerminatedError`) when the connection ends under a call.

What it does not do: TLS, ALPN or HTTP/1.1 upgrade (CSI drivers listen on a local socket in
cleartext, prior knowledge, as grpclib's channel does for CSI); streaming calls (CSI's
SnapshotMetadata service streams: :class:`~pyprovlib.csi.connection.CSIConnection` keeps those
on grpclib); compression (nothing is sent compressed, no ``grpc-accept-encoding`` is offered, a
compressed answer fails); custom metadata, keepalive pings, retries or load balancing; server
push (disabled in SETTINGS). A received message larger than ``max_receive_message_length``
(default 4 MiB, grpc-go's default) fails with RESOURCE_EXHAUSTED.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ipaddress
import struct
from typing import Final, TypeVar, cast
from urllib.parse import unquote

import betterproto2
import grpclib.exceptions
import hpack
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from pyprovlib._logging import get_logger
from pyprovlib._version import __version__

__all__ = [
    "DEFAULT_MAX_RECEIVE_MESSAGE_LENGTH",
    "USER_AGENT",
    "ConnectionTerminatedError",
    "GrpcClient",
    "encode_grpc_timeout",
]

log = get_logger(__name__)

M = TypeVar("M", bound=betterproto2.Message)

DEFAULT_MAX_RECEIVE_MESSAGE_LENGTH: Final = 4 * 1024 * 1024
"""Largest response message accepted (grpc-go's default): a larger one is RESOURCE_EXHAUSTED."""

USER_AGENT: Final = f"grpc-python-pyprovlib/{__version__}"
"""The ``user-agent`` sent with every call (gRPC's ``grpc-<language>-<impl>/<version>`` form)."""

# -- HTTP/2 constants (RFC 9113) -------------------------------------------------------------------

_PREFACE: Final = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

_DATA: Final = 0x0
_HEADERS: Final = 0x1
_PRIORITY: Final = 0x2
_RST_STREAM: Final = 0x3
_SETTINGS: Final = 0x4
_PUSH_PROMISE: Final = 0x5
_PING: Final = 0x6
_GOAWAY: Final = 0x7
_WINDOW_UPDATE: Final = 0x8
_CONTINUATION: Final = 0x9

_END_STREAM: Final = 0x1
_ACK: Final = 0x1
_END_HEADERS: Final = 0x4
_PADDED: Final = 0x8
_PRIORITY_FLAG: Final = 0x20

_SETTINGS_HEADER_TABLE_SIZE: Final = 0x1
_SETTINGS_ENABLE_PUSH: Final = 0x2
_SETTINGS_MAX_CONCURRENT_STREAMS: Final = 0x3
_SETTINGS_INITIAL_WINDOW_SIZE: Final = 0x4
_SETTINGS_MAX_FRAME_SIZE: Final = 0x5
_SETTINGS_MAX_HEADER_LIST_SIZE: Final = 0x6

_NO_ERROR: Final = 0x0
_PROTOCOL_ERROR: Final = 0x1
_INTERNAL_ERROR: Final = 0x2
_FLOW_CONTROL_ERROR: Final = 0x3
_STREAM_CLOSED: Final = 0x5
_FRAME_SIZE_ERROR: Final = 0x6
_REFUSED_STREAM: Final = 0x7
_CANCEL: Final = 0x8
_COMPRESSION_ERROR: Final = 0x9
_ENHANCE_YOUR_CALM: Final = 0xB
_INADEQUATE_SECURITY: Final = 0xC

_ERROR_NAMES: Final = {
    0x0: "NO_ERROR",
    0x1: "PROTOCOL_ERROR",
    0x2: "INTERNAL_ERROR",
    0x3: "FLOW_CONTROL_ERROR",
    0x4: "SETTINGS_TIMEOUT",
    0x5: "STREAM_CLOSED",
    0x6: "FRAME_SIZE_ERROR",
    0x7: "REFUSED_STREAM",
    0x8: "CANCEL",
    0x9: "COMPRESSION_ERROR",
    0xA: "CONNECT_ERROR",
    0xB: "ENHANCE_YOUR_CALM",
    0xC: "INADEQUATE_SECURITY",
    0xD: "HTTP_1_1_REQUIRED",
}

# grpc-go's http2ErrConvTab: the gRPC code of a stream the server reset. Codes not listed
# (NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, ...) are INTERNAL.
_RST_TO_STATUS: Final = {
    _FLOW_CONTROL_ERROR: Status.RESOURCE_EXHAUSTED,
    _REFUSED_STREAM: Status.UNAVAILABLE,
    _CANCEL: Status.CANCELLED,
    _ENHANCE_YOUR_CALM: Status.RESOURCE_EXHAUSTED,
    _INADEQUATE_SECURITY: Status.PERMISSION_DENIED,
}

# gRPC's "HTTP to gRPC Status Code Mapping" (doc/http-grpc-status-mapping.md); other codes
# are UNKNOWN.
_HTTP_TO_STATUS: Final = {
    b"400": Status.INTERNAL,
    b"401": Status.UNAUTHENTICATED,
    b"403": Status.PERMISSION_DENIED,
    b"404": Status.UNIMPLEMENTED,
    b"429": Status.UNAVAILABLE,
    b"502": Status.UNAVAILABLE,
    b"503": Status.UNAVAILABLE,
    b"504": Status.UNAVAILABLE,
}

_DEFAULT_WINDOW: Final = 65_535
_MAX_WINDOW: Final = 2**31 - 1
_DEFAULT_MAX_FRAME: Final = 16_384
_MAX_FRAME_LIMIT: Final = 2**24 - 1
_MAX_STREAM_ID: Final = 2**31 - 1

_STREAM_WINDOW: Final = 4 * 1024 * 1024
"""SETTINGS_INITIAL_WINDOW_SIZE we advertise: a CSI answer arrives without a window stall."""
_CONNECTION_WINDOW: Final = 16 * 1024 * 1024
"""Our connection receive window (the initial 65,535 raised by a WINDOW_UPDATE)."""
_MAX_HEADER_LIST: Final = 65_536
"""SETTINGS_MAX_HEADER_LIST_SIZE we advertise and enforce (h2's default, so grpclib's)."""
_MAX_HEADER_BLOCK: Final = 2 * _MAX_HEADER_LIST
"""Compressed bytes of one header block (HEADERS + CONTINUATIONs) we buffer at most."""

_FRAME_HEADER: Final = struct.Struct(">BHBBI")
_U32: Final = struct.Struct(">I")
_U32_U32: Final = struct.Struct(">II")
_SETTING: Final = struct.Struct(">HI")
_MESSAGE_PREFIX: Final = struct.Struct(">BI")

# HPACK representations made only of these bytes are "indexed header fields" with a one-byte
# index (RFC 7541 6.1): decoding them reads the tables but never changes them.
_ONE_BYTE_INDEXED: Final = bytes(range(0x81, 0xFF))


def _frame(kind: int, flags: int, stream_id: int, payload: bytes | memoryview = b"") -> bytes:
    size = len(payload)
    return _FRAME_HEADER.pack(size >> 16, size & 0xFFFF, kind, flags, stream_id) + payload


# -- gRPC helpers ----------------------------------------------------------------------------------

_TIMEOUT_UNITS: Final = (
    ("n", 1),
    ("u", 1_000),
    ("m", 1_000_000),
    ("S", 1_000_000_000),
    ("M", 60_000_000_000),
    ("H", 3_600_000_000_000),
)


def encode_grpc_timeout(seconds: float) -> str:
    """The ``grpc-timeout`` value for ``seconds``: at most 8 digits in the finest unit that
    fits, rounded up (as grpc-go encodes it)."""
    nanos = max(0, int(seconds * 1e9))
    for unit, size in _TIMEOUT_UNITS:
        value = -(-nanos // size)
        if value < 100_000_000:
            return f"{value}{unit}"
    return "99999999H"


def _hpack_int(value: int, prefix_bits: int, flags: int) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((flags | value,))
    out = bytearray((flags | limit,))
    value -= limit
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _hpack_literal(name: str | int, value: str) -> bytes:
    """A literal header field without indexing, without Huffman coding (RFC 7541 6.2.2);
    ``name`` is a static-table index or the name itself."""
    if isinstance(name, int):
        head = _hpack_int(name, 4, 0x00)
    else:
        raw = name.encode("ascii")
        head = b"\x00" + _hpack_int(len(raw), 7, 0x00) + raw
    data = value.encode("ascii")
    return head + _hpack_int(len(data), 7, 0x00) + data


def _authority(host: str, port: int) -> str:
    try:
        ipaddress.IPv6Address(host)
    except ValueError:
        return f"{host}:{port}"
    return f"[{host}]:{port}"


class ConnectionTerminatedError(grpclib.exceptions.StreamTerminatedError):
    """The HTTP/2 connection ended before the call was answered: lost, closed by
    :meth:`GrpcClient.close`, refused by the server's GOAWAY (a stream it did not process, so
    safe to retry), or closed after a protocol error. A transport failure, like grpclib's
    ``StreamTerminatedError``."""


class _ConnectionError(Exception):
    """A connection error detected while reading frames (RFC 9113 5.4.1)."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code


class _Call:
    """One stream: a unary call from its HEADERS to its end."""

    __slots__ = (
        "data",
        "encoding",
        "future",
        "local_closed",
        "pending",
        "recv_unacked",
        "recv_window",
        "response_started",
        "send_window",
        "stream_id",
        "timer",
    )

    def __init__(self, stream_id: int, future: asyncio.Future[bytes], send_window: int) -> None:
        self.stream_id = stream_id
        self.future = future
        self.send_window = send_window
        self.recv_window = _STREAM_WINDOW
        self.recv_unacked = 0
        self.pending: bytes | memoryview = b""  # request DATA not yet sent (flow control)
        self.local_closed = False  # END_STREAM sent
        self.response_started = False  # the response's (non-1xx) HEADERS arrived
        self.encoding: bytes | None = None
        self.data: bytes | bytearray = b""
        self.timer: asyncio.TimerHandle | None = None


class _Connection(asyncio.Protocol):
    """One HTTP/2 connection: frames in and out, streams, windows, settings."""

    def __init__(self, client: GrpcClient) -> None:
        self.client = client
        self.loop = client.loop
        self.transport: asyncio.Transport | None = None
        self.ready: asyncio.Future[None] = self.loop.create_future()
        self.calls: dict[int, _Call] = {}
        self.closed = False
        self.going_away = False  # GOAWAY received or sent, or stream ids exhausted
        self.next_stream_id = 1
        self.max_streams = 2**32  # until the server's SETTINGS say otherwise
        self.peer_initial_window = _DEFAULT_WINDOW
        self.peer_max_frame = _DEFAULT_MAX_FRAME
        self.send_window = _DEFAULT_WINDOW
        self.recv_window = _CONNECTION_WINDOW
        self.recv_unacked = 0
        self.blocked: dict[int, _Call] = {}  # calls with DATA waiting for window, in order
        self.waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self.decoder = hpack.Decoder(max_header_list_size=_MAX_HEADER_LIST)
        # Decoded header blocks made only of one-byte indexed fields, valid until a block
        # that may change the dynamic table is decoded (see _decode).
        self.header_cache: dict[bytes, list[tuple[bytes, bytes]]] = {}
        self.buffer = b""
        self.header_block: list[bytes] | None = None  # HEADERS awaiting CONTINUATION
        self.header_stream = 0
        self.header_flags = 0
        self.header_size = 0
        self.out: list[bytes] = []
        self.settings_seen = False
        self.shut_down = False  # closed by GrpcClient.close(): waiting calls give up too

    # -- asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Send the preface, our SETTINGS and the connection window's raise."""
        # A socket connection's transport: a full asyncio.Transport.
        self.transport = transport = cast(asyncio.Transport, transport)
        settings = b"".join(
            _SETTING.pack(key, value)
            for key, value in (
                (_SETTINGS_ENABLE_PUSH, 0),
                (_SETTINGS_INITIAL_WINDOW_SIZE, _STREAM_WINDOW),
                (_SETTINGS_MAX_HEADER_LIST_SIZE, _MAX_HEADER_LIST),
            )
        )
        transport.write(
            _PREFACE
            + _frame(_SETTINGS, 0, 0, settings)
            + _frame(_WINDOW_UPDATE, 0, 0, _U32.pack(_CONNECTION_WINDOW - _DEFAULT_WINDOW))
        )

    def data_received(self, data: bytes) -> None:
        """Parse and handle every complete frame; keep a partial one for the next read."""
        if self.closed:
            return
        if self.buffer:
            data = self.buffer + data
        pos = 0
        end = len(data)
        try:
            while end - pos >= 9:
                high, low, kind, flags, stream_id = _FRAME_HEADER.unpack_from(data, pos)
                length = (high << 16) | low
                if length > _DEFAULT_MAX_FRAME:
                    # We never raise SETTINGS_MAX_FRAME_SIZE from its default.
                    raise _ConnectionError(_FRAME_SIZE_ERROR, f"a frame of {length} bytes")
                if end - pos - 9 < length:
                    break
                payload = data[pos + 9 : pos + 9 + length]
                pos += 9 + length
                self._frame_received(kind, flags, stream_id & 0x7FFFFFFF, payload)
                if self._ended():  # a GOAWAY or an error closed the connection
                    return
        except _ConnectionError as err:
            self._fail_connection(err.code, str(err))
            return
        except Exception as err:  # a server's bytes must never reach asyncio's handler
            self._fail_connection(_INTERNAL_ERROR, f"unreadable frames ({type(err).__name__})")
            return
        self.buffer = data[pos:] if pos < end else b""
        if self.out:
            self._flush()

    def _ended(self) -> bool:
        return self.closed

    def eof_received(self) -> bool:
        """The server closed its side: the connection is over (close ours too)."""
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        """Fail what is still open; the next call opens a new connection."""
        self.out.clear()
        reason = "connection lost" if exc is None else f"connection lost: {exc}"
        self._terminate(ConnectionTerminatedError(reason))

    # -- writing ---------------------------------------------------------------------------------

    def _write(self, data: bytes) -> None:
        # Frames written during one loop iteration (ACKs, WINDOW_UPDATEs, resets, DATA let
        # through by a window update) leave in one send.
        if not self.out:
            self.loop.call_soon(self._flush)
        self.out.append(data)

    def _flush(self) -> None:
        if self.out and self.transport is not None and not self.closed:
            out = self.out
            self.out = []
            self.transport.write(b"".join(out) if len(out) > 1 else out[0])

    # -- calls -----------------------------------------------------------------------------------

    @property
    def usable(self) -> bool:
        """New calls may be started here (perhaps after waiting for a free stream)."""
        return not self.closed and not self.going_away

    def has_capacity(self) -> bool:
        """Below the server's MAX_CONCURRENT_STREAMS."""
        return len(self.calls) < self.max_streams

    async def wait_capacity(self) -> None:
        """Until a stream ends (or the connection ends or goes away)."""
        waiter = self.loop.create_future()
        self.waiters.append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                # Woken for a free stream but leaving (deadline, cancellation): pass the turn
                # on, or the next waiter would sleep while the stream stays free.
                self._wake()
            else:
                waiter.cancel()
            with contextlib.suppress(ValueError):  # already taken by _wake
                self.waiters.remove(waiter)
            raise

    def _wake(self, count: int = 1) -> None:
        while count > 0 and self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                count -= 1

    def start(self, header_block: bytes, payload: bytes, deadline: float | None) -> _Call:
        """Open a stream and send the request: HEADERS, then DATA as far as windows allow."""
        stream_id = self.next_stream_id
        self.next_stream_id += 2
        if self.next_stream_id > self.client.max_stream_id:
            self.going_away = True  # ids exhausted: the next call opens a new connection
        call = _Call(stream_id, self.loop.create_future(), self.peer_initial_window)
        self.calls[stream_id] = call
        frames = self._header_frames(stream_id, header_block)
        message = _MESSAGE_PREFIX.pack(0, len(payload)) + payload
        size = len(message)
        if size <= call.send_window and size <= self.send_window and size <= self.peer_max_frame:
            call.send_window -= size
            self.send_window -= size
            call.local_closed = True
            frames.append(_frame(_DATA, _END_STREAM, stream_id, message))
        else:
            call.pending = memoryview(message)
        data = frames[0] if len(frames) == 1 else b"".join(frames)
        transport = self.transport
        if self.out or transport is None:
            self._write(data)  # behind frames already waiting: keep the order
        else:
            # Straight to the socket: a worker's next request usually follows the answer it
            # just read alone, and a deferred flush would cost a loop iteration per call.
            transport.write(data)
        if call.pending:
            self._pump(call)
        if deadline is not None:
            call.timer = self.loop.call_at(deadline, self._expire, call)
        return call

    def _header_frames(self, stream_id: int, block: bytes) -> list[bytes]:
        limit = self.peer_max_frame
        if len(block) <= limit:
            return [_frame(_HEADERS, _END_HEADERS, stream_id, block)]
        frames = [_frame(_HEADERS, 0, stream_id, block[:limit])]
        for start in range(limit, len(block), limit):
            last = start + limit >= len(block)
            flags = _END_HEADERS if last else 0
            frames.append(_frame(_CONTINUATION, flags, stream_id, block[start : start + limit]))
        return frames

    def _pump(self, call: _Call) -> None:
        """Send as much of ``call``'s pending DATA as the windows and frame size allow."""
        pending = call.pending
        while pending:
            size = min(len(pending), call.send_window, self.send_window, self.peer_max_frame)
            if size <= 0:
                self.blocked[call.stream_id] = call
                call.pending = pending
                return
            chunk, pending = pending[:size], pending[size:]
            call.send_window -= size
            self.send_window -= size
            last = not pending
            self._write(_frame(_DATA, _END_STREAM if last else 0, call.stream_id, chunk))
        call.pending = b""
        call.local_closed = True
        self.blocked.pop(call.stream_id, None)

    def _pump_blocked(self) -> None:
        for call in list(self.blocked.values()):
            if self.send_window <= 0:
                return
            if call.stream_id in self.calls:
                self._pump(call)
            else:
                self.blocked.pop(call.stream_id, None)

    def _expire(self, call: _Call) -> None:
        call.timer = None
        if not call.future.done():
            call.future.set_exception(TimeoutError("the gRPC call's deadline passed"))
        self.cancel(call)

    def cancel(self, call: _Call) -> None:
        """The caller gave up (deadline, cancellation): reset the stream if still open."""
        if self.calls.get(call.stream_id) is call:
            self._reset(call, _CANCEL)

    def _reset(self, call: _Call, code: int) -> None:
        if not self.closed:
            self._write(_frame(_RST_STREAM, 0, call.stream_id, _U32.pack(code)))
        self._finish(call)

    def _finish(self, call: _Call) -> None:
        """The stream is closed: free it, and its slot."""
        if self.calls.pop(call.stream_id, None) is None:
            return
        self.blocked.pop(call.stream_id, None)
        if call.timer is not None:
            call.timer.cancel()
            call.timer = None
        if self.waiters:
            self._wake()
        if self.going_away and not self.calls:
            self.close()

    def _fail_call(self, call: _Call, error: BaseException, rst: int | None) -> None:
        if not call.future.done():
            call.future.set_exception(error)
        if rst is not None:
            self._reset(call, rst)
        else:
            self._finish(call)

    # -- reading ---------------------------------------------------------------------------------

    def _frame_received(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self.header_block is not None and kind != _CONTINUATION:
            raise _ConnectionError(_PROTOCOL_ERROR, "a header block interrupted by another frame")
        if not self.settings_seen and kind != _SETTINGS:
            raise _ConnectionError(_PROTOCOL_ERROR, "the server preface is not a SETTINGS frame")
        if kind == _DATA:
            self._on_data(flags, stream_id, payload)
        elif kind == _HEADERS:
            self._on_headers(flags, stream_id, payload)
        elif kind == _CONTINUATION:
            self._on_continuation(flags, stream_id, payload)
        elif kind == _SETTINGS:
            self._on_settings(flags, stream_id, payload)
        elif kind == _WINDOW_UPDATE:
            self._on_window_update(stream_id, payload)
        elif kind == _RST_STREAM:
            self._on_rst_stream(stream_id, payload)
        elif kind == _PING:
            if stream_id:
                raise _ConnectionError(_PROTOCOL_ERROR, "PING on a stream")
            if len(payload) != 8:
                raise _ConnectionError(_FRAME_SIZE_ERROR, "PING payload not 8 bytes")
            if not flags & _ACK:
                self._write(_frame(_PING, _ACK, 0, payload))
        elif kind == _GOAWAY:
            self._on_goaway(stream_id, payload)
        elif kind == _PRIORITY:
            if not stream_id:
                raise _ConnectionError(_PROTOCOL_ERROR, "PRIORITY on stream 0")
            if len(payload) != 5:
                call = self.calls.get(stream_id)
                if call is not None:
                    error = GRPCError(Status.INTERNAL, "malformed PRIORITY frame")
                    self._fail_call(call, error, _FRAME_SIZE_ERROR)
        elif kind == _PUSH_PROMISE:
            raise _ConnectionError(_PROTOCOL_ERROR, "PUSH_PROMISE while push is disabled")
        # Unknown frame types are ignored (RFC 9113 4.1, 5.5).

    def _stream(self, stream_id: int, what: str) -> _Call | None:
        """The open call of ``stream_id``; None for a stream already closed (its frames are
        ignored); an error for stream 0, a stream we never opened or a server-initiated one."""
        call = self.calls.get(stream_id)
        if call is not None:
            return call
        if not stream_id:
            raise _ConnectionError(_PROTOCOL_ERROR, f"{what} on stream 0")
        if not stream_id & 1 or stream_id >= self.next_stream_id:
            raise _ConnectionError(_PROTOCOL_ERROR, f"{what} on idle stream {stream_id}")
        return None

    def _on_data(self, flags: int, stream_id: int, payload: bytes) -> None:
        size = len(payload)  # padding included: all of it counts against the windows
        call = self._stream(stream_id, "DATA")
        self.recv_window -= size
        if self.recv_window < 0:
            raise _ConnectionError(_FLOW_CONTROL_ERROR, "the connection window was overrun")
        self.recv_unacked += size
        if self.recv_unacked >= _CONNECTION_WINDOW // 2:
            self._write(_frame(_WINDOW_UPDATE, 0, 0, _U32.pack(self.recv_unacked)))
            self.recv_window += self.recv_unacked
            self.recv_unacked = 0
        body = payload
        if flags & _PADDED:
            if not size or payload[0] >= size:
                raise _ConnectionError(_PROTOCOL_ERROR, "DATA padding exceeds the frame")
            body = payload[1 : size - payload[0]]
        if call is None:
            return
        call.recv_window -= size
        if call.recv_window < 0:
            error = GRPCError(Status.INTERNAL, "the server overran the stream's flow window")
            self._fail_call(call, error, _FLOW_CONTROL_ERROR)
            return
        if not call.response_started:
            error = GRPCError(Status.INTERNAL, "DATA before the response headers")
            self._fail_call(call, error, _PROTOCOL_ERROR)
            return
        if body:
            data = call.data
            if not data:
                call.data = data = body
            elif isinstance(data, bytearray):
                data += body
            else:
                call.data = data = bytearray(data) + body
            if not self._check_message(call, data):
                return
        if flags & _END_STREAM:
            # A response without trailers (grpc-go: "server closed the stream without sending
            # trailers").
            error = GRPCError(Status.INTERNAL, "server closed the stream without sending trailers")
            self._fail_call(call, error, None if call.local_closed else _CANCEL)
            return
        call.recv_unacked += size
        if call.recv_unacked >= _STREAM_WINDOW // 2:
            self._write(_frame(_WINDOW_UPDATE, 0, stream_id, _U32.pack(call.recv_unacked)))
            call.recv_window += call.recv_unacked
            call.recv_unacked = 0

    def _check_message(self, call: _Call, data: bytes | bytearray) -> bool:
        """Check the length-prefixed message received so far; False if the call failed."""
        if len(data) < 5:
            return True
        flag, length = _MESSAGE_PREFIX.unpack_from(data)
        error: GRPCError | None = None
        if flag == 1:
            if call.encoding is None or call.encoding == b"identity":
                error = GRPCError(
                    Status.INTERNAL, "grpc: compressed flag set with identity or empty encoding"
                )
            else:
                encoding = call.encoding.decode("ascii", "replace")
                error = GRPCError(
                    Status.UNIMPLEMENTED,
                    f"grpc: Decompressor is not installed for grpc-encoding {encoding!r}",
                )
        elif flag != 0:
            error = GRPCError(Status.INTERNAL, f"grpc: invalid compressed flag {flag}")
        elif length > self.client.max_receive_message_length:
            error = GRPCError(
                Status.RESOURCE_EXHAUSTED,
                f"grpc: received message larger than max ({length} vs. "
                f"{self.client.max_receive_message_length})",
            )
        elif len(data) > 5 + length:
            error = GRPCError(
                Status.INTERNAL,
                "cardinality violation: expected <EOF> for non server-streaming RPCs, but "
                "received another message",
            )
        if error is None:
            return True
        self._fail_call(call, error, _CANCEL)
        return False

    def _on_headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        if not stream_id:
            raise _ConnectionError(_PROTOCOL_ERROR, "HEADERS on stream 0")
        start = 0
        end = len(payload)
        if flags & _PADDED:
            if not end:
                raise _ConnectionError(_PROTOCOL_ERROR, "HEADERS padding exceeds the frame")
            end -= payload[0]
            start = 1
        if flags & _PRIORITY_FLAG:
            start += 5
        if start > end:
            raise _ConnectionError(_PROTOCOL_ERROR, "HEADERS padding exceeds the frame")
        fragment = payload[start:end] if start or end != len(payload) else payload
        if flags & _END_HEADERS:
            self._header_block_received(stream_id, flags, fragment)
            return
        self.header_block = [fragment]
        self.header_stream = stream_id
        self.header_flags = flags
        self.header_size = len(fragment)

    def _on_continuation(self, flags: int, stream_id: int, payload: bytes) -> None:
        if self.header_block is None or stream_id != self.header_stream:
            raise _ConnectionError(_PROTOCOL_ERROR, "CONTINUATION without a header block")
        self.header_size += len(payload)
        if self.header_size > _MAX_HEADER_BLOCK:
            raise _ConnectionError(_ENHANCE_YOUR_CALM, "a header block over the size limit")
        self.header_block.append(payload)
        if flags & _END_HEADERS:
            block = b"".join(self.header_block)
            self.header_block = None
            self._header_block_received(stream_id, self.header_flags, block)

    def _decode(self, block: bytes) -> list[tuple[bytes, bytes]]:
        """Decode a header block with the connection's HPACK state (every block, in order)."""
        cached = self.header_cache.get(block)
        if cached is not None:
            return cached
        try:
            headers = [(bytes(n), bytes(v)) for n, v in self.decoder.decode(block, raw=True)]
        except hpack.HPACKError as err:
            raise _ConnectionError(_COMPRESSION_ERROR, f"HPACK: {err}") from None
        if block and not block.translate(None, _ONE_BYTE_INDEXED):
            if len(self.header_cache) >= 64:
                self.header_cache.clear()  # bounded, whatever a server sends
            self.header_cache[block] = headers
        else:
            # The dynamic table may have changed: earlier decodings may no longer hold.
            self.header_cache.clear()
        return headers

    def _header_block_received(self, stream_id: int, flags: int, block: bytes) -> None:
        headers = self._decode(block)
        call = self._stream(stream_id, "HEADERS")
        if call is None:
            return
        end_stream = bool(flags & _END_STREAM)
        if not call.response_started:
            self._response_headers(call, headers, end_stream)
        elif not end_stream:
            error = GRPCError(Status.INTERNAL, "trailers without END_STREAM")
            self._fail_call(call, error, _PROTOCOL_ERROR)
        else:
            self._trailers(call, headers)

    def _response_headers(
        self, call: _Call, headers: list[tuple[bytes, bytes]], end_stream: bool
    ) -> None:
        status = content_type = None
        for name, value in headers:
            if name == b":status":
                status = value
            elif name == b"content-type":
                content_type = value
            elif name == b"grpc-encoding":
                call.encoding = value
        if status is None:
            error = GRPCError(Status.INTERNAL, "malformed header: missing HTTP status")
            self._fail_call(call, error, _PROTOCOL_ERROR)
            return
        if status[:1] == b"1" and len(status) == 3 and not end_stream:
            return  # an informational response: the real one follows
        if status != b"200":
            code = _HTTP_TO_STATUS.get(status, Status.UNKNOWN)
            text = status.decode("ascii", "replace")
            error = GRPCError(code, f"unexpected HTTP status code received from server: {text}")
            self._fail_call(call, error, None if end_stream and call.local_closed else _CANCEL)
            return
        if (
            content_type is None
            or not content_type.startswith(b"application/grpc")
            or content_type[16:17] not in (b"", b"+", b";")
        ):
            shown = "none" if content_type is None else content_type.decode("ascii", "replace")
            error = GRPCError(Status.UNKNOWN, f"unexpected content-type {shown!r}")
            self._fail_call(call, error, None if end_stream and call.local_closed else _CANCEL)
            return
        call.response_started = True
        if end_stream:
            # Trailers-Only (without grpc-status: UNKNOWN, as grpc-go reads it).
            self._trailers(call, headers)

    def _trailers(self, call: _Call, headers: list[tuple[bytes, bytes]]) -> None:
        raw_status = message = None
        for name, value in headers:
            if name == b"grpc-status":
                raw_status = value
            elif name == b"grpc-message":
                message = value
        rst = None if call.local_closed else _CANCEL
        error: GRPCError | None = None
        if raw_status is None:
            error = GRPCError(Status.UNKNOWN, "missing grpc-status in the trailers")
        elif raw_status != b"0":
            try:
                code = Status(int(raw_status))
            except ValueError:
                code = Status.UNKNOWN
            text = unquote(message.decode("utf-8", "replace")) if message is not None else None
            error = GRPCError(code, text)
        else:
            data = call.data
            if len(data) < 5:
                error = GRPCError(
                    Status.INTERNAL, "cardinality violation: received no response message"
                )
            elif len(data) != 5 + _MESSAGE_PREFIX.unpack_from(data)[1]:
                error = GRPCError(Status.INTERNAL, "grpc: the response message was truncated")
        if error is not None:
            self._fail_call(call, error, rst)
            return
        if not call.future.done():
            call.future.set_result(bytes(call.data[5:]))
        if rst is not None:
            self._reset(call, rst)  # answered before we finished sending: stop sending
        else:
            self._finish(call)

    def _on_settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id:
            raise _ConnectionError(_PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & _ACK:
            if payload:
                raise _ConnectionError(_FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            return
        if len(payload) % 6:
            raise _ConnectionError(_FRAME_SIZE_ERROR, "SETTINGS length not a multiple of 6")
        for offset in range(0, len(payload), 6):
            key, value = _SETTING.unpack_from(payload, offset)
            if key == _SETTINGS_INITIAL_WINDOW_SIZE:
                if value > _MAX_WINDOW:
                    raise _ConnectionError(_FLOW_CONTROL_ERROR, "INITIAL_WINDOW_SIZE too large")
                delta = value - self.peer_initial_window
                self.peer_initial_window = value
                for call in self.calls.values():
                    call.send_window += delta
                    if call.send_window > _MAX_WINDOW:
                        raise _ConnectionError(_FLOW_CONTROL_ERROR, "a stream window overflowed")
            elif key == _SETTINGS_MAX_FRAME_SIZE:
                if not _DEFAULT_MAX_FRAME <= value <= _MAX_FRAME_LIMIT:
                    raise _ConnectionError(_PROTOCOL_ERROR, f"MAX_FRAME_SIZE {value}")
                self.peer_max_frame = value
            elif key == _SETTINGS_MAX_CONCURRENT_STREAMS:
                raised = value > self.max_streams
                self.max_streams = value
                if raised:
                    self._wake(len(self.waiters))
            elif key == _SETTINGS_ENABLE_PUSH and value > 1:
                raise _ConnectionError(_PROTOCOL_ERROR, f"ENABLE_PUSH {value}")
            # HEADER_TABLE_SIZE: our requests never use the dynamic table. MAX_HEADER_LIST_SIZE:
            # our header lists are a few hundred bytes. Unknown settings are ignored.
        self._write(_frame(_SETTINGS, _ACK, 0))
        if not self.settings_seen:
            self.settings_seen = True
            if not self.ready.done():
                self.ready.set_result(None)
        self._pump_blocked()

    def _on_window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise _ConnectionError(_FRAME_SIZE_ERROR, "WINDOW_UPDATE payload not 4 bytes")
        increment = _U32.unpack(payload)[0] & 0x7FFFFFFF
        if not stream_id:
            if not increment:
                raise _ConnectionError(_PROTOCOL_ERROR, "a connection WINDOW_UPDATE of 0")
            self.send_window += increment
            if self.send_window > _MAX_WINDOW:
                raise _ConnectionError(_FLOW_CONTROL_ERROR, "the connection window overflowed")
            self._pump_blocked()
            return
        call = self._stream(stream_id, "WINDOW_UPDATE")
        if call is None:
            return
        if not increment:
            self._fail_call(call, GRPCError(Status.INTERNAL, "WINDOW_UPDATE of 0"), _PROTOCOL_ERROR)
            return
        call.send_window += increment
        if call.send_window > _MAX_WINDOW:
            error = GRPCError(Status.INTERNAL, "the stream's send window overflowed")
            self._fail_call(call, error, _FLOW_CONTROL_ERROR)
            return
        if call.pending:
            self._pump(call)

    def _on_rst_stream(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise _ConnectionError(_FRAME_SIZE_ERROR, "RST_STREAM payload not 4 bytes")
        call = self._stream(stream_id, "RST_STREAM")
        if call is None:
            return
        code = _U32.unpack(payload)[0]
        name = _ERROR_NAMES.get(code, f"0x{code:x}")
        error = GRPCError(
            _RST_TO_STATUS.get(code, Status.INTERNAL),
            f"stream terminated by RST_STREAM with error code: {name}",
        )
        self._fail_call(call, error, None)

    def _on_goaway(self, stream_id: int, payload: bytes) -> None:
        if stream_id:
            raise _ConnectionError(_PROTOCOL_ERROR, "GOAWAY on a stream")
        if len(payload) < 8:
            raise _ConnectionError(_FRAME_SIZE_ERROR, "GOAWAY shorter than 8 bytes")
        last_stream, code = _U32_U32.unpack_from(payload)
        last_stream &= 0x7FFFFFFF
        self.going_away = True
        name = _ERROR_NAMES.get(code, f"0x{code:x}")
        for call in [c for c in self.calls.values() if c.stream_id > last_stream]:
            # Never processed by the server: safe to retry on a new connection.
            error = ConnectionTerminatedError(
                f"the server sent GOAWAY ({name}) before processing this call"
            )
            self._fail_call(call, error, None)
        self._wake(len(self.waiters))
        if not self.calls:
            self.close()

    # -- ending ----------------------------------------------------------------------------------

    def _fail_connection(self, code: int, reason: str) -> None:
        """A connection error (RFC 9113 5.4.1): GOAWAY with ``code``, close, fail the calls."""
        if self.closed:
            return
        self.out.clear()
        name = _ERROR_NAMES.get(code, hex(code))
        # Once per connection; the reason names frames and sizes, never header values.
        log.warning(
            "closing a gRPC connection after an HTTP/2 protocol error",
            target=repr(self.client),
            error=name,
            reason=reason,
        )
        if self.transport is not None:
            self.transport.write(_frame(_GOAWAY, 0, 0, _U32_U32.pack(0, code)))
        self._terminate(ConnectionTerminatedError(f"HTTP/2 {name} from the server: {reason}"))

    def close(self) -> None:
        """Send GOAWAY, close the socket and fail the calls still open."""
        if self.closed:
            return
        if self.transport is not None:
            self._flush()
            self.transport.write(_frame(_GOAWAY, 0, 0, _U32_U32.pack(0, _NO_ERROR)))
        self._terminate(ConnectionTerminatedError("the gRPC channel was closed"))

    def _terminate(self, error: Exception) -> None:
        if not self.closed:
            self.closed = True
            self.client.connection_ended(self)
            if self.transport is not None:
                self.transport.close()
        if not self.ready.done():
            self.ready.set_exception(error)
            self.ready.exception()  # retrieved: nobody may be waiting on it
        calls = list(self.calls.values())
        self.calls.clear()
        self.blocked.clear()
        for call in calls:
            if call.timer is not None:
                call.timer.cancel()
            if not call.future.done():
                call.future.set_exception(error)
        self._wake(len(self.waiters))


class GrpcClient:
    """Unary gRPC calls over one multiplexed h2c connection to a unix socket or host:port.

    ``await client.unary("/pkg.Service/Method", request, ResponseType, timeout=10)`` returns
    the decoded response. The connection is opened by the first call and reopened by the
    next call after a loss; :meth:`close` closes it (a later call opens a new one). Create
    the client in the event loop that makes the calls: it belongs to that loop.
    """

    max_stream_id: int = _MAX_STREAM_ID
    """The last stream id used on a connection before calls move to a new one."""

    def __init__(
        self,
        *,
        path: str | None = None,
        host: str | None = None,
        port: int | None = None,
        max_receive_message_length: int = DEFAULT_MAX_RECEIVE_MESSAGE_LENGTH,
        user_agent: str = USER_AGENT,
    ) -> None:
        if path is not None and (host is not None or port is not None):
            raise ValueError("give a unix socket path or a host and port, not both")
        if max_receive_message_length <= 0:
            raise ValueError("max_receive_message_length must be positive")
        self.path = path
        self.host = "127.0.0.1" if host is None else host
        self.port = 50051 if port is None else port
        self.max_receive_message_length = max_receive_message_length
        self.loop = asyncio.get_running_loop()
        self._fixed_headers = (
            _hpack_literal(1, _authority(self.host, self.port))  # :authority
            + _hpack_literal("te", "trailers")
            + _hpack_literal(31, "application/grpc")  # content-type
            + _hpack_literal(58, user_agent)  # user-agent
        )
        self._blocks: dict[str, bytes] = {}
        self._timeouts: dict[float, bytes] = {}
        self._conn: _Connection | None = None
        self._connections: set[_Connection] = set()
        self._connect_lock = asyncio.Lock()

    def __repr__(self) -> str:
        where = self.path if self.path is not None else f"{self.host}:{self.port}"
        return f"GrpcClient({where!r})"

    @property
    def connected(self) -> bool:
        """A connection is open (it may still be going away)."""
        return bool(self._connections)

    def _header_block(self, method: str) -> bytes:
        block = self._blocks.get(method)
        if block is None:
            # :method POST and :scheme http are static-table entries 3 and 6; :path (4) is a
            # literal with an indexed name.
            block = self._blocks[method] = (
                b"\x83\x86" + _hpack_literal(4, method) + self._fixed_headers
            )
        return block

    async def unary(
        self,
        method: str,
        request: betterproto2.Message,
        response_type: type[M],
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - grpclib's stubs take it too
    ) -> M:
        """Call ``method`` (``/package.Service/Method``) with ``request``; the response.

        Raises GRPCError for a non-OK status, TimeoutError once ``timeout`` seconds have
        passed, OSError when the server cannot be reached and ConnectionTerminatedError when
        the connection ends before the answer.
        """
        payload = bytes(request)
        loop = self.loop
        deadline = None if timeout is None else loop.time() + timeout
        conn = self._conn
        block = self._header_block(method)
        if conn is None or not conn.usable or conn.waiters or not conn.has_capacity():
            conn = await self._acquire(deadline)
            if deadline is not None:
                block += _hpack_literal("grpc-timeout", encode_grpc_timeout(deadline - loop.time()))
        elif timeout is not None:
            # Calls mostly share a timeout: its header field is encoded once.
            field = self._timeouts.get(timeout)
            if field is None:
                if len(self._timeouts) >= 64:
                    self._timeouts.clear()
                field = _hpack_literal("grpc-timeout", encode_grpc_timeout(timeout))
                self._timeouts[timeout] = field
            block += field
        call = conn.start(block, payload, deadline)
        try:
            data = await call.future
        except asyncio.CancelledError:
            conn.cancel(call)
            raise
        try:
            return response_type.parse(data)
        except Exception as err:
            raise GRPCError(
                Status.INTERNAL,
                f"grpc: failed to unmarshal the received message: {type(err).__name__}",
            ) from None

    async def _acquire(self, deadline: float | None) -> _Connection:
        """A connection with a free stream: connect, or wait for a stream to end."""
        async with asyncio.timeout_at(deadline):
            woken = False
            while True:
                conn = self._conn
                if conn is None or not conn.usable:
                    conn = await self._connect()
                    woken = False
                if conn.has_capacity() and (woken or not conn.waiters):
                    return conn
                await conn.wait_capacity()
                if conn.shut_down:
                    raise ConnectionTerminatedError("the gRPC channel was closed")
                woken = True

    async def _connect(self) -> _Connection:
        async with self._connect_lock:
            conn = self._conn
            if conn is not None and conn.usable:
                return conn
            protocol = _Connection(self)
            if self.path is not None:
                await self.loop.create_unix_connection(lambda: protocol, self.path)
            else:
                await self.loop.create_connection(lambda: protocol, self.host, self.port)
            self._connections.add(protocol)
            try:
                # The server's SETTINGS first (as grpc-go waits for the server preface): its
                # MAX_CONCURRENT_STREAMS must be known before streams are opened.
                await protocol.ready
            except BaseException:
                protocol.close()
                raise
            self._conn = protocol
            return protocol

    def connection_ended(self, conn: _Connection) -> None:
        """Called by a connection once closed."""
        self._connections.discard(conn)
        if self._conn is conn:
            self._conn = None

    def close(self) -> None:
        """Close every connection; calls still running or waiting for a stream fail with
        ConnectionTerminatedError."""
        for conn in list(self._connections):
            conn.shut_down = True
            conn.close()
        self._connections.clear()
        self._conn = None

"""A kit for serving CSI (Identity, Controller, Node) from Python on a unix socket with grpclib.

Subclass :class:`ControllerService` / :class:`NodeService` and override the RPCs the driver
implements (the rest answer UNIMPLEMENTED); declare capabilities once, in the constructors;
hand the services to :class:`CSIServer`. Every call is logged with its secrets stripped; a
:class:`CSIError` raised by a handler becomes that gRPC status, any other exception becomes
INTERNAL with the traceback logged, and the server keeps serving.

Requests are checked before a handler sees them, with grpc-go's answers: a message larger than
``max_receive_message_length`` is RESOURCE_EXHAUSTED (before it is buffered), a compressed one
UNIMPLEMENTED or INTERNAL, a truncated, missing or malformed one (bad protobuf wire format,
a field of the wrong wire type, a string that is not UTF-8) INTERNAL, a method not served
UNIMPLEMENTED. Bytes that are not HTTP/2, a frame over the HTTP/2 size limit, a header that
is not ASCII or a request without ``:method``/``:path`` cost the client its connection or
stream, never the server.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import struct
import time
import traceback
from collections.abc import AsyncIterable, Awaitable, Callable, Iterable
from types import TracebackType
from typing import Any, Final

import betterproto2
import grpclib.const
import grpclib.server
from betterproto2.casing import snake_case
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.protocol import H2Protocol
from grpclib.protocol import Stream as H2Stream
from h2.errors import ErrorCodes

from pyprovlib._logging import get_logger
from pyprovlib.csi._proto.csi import v1
from pyprovlib.csi.redact import Sanitized, scrub_secret_values

__all__ = [
    "DEFAULT_MAX_RECEIVE_MESSAGE_LENGTH",
    "CSIError",
    "CSIServer",
    "ControllerService",
    "IdentityService",
    "NodeService",
    "unix_socket_path",
]

log = get_logger(__name__)

DEFAULT_MAX_RECEIVE_MESSAGE_LENGTH: Final = 4 * 1024 * 1024
"""grpc-go's default limit on the size of a received message (4 MiB)."""


class CSIError(Exception):
    """Raised by a service method to answer with a deliberate gRPC status.

    The message goes to the caller as the status message: never put secrets in it.
    """

    def __init__(self, status: Status, message: str) -> None:
        super().__init__(f"{status.name}: {message}")
        self.status = status
        self.message = message


class IdentityService(v1.IdentityBase):
    """The Identity service: plugin name, version, plugin capabilities and readiness.

    Override :meth:`is_ready` for a driver that needs warming up before it serves.
    """

    def __init__(
        self,
        name: str,
        vendor_version: str,
        *,
        services: Iterable[v1.PluginCapabilityServiceType] = (),
        volume_expansion: v1.PluginCapabilityVolumeExpansionType | None = None,
        manifest: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.vendor_version = vendor_version
        self.services = frozenset(services)
        self.volume_expansion = volume_expansion
        self.manifest = dict(manifest or {})

    async def is_ready(self) -> bool:
        """Readiness reported by Probe; True unless overridden."""
        return True

    async def get_plugin_info(self, message: v1.GetPluginInfoRequest) -> v1.GetPluginInfoResponse:
        """The driver's name and version."""
        return v1.GetPluginInfoResponse(
            name=self.name, vendor_version=self.vendor_version, manifest=self.manifest
        )

    async def get_plugin_capabilities(
        self, message: v1.GetPluginCapabilitiesRequest
    ) -> v1.GetPluginCapabilitiesResponse:
        """The plugin capabilities declared in the constructor."""
        caps = [
            v1.PluginCapability(service=v1.PluginCapabilityService(type=t))
            for t in sorted(self.services, key=lambda t: t.value)
        ]
        if self.volume_expansion is not None:
            caps.append(
                v1.PluginCapability(
                    volume_expansion=v1.PluginCapabilityVolumeExpansion(type=self.volume_expansion)
                )
            )
        return v1.GetPluginCapabilitiesResponse(capabilities=caps)

    async def probe(self, message: v1.ProbeRequest) -> v1.ProbeResponse:
        """Readiness, from :meth:`is_ready`."""
        return v1.ProbeResponse(ready=await self.is_ready())


class ControllerService(v1.ControllerBase):
    """Base for a driver's Controller service; RPCs not overridden answer UNIMPLEMENTED."""

    def __init__(self, capabilities: Iterable[v1.ControllerServiceCapabilityRpcType] = ()) -> None:
        self.capabilities = frozenset(capabilities)

    async def controller_get_capabilities(
        self, message: v1.ControllerGetCapabilitiesRequest
    ) -> v1.ControllerGetCapabilitiesResponse:
        """The controller capabilities declared in the constructor."""
        return v1.ControllerGetCapabilitiesResponse(
            capabilities=[
                v1.ControllerServiceCapability(rpc=v1.ControllerServiceCapabilityRpc(type=t))
                for t in sorted(self.capabilities, key=lambda t: t.value)
            ]
        )


class NodeService(v1.NodeBase):
    """Base for a driver's Node service; RPCs not overridden answer UNIMPLEMENTED."""

    def __init__(
        self,
        node_id: str,
        capabilities: Iterable[v1.NodeServiceCapabilityRpcType] = (),
        *,
        max_volumes_per_node: int = 0,
        accessible_topology: dict[str, str] | None = None,
    ) -> None:
        self.node_id = node_id
        self.capabilities = frozenset(capabilities)
        self.max_volumes_per_node = max_volumes_per_node
        self.accessible_topology = dict(accessible_topology or {})

    async def node_get_capabilities(
        self, message: v1.NodeGetCapabilitiesRequest
    ) -> v1.NodeGetCapabilitiesResponse:
        """The node capabilities declared in the constructor."""
        return v1.NodeGetCapabilitiesResponse(
            capabilities=[
                v1.NodeServiceCapability(rpc=v1.NodeServiceCapabilityRpc(type=t))
                for t in sorted(self.capabilities, key=lambda t: t.value)
            ]
        )

    async def node_get_info(self, message: v1.NodeGetInfoRequest) -> v1.NodeGetInfoResponse:
        """Node id, volume limit and topology declared in the constructor."""
        return v1.NodeGetInfoResponse(
            node_id=self.node_id,
            max_volumes_per_node=self.max_volumes_per_node,
            accessible_topology=(
                v1.Topology(segments=self.accessible_topology) if self.accessible_topology else None
            ),
        )


def unix_socket_path(endpoint: str) -> pathlib.Path:
    """The filesystem path of a ``unix:///path``, ``unix:/path`` or bare ``/path`` endpoint."""
    if endpoint.startswith("unix://"):
        path = endpoint.removeprefix("unix://")
    elif endpoint.startswith("unix:"):
        path = endpoint.removeprefix("unix:")
    else:
        path = endpoint
    if not path.startswith("/"):
        raise ValueError(f"{endpoint!r} is not a unix socket endpoint (unix:///absolute/path)")
    return pathlib.Path(path)


_Stream = grpclib.server.Stream[Any, Any]


class _Mapped:
    """Wraps a generated service's handlers with request checks, logging and exception
    mapping."""

    def __init__(self, service: betterproto2.grpclib.ServiceBase, max_message: int) -> None:
        self.service = service
        self.max_message = max_message

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        # Generated services define __mapping__; betterproto2's ServiceBase does not declare it.
        mapping: dict[str, grpclib.const.Handler] = getattr(self.service, "__mapping__")()  # noqa: B009
        wrapped: dict[str, grpclib.const.Handler] = {}
        for path, handler in mapping.items():
            cardinality = handler.cardinality
            method = getattr(self.service, snake_case(path.rsplit("/", 1)[1]))
            if cardinality is grpclib.const.Cardinality.UNARY_UNARY:
                func = _unary(path, method, handler.request_type, self.max_message)
            elif cardinality is grpclib.const.Cardinality.UNARY_STREAM:
                func = _server_stream(path, method, handler.request_type, self.max_message)
            else:  # client streaming: no CSI RPC is; grpclib reads the messages
                func = _guarded(path, handler.func)
            wrapped[path] = grpclib.const.Handler(
                func, cardinality, handler.request_type, handler.reply_type
            )
        return wrapped


def _to_grpc_error(
    path: str, exc: Exception, request: betterproto2.Message | None = None
) -> GRPCError:
    if isinstance(exc, CSIError):
        return GRPCError(exc.status, scrub_secret_values(exc.message, request))
    if isinstance(exc, GRPCError):
        return GRPCError(exc.status, scrub_secret_values(exc.message or "", request), exc.details)
    # str(exc) of an unexpected error may quote the request's secrets: the reply names only the
    # type, and the logged traceback has the request's secret values scrubbed out.
    text = "".join(traceback.format_exception(exc))
    log.error(
        "csi handler failed",
        method=path,
        error_type=type(exc).__name__,
        traceback=scrub_secret_values(text, request),
    )
    return GRPCError(Status.INTERNAL, f"internal error in {path}: {type(exc).__name__}")


# -- reading a request ---------------------------------------------------------------------------


class _MalformedError(Exception):
    """The request's bytes are not a valid encoding of its message type. The text names
    fields and offsets, never values (the bytes may hold secrets)."""


# The wire type each protobuf field type is encoded with (packed repeated scalars aside).
_WIRE_VARINT: Final = 0
_WIRE_I64: Final = 1
_WIRE_LEN: Final = 2
_WIRE_GROUP_START: Final = 3
_WIRE_GROUP_END: Final = 4
_WIRE_I32: Final = 5
_WIRE_OF: Final[dict[str, int]] = {
    **dict.fromkeys(
        ("enum", "bool", "int32", "int64", "uint32", "uint64", "sint32", "sint64"), _WIRE_VARINT
    ),
    **dict.fromkeys(("fixed64", "sfixed64", "double"), _WIRE_I64),
    **dict.fromkeys(("fixed32", "sfixed32", "float"), _WIRE_I32),
    **dict.fromkeys(("string", "bytes", "message", "map"), _WIRE_LEN),
}
_MAX_FIELD_NUMBER: Final = (1 << 29) - 1
_MAX_DEPTH: Final = 100
"""protobuf's default recursion limit for nested messages."""


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = 0
    for index in range(10):
        if pos >= len(data):
            raise _MalformedError(f"truncated varint at byte {pos}")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << (7 * index)
        if not byte & 0x80:
            if index == 9 and byte > 1:
                raise _MalformedError(f"varint overflowing 64 bits ending at byte {pos}")
            return result, pos
    raise _MalformedError(f"varint longer than 10 bytes ending at byte {pos}")


def _skip_value(data: bytes, pos: int, number: int, wire: int) -> tuple[int, int]:
    """Check the framing of one field value at ``pos``; returns (start of its payload, end)."""
    if wire == _WIRE_VARINT:
        _, end = _varint(data, pos)
        return pos, end
    if wire in (_WIRE_I64, _WIRE_I32):
        end = pos + (8 if wire == _WIRE_I64 else 4)
        if end > len(data):
            raise _MalformedError(f"field {number}: truncated fixed-size value at byte {pos}")
        return pos, end
    if wire == _WIRE_LEN:
        length, start = _varint(data, pos)
        if length > len(data) - start:
            raise _MalformedError(
                f"field {number}: length {length} runs past the end of the message"
            )
        return start, start + length
    if wire in (_WIRE_GROUP_START, _WIRE_GROUP_END):
        # proto3 (and CSI) has no groups, and betterproto2 cannot skip one: it would read the
        # group's inner fields as fields of the message.
        raise _MalformedError(f"field {number}: groups are not supported")
    raise _MalformedError(f"field {number}: invalid wire type {wire}")


def _check_packed(payload: bytes, number: int, wire: int) -> None:
    if wire == _WIRE_VARINT:
        pos = 0
        while pos < len(payload):
            _, pos = _varint(payload, pos)
    elif len(payload) % (8 if wire == _WIRE_I64 else 4):
        raise _MalformedError(f"field {number}: packed values of a partial size")


def _check_wire(data: bytes, cls: type[betterproto2.Message], depth: int = 0) -> None:
    """Raise :class:`_MalformedError` unless ``data`` is a valid encoding of ``cls``.

    betterproto2 parses leniently: a truncated field is cut short, a field of the wrong wire
    type lands in the message with the wrong Python type, bad wire types are skipped. A
    handler must never see such a message (a truncated volume name is another volume)."""
    if depth > _MAX_DEPTH:
        raise _MalformedError("messages nested too deeply")
    # betterproto2's per-class field table (a class property its typing does not express).
    meta: Any = getattr(cls, "_betterproto")  # noqa: B009
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if not 1 <= number <= _MAX_FIELD_NUMBER:
            raise _MalformedError(f"invalid field number {number}")
        name = meta.field_name_by_number.get(number)
        start, pos = _skip_value(data, pos, number, wire)
        if name is None:
            continue  # an unknown field: kept as such, as protobuf does
        field = meta.meta_by_field_name[name]
        expected = _WIRE_OF[field.proto_type]
        payload = data[start:pos]
        if wire != expected:
            if wire == _WIRE_LEN and field.repeated and expected != _WIRE_LEN:
                _check_packed(payload, number, expected)
                continue
            raise _MalformedError(
                f"field {name} ({number}) has wire type {wire}, expected {expected}"
            )
        if field.proto_type == "string":
            try:
                payload.decode("utf-8")
            except UnicodeDecodeError:
                raise _MalformedError(f"field {name} ({number}) is not valid UTF-8") from None
        elif field.proto_type == "message":
            sub: type[betterproto2.Message] = (
                field.unwrap() if field.unwrap is not None else meta.cls_by_field[name]
            )
            _check_wire(payload, sub, depth + 1)
        elif field.proto_type == "map":
            _check_wire(payload, meta.cls_by_field[name], depth + 1)


def _header(stream: H2Stream, name: str) -> str | None:
    for key, value in stream.headers or ():
        if key == name:
            return value
    return None


async def _read(stream: H2Stream, size: int, what: str) -> bytes:
    try:
        return await stream.recv_data(size)
    except AssertionError:
        # grpclib's buffer: the stream ended before ``size`` bytes came.
        raise GRPCError(Status.INTERNAL, f"grpc: request truncated in its {what}") from None


async def _receive(
    stream: _Stream, request_type: type[betterproto2.Message], max_message: int
) -> betterproto2.Message:
    """Read a request message the way grpc-go checks it, before anything is buffered beyond
    the limit and before a handler sees it."""
    # grpclib reads a message without a size limit and hands over whatever its lenient codec
    # makes of the bytes; read the frame from its HTTP/2 stream instead.
    h2_stream: H2Stream = stream._stream
    encoding = _header(h2_stream, "grpc-encoding")
    if encoding not in (None, "identity"):
        raise GRPCError(
            Status.UNIMPLEMENTED,
            f'grpc: Decompressor is not installed for grpc-encoding "{encoding}"',
        )
    prefix = await _read(h2_stream, 5, "message prefix")
    if not prefix:
        raise GRPCError(Status.INTERNAL, "grpc: the client sent no request message")
    flag, length = struct.unpack(">BI", prefix)
    if flag == 1:
        raise GRPCError(
            Status.INTERNAL, "grpc: compressed flag set with identity or empty encoding"
        )
    if flag != 0:
        raise GRPCError(Status.INTERNAL, f"grpc: invalid compressed flag {flag}")
    if length > max_message:
        raise GRPCError(
            Status.RESOURCE_EXHAUSTED,
            f"grpc: received message larger than max ({length} vs. {max_message})",
        )
    data = await _read(h2_stream, length, "message")
    try:
        _check_wire(data, request_type)
        return request_type.parse(data)
    except _MalformedError as err:
        raise GRPCError(Status.INTERNAL, f"grpc: error unmarshalling request: {err}") from None
    except Exception as err:  # betterproto2 refusing what the check let through
        raise GRPCError(
            Status.INTERNAL, f"grpc: error unmarshalling request: {type(err).__name__}"
        ) from None


async def _received(
    path: str, stream: _Stream, request_type: type[betterproto2.Message], max_message: int
) -> betterproto2.Message:
    try:
        return await _receive(stream, request_type, max_message)
    except GRPCError as err:
        log.info("csi request refused", method=path, code=err.status.name, message=err.message)
        raise


def _unary(
    path: str,
    method: Callable[[Any], Awaitable[betterproto2.Message]],
    request_type: type[betterproto2.Message],
    max_message: int,
) -> Callable[[_Stream], Awaitable[None]]:
    async def handle(stream: _Stream) -> None:
        request = await _received(path, stream, request_type, max_message)
        started = time.monotonic()
        log.debug("csi call", method=path, request=Sanitized(request))
        try:
            response = await method(request)
        except Exception as exc:
            error = _to_grpc_error(path, exc, request)
            log.info(
                "csi call failed",
                method=path,
                code=error.status.name,
                message=error.message,
                seconds=round(time.monotonic() - started, 6),
            )
            raise error from None
        log.debug(
            "csi call done",
            method=path,
            response=Sanitized(response),
            seconds=round(time.monotonic() - started, 6),
        )
        await stream.send_message(response)

    return handle


def _server_stream(
    path: str,
    method: Callable[[Any], Any],
    request_type: type[betterproto2.Message],
    max_message: int,
) -> Callable[[_Stream], Awaitable[None]]:
    async def handle(stream: _Stream) -> None:
        request = await _received(path, stream, request_type, max_message)
        log.debug("csi call", method=path, request=Sanitized(request))
        try:
            responses = method(request)
            if isinstance(responses, AsyncIterable):
                async for response in responses:
                    await stream.send_message(response)
        except Exception as exc:
            raise _to_grpc_error(path, exc, request) from None

    return handle


def _guarded(
    path: str, func: Callable[[_Stream], Awaitable[None]]
) -> Callable[[_Stream], Awaitable[None]]:
    async def handle(stream: _Stream) -> None:
        try:
            await func(stream)
        except Exception as exc:
            raise _to_grpc_error(path, exc) from None

    return handle


class _Routes(dict[str, grpclib.const.Handler]):
    """The server's method table. A path it does not serve gets a handler answering
    UNIMPLEMENTED as any handler answers a status (grpc-go's messages): grpclib's own answer
    is a Trailers-Only response without the content-type the gRPC protocol requires there,
    which grpc-go and grpclib clients read as UNKNOWN."""

    def get(self, key: str, default: Any = None) -> Any:
        """The handler of ``key``, or one answering UNIMPLEMENTED."""
        handler = super().get(key)
        if handler is not None:
            return handler
        service, _, method = key.strip("/").partition("/")
        if any(path.startswith(f"/{service}/") for path in self):
            message = f"unknown method {method} for service {service}"
        else:
            message = f"unknown service {service}"

        async def unimplemented(stream: _Stream) -> None:
            raise GRPCError(Status.UNIMPLEMENTED, message)

        return grpclib.const.Handler(
            unimplemented, grpclib.const.Cardinality.UNARY_UNARY, object, object
        )


_PREFACE: Final = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_MAX_FRAME: Final = 16384
"""SETTINGS_MAX_FRAME_SIZE the server advertises (the HTTP/2 default; grpclib keeps it)."""


class _FrameGuard:
    """Follows the frame headers a client sends and flags a frame longer than the server
    accepts as soon as its header arrives: h2 compares the length only once the whole frame
    is buffered, so a client could make the server hold 16 MiB per connection first."""

    def __init__(self) -> None:
        self._preface = len(_PREFACE)
        self._header = b""
        self._body = 0

    def feed(self, data: bytes) -> bool:
        """False when ``data`` starts a frame over the limit."""
        pos = min(self._preface, len(data))
        self._preface -= pos
        while pos < len(data):
            if self._body:
                step = min(self._body, len(data) - pos)
                self._body -= step
                pos += step
                continue
            need = 9 - len(self._header)
            self._header += data[pos : pos + need]
            pos += need
            if len(self._header) == 9:
                self._body = int.from_bytes(self._header[:3], "big")
                self._header = b""
                if self._body > _MAX_FRAME:
                    return False
        return True


class _ClosingServer(grpclib.server.Server):
    """grpclib's Server, hardened: closes the client connections on stop, and never lets a
    client's bytes raise out of the protocol.

    ``Server.close()`` stops listening and cancels running requests but keeps established
    HTTP/2 connections open, so a client would go on talking to a "stopped" driver. A driver
    process that stops drops its connections; so does this server (clients see the loss).
    """

    def __init__(self, handlers: list[Any]) -> None:
        super().__init__(handlers)
        self._mapping = _Routes(self._mapping)
        self.transports: set[asyncio.BaseTransport] = set()

    def _protocol_factory(self) -> H2Protocol:
        protocol = super()._protocol_factory()
        made = protocol.connection_made
        lost = protocol.connection_lost
        received = protocol.data_received
        accept = protocol.handler.accept
        transports = self.transports
        own: list[asyncio.BaseTransport] = []
        frames = _FrameGuard()

        def drop(reason: str) -> None:
            log.warning("closing a CSI client connection", reason=reason)
            for transport in own:
                transport.close()

        def connection_made(transport: asyncio.BaseTransport) -> None:
            transports.add(transport)
            own.append(transport)
            made(transport)

        def connection_lost(exc: BaseException | None) -> None:
            # Forget closed connections, or a long-lived driver keeps every one it ever had.
            for transport in own:
                transports.discard(transport)
            lost(exc)

        def data_received(data: bytes) -> None:
            if not frames.feed(data):
                drop(f"a frame longer than {_MAX_FRAME} bytes")
                return
            try:
                received(data)
            except Exception as exc:  # a client's bytes must never reach asyncio's handler
                # grpclib closes the connection on an HTTP/2 protocol error itself; other
                # errors of the parser (a header that is not ASCII) would otherwise end as
                # asyncio's "Fatal error" with a traceback. The data is never logged.
                drop(f"unreadable HTTP/2 ({type(exc).__name__})")

        def checked_accept(
            stream: H2Stream, headers: list[tuple[str, str]], release: Callable[[], None]
        ) -> None:
            names = {name for name, _ in headers}
            if not {":method", ":path"} <= names:
                # grpclib would fail on the missing key and never answer: the client waited
                # forever. A malformed request is a stream error (RFC 9113 8.1.1).
                log.warning("refusing a CSI request without :method or :path")
                stream.reset_nowait(ErrorCodes.PROTOCOL_ERROR)
                release()
                return
            stream.headers = headers  # read back for grpc-encoding
            accept(stream, headers, release)

        protocol.connection_made = connection_made  # type: ignore[method-assign]
        protocol.connection_lost = connection_lost  # type: ignore[method-assign]
        protocol.data_received = data_received  # type: ignore[method-assign]
        protocol.handler.accept = checked_accept  # type: ignore[method-assign,assignment]
        return protocol

    def close_connections(self) -> None:
        for transport in list(self.transports):
            transport.close()
        self.transports.clear()


class CSIServer:
    """Serves CSI services on a unix socket; an async context manager.

    ``async with CSIServer([identity, controller], endpoint) as server:`` listens until the
    block ends. A stale socket file left by a previous process is removed before binding.
    A request message larger than ``max_receive_message_length`` bytes is refused with
    RESOURCE_EXHAUSTED before it is read.
    """

    def __init__(
        self,
        services: Iterable[betterproto2.grpclib.ServiceBase],
        endpoint: str,
        *,
        max_receive_message_length: int = DEFAULT_MAX_RECEIVE_MESSAGE_LENGTH,
    ) -> None:
        self.services = list(services)
        if not any(isinstance(s, v1.IdentityBase) for s in self.services):
            raise ValueError("a CSI server needs an Identity service")
        if max_receive_message_length <= 0:
            raise ValueError(
                f"max_receive_message_length must be positive, got {max_receive_message_length}"
            )
        self.path = unix_socket_path(endpoint)
        self.max_receive_message_length = max_receive_message_length
        self._server: _ClosingServer | None = None

    @property
    def endpoint(self) -> str:
        """``unix://`` endpoint clients connect to."""
        return f"unix://{self.path}"

    @property
    def connections(self) -> int:
        """Client connections open now."""
        return len(self._server.transports) if self._server is not None else 0

    async def start(self) -> None:
        """Bind the socket and start serving."""
        if self._server is not None:
            raise RuntimeError("server already started")
        if self.path.is_socket():
            self.path.unlink()
        server = _ClosingServer(
            [_Mapped(s, self.max_receive_message_length) for s in self.services]
        )
        await server.start(path=os.fspath(self.path))
        self._server = server
        log.info("csi server listening", endpoint=self.endpoint)

    async def stop(self) -> None:
        """Stop accepting, close connections, and remove the socket file."""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        server.close_connections()
        await server.wait_closed()
        if self.path.is_socket():
            self.path.unlink()
        log.info("csi server stopped", endpoint=self.endpoint)

    async def __aenter__(self) -> CSIServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

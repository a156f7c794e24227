"""A kit for serving CSI (Identity, Controller, Node, GroupController) from Python on a unix
socket with grpclib.

Subclass :class:`ControllerService` / :class:`NodeService` / :class:`GroupControllerService`
and override the RPCs the driver implements; declare capabilities once, in the constructors;
hand the services to :class:`CSIServer`, which refuses to start when a claimed capability's
RPC is not overridden (:class:`CapabilityError`). Every call is logged with its secrets
stripped, after its answer and unable to change it; a :class:`CSIError` raised by a handler
becomes that gRPC status, any other exception INTERNAL with the traceback logged, and the
server keeps serving. :mod:`pyprovlib.csi._validate` has the request checks drivers repeat.

Built on grpclib's public API only: the handlers are wrapped through the services'
``__mapping__``, requests decoded by a codec of our own. Requests are checked before a handler
sees them, with grpc-go's answers: a message larger than ``max_receive_message_length`` is
RESOURCE_EXHAUSTED, a compressed one UNIMPLEMENTED, a truncated, missing or malformed one (bad
protobuf wire format, a field of the wrong wire type, a string that is not UTF-8) INTERNAL, a
CSI method or service not served UNIMPLEMENTED. What grpclib decides itself is described in
the docs (docs/reference/csi.md, "What the server kit checks").
"""

from __future__ import annotations

import contextlib
import enum
import os
import pathlib
import socket
import time
import traceback
import weakref
from collections.abc import AsyncIterable, Awaitable, Callable, Iterable, Mapping
from typing import Any, Final, TypeVar

import betterproto2
import grpclib.const
import grpclib.server
from betterproto2.casing import snake_case
from grpclib.const import Status
from grpclib.encoding.base import CodecBase
from grpclib.exceptions import GRPCError

from pyprovlib._errors import PyprovlibError
from pyprovlib._logging import get_logger, log_quietly
from pyprovlib.csi._proto.csi import v1
from pyprovlib.csi._redact import Sanitized, scrub_secret_values
from pyprovlib.csi._validate import CSIError
from pyprovlib.csi._wire import MalformedError, check_wire

__all__ = [
    "DEFAULT_MAX_RECEIVE_MESSAGE_LENGTH",
    "CSIError",
    "CSIServer",
    "CapabilityError",
    "ControllerService",
    "GroupControllerService",
    "IdentityService",
    "NodeService",
    "Status",
    "unix_socket_path",
]

log = get_logger(__name__)
M = TypeVar("M", bound=betterproto2.Message)

DEFAULT_MAX_RECEIVE_MESSAGE_LENGTH: Final = 4 * 1024 * 1024
"""grpc-go's default limit on the size of a received message (4 MiB)."""


class CapabilityError(PyprovlibError, ValueError):
    """A service claims a capability whose RPC it does not implement (raised at start-up,
    instead of the RPC answering UNIMPLEMENTED to a caller that was told it works)."""


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
        self.group_controller_served: bool | None = None
        """Set by :class:`CSIServer`: whether a GroupController is served beside this."""

    @property
    def plugin_services(self) -> frozenset[v1.PluginCapabilityServiceType]:
        """The plugin services advertised: those declared, with GROUP_CONTROLLER_SERVICE
        following whether the server serves a GroupController (when known)."""
        group = v1.PluginCapabilityServiceType.GROUP_CONTROLLER_SERVICE
        if self.group_controller_served is None:
            return self.services
        if self.group_controller_served:
            return self.services | {group}
        return self.services - {group}

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
            for t in sorted(self.plugin_services, key=lambda t: t.value)
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


def _declared(
    capability: Callable[..., M], rpc: Callable[..., Any], types: Iterable[enum.Enum]
) -> list[M]:
    """A service's ``*GetCapabilities`` answer: one ``capability(rpc=rpc(type=t))`` per
    declared RPC type, in the enum's order so that the answer is stable."""
    return [capability(rpc=rpc(type=t)) for t in sorted(types, key=lambda t: t.value)]


class ControllerService(v1.ControllerBase):
    """Base for a driver's Controller service; RPCs not overridden answer UNIMPLEMENTED."""

    def __init__(self, capabilities: Iterable[v1.ControllerServiceCapabilityRpcType] = ()) -> None:
        self.capabilities = frozenset(capabilities)

    async def controller_get_capabilities(
        self, message: v1.ControllerGetCapabilitiesRequest
    ) -> v1.ControllerGetCapabilitiesResponse:
        """The controller capabilities declared in the constructor."""
        return v1.ControllerGetCapabilitiesResponse(
            capabilities=_declared(
                v1.ControllerServiceCapability, v1.ControllerServiceCapabilityRpc, self.capabilities
            )
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
            capabilities=_declared(
                v1.NodeServiceCapability, v1.NodeServiceCapabilityRpc, self.capabilities
            )
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


class GroupControllerService(v1.GroupControllerBase):
    """Base for a driver's GroupController service (volume group snapshots); RPCs not
    overridden answer UNIMPLEMENTED. Serving one makes the Identity advertise
    GROUP_CONTROLLER_SERVICE, as not serving one withdraws it."""

    def __init__(
        self, capabilities: Iterable[v1.GroupControllerServiceCapabilityRpcType] = ()
    ) -> None:
        self.capabilities = frozenset(capabilities)

    async def group_controller_get_capabilities(
        self, message: v1.GroupControllerGetCapabilitiesRequest
    ) -> v1.GroupControllerGetCapabilitiesResponse:
        """The group controller capabilities declared in the constructor."""
        return v1.GroupControllerGetCapabilitiesResponse(
            capabilities=_declared(
                v1.GroupControllerServiceCapability,
                v1.GroupControllerServiceCapabilityRpc,
                self.capabilities,
            )
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


class _CheckedCodec(CodecBase):
    """grpclib's message codec, for betterproto2 messages, checking a request strictly
    (size, then protobuf wire format) before it is parsed. grpclib calls :meth:`decode` from
    ``stream.recv_message()`` inside the handler, so a GRPCError raised here is the answer."""

    __content_subtype__ = "proto"

    def __init__(self, max_message: int) -> None:
        self.max_message = max_message

    def encode(self, message: Any, message_type: Any) -> bytes:
        if not isinstance(message, message_type):
            raise TypeError(f"message must be a {message_type.__name__}, not {type(message)}")
        return bytes(message)

    def decode(self, data: bytes, message_type: Any) -> Any:
        if len(data) > self.max_message:
            raise GRPCError(
                Status.RESOURCE_EXHAUSTED,
                f"grpc: received message larger than max ({len(data)} vs. {self.max_message})",
            )
        try:
            check_wire(data, message_type)
            return message_type.parse(data)
        except MalformedError as err:
            raise GRPCError(Status.INTERNAL, f"grpc: error unmarshalling request: {err}") from None
        except Exception as err:  # betterproto2 refusing what the check let through
            raise GRPCError(
                Status.INTERNAL, f"grpc: error unmarshalling request: {type(err).__name__}"
            ) from None


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
    log_quietly(
        log,
        "error",
        "csi handler failed",
        method=path,
        error_type=type(exc).__name__,
        traceback=scrub_secret_values(text, request),
    )
    return GRPCError(Status.INTERNAL, f"internal error in {path}: {type(exc).__name__}")


async def _received(path: str, stream: _Stream) -> betterproto2.Message:
    """The request message, or the status grpc-go answers for what the client sent."""
    try:
        try:
            request = await stream.recv_message()
        except NotImplementedError:  # grpclib on a message with the compressed flag
            raise GRPCError(
                Status.UNIMPLEMENTED, "grpc: compressed requests are not supported"
            ) from None
        except AssertionError:  # grpclib: the stream ended inside the message
            raise GRPCError(Status.INTERNAL, "grpc: request truncated") from None
        if request is None:
            raise GRPCError(Status.INTERNAL, "grpc: the client sent no request message")
    except GRPCError as err:
        log_quietly(
            log,
            "info",
            "csi request refused",
            method=path,
            code=err.status.name,
            message=err.message,
        )
        raise
    result: betterproto2.Message = request
    return result


def _unary(
    path: str,
    method: Callable[[Any], Awaitable[Any]],
    reply_type: type[betterproto2.Message],
) -> Callable[[_Stream], Awaitable[None]]:
    async def handle(stream: _Stream) -> None:
        request = await _received(path, stream)
        started = time.monotonic()
        log_quietly(log, "debug", "csi call", method=path, request=Sanitized(request))
        try:
            response = await method(request)
            if not isinstance(response, reply_type):
                raise TypeError(
                    f"the handler returned {type(response).__name__}, not {reply_type.__name__}"
                )
        except Exception as exc:
            error = _to_grpc_error(path, exc, request)
            log_quietly(
                log,
                "info",
                "csi call failed",
                method=path,
                code=error.status.name,
                message=error.message,
                seconds=round(time.monotonic() - started, 6),
            )
            raise error from None
        await stream.send_message(response)
        # After the answer, and unable to raise: a log line never changes or loses it.
        log_quietly(
            log,
            "debug",
            "csi call done",
            method=path,
            response=Sanitized(response),
            seconds=round(time.monotonic() - started, 6),
        )

    return handle


def _server_stream(path: str, method: Callable[[Any], Any]) -> Callable[[_Stream], Awaitable[None]]:
    async def handle(stream: _Stream) -> None:
        request = await _received(path, stream)
        log_quietly(log, "debug", "csi call", method=path, request=Sanitized(request))
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


class _Mapped:
    """A service as grpclib serves it (its ``__mapping__``), each handler wrapped with the
    request checks, logging and exception mapping."""

    def __init__(self, service: betterproto2.grpclib.ServiceBase) -> None:
        self.service = service

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        # Generated services define __mapping__; betterproto2's ServiceBase does not declare it.
        mapping: dict[str, grpclib.const.Handler] = getattr(self.service, "__mapping__")()  # noqa: B009
        wrapped: dict[str, grpclib.const.Handler] = {}
        for path, handler in mapping.items():
            cardinality = handler.cardinality
            method = getattr(self.service, snake_case(path.rsplit("/", 1)[1]))
            if cardinality is grpclib.const.Cardinality.UNARY_UNARY:
                func = _unary(path, method, handler.reply_type)
            elif cardinality is grpclib.const.Cardinality.UNARY_STREAM:
                func = _server_stream(path, method)
            else:  # client streaming: no CSI RPC is; grpclib reads the messages
                func = _guarded(path, handler.func)
            wrapped[path] = grpclib.const.Handler(
                func, cardinality, handler.request_type, handler.reply_type
            )
        return wrapped


_CSI_SERVICES: Final = (
    v1.IdentityBase,
    v1.ControllerBase,
    v1.NodeBase,
    v1.GroupControllerBase,
    v1.SnapshotMetadataBase,
)


class _Unserved:
    """Every method of a CSI service the driver does not serve, answering UNIMPLEMENTED with
    grpc-go's message (grpclib's own answer to an unknown path lacks the content-type gRPC
    clients require, and they read it as UNKNOWN)."""

    def __init__(self, base: type[betterproto2.grpclib.ServiceBase]) -> None:
        self.base = base

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        mapping: dict[str, grpclib.const.Handler] = getattr(self.base(), "__mapping__")()  # noqa: B009
        service = next(iter(mapping)).strip("/").split("/")[0]
        message = f"unknown service {service}"

        async def unimplemented(stream: _Stream) -> None:
            raise GRPCError(Status.UNIMPLEMENTED, message)

        return {
            path: grpclib.const.Handler(
                unimplemented, handler.cardinality, handler.request_type, handler.reply_type
            )
            for path, handler in mapping.items()
        }


# -- capabilities and the RPCs they promise ------------------------------------------------------

_Ctl = v1.ControllerServiceCapabilityRpcType
_Nod = v1.NodeServiceCapabilityRpcType
_Grp = v1.GroupControllerServiceCapabilityRpcType

_CONTROLLER_RPCS: Final[Mapping[Any, tuple[str, ...]]] = {
    _Ctl.CREATE_DELETE_VOLUME: ("create_volume", "delete_volume"),
    _Ctl.PUBLISH_UNPUBLISH_VOLUME: ("controller_publish_volume", "controller_unpublish_volume"),
    _Ctl.LIST_VOLUMES: ("list_volumes",),
    _Ctl.GET_CAPACITY: ("get_capacity",),
    _Ctl.CREATE_DELETE_SNAPSHOT: ("create_snapshot", "delete_snapshot"),
    _Ctl.LIST_SNAPSHOTS: ("list_snapshots",),
    _Ctl.CLONE_VOLUME: ("create_volume",),
    _Ctl.EXPAND_VOLUME: ("controller_expand_volume",),
    _Ctl.LIST_VOLUMES_PUBLISHED_NODES: ("list_volumes",),
    _Ctl.GET_VOLUME: ("controller_get_volume",),
    _Ctl.MODIFY_VOLUME: ("controller_modify_volume",),
    _Ctl.GET_SNAPSHOT: ("get_snapshot",),
}
_NODE_RPCS: Final[Mapping[Any, tuple[str, ...]]] = {
    _Nod.STAGE_UNSTAGE_VOLUME: ("node_stage_volume", "node_unstage_volume"),
    _Nod.GET_VOLUME_STATS: ("node_get_volume_stats",),
    _Nod.EXPAND_VOLUME: ("node_expand_volume",),
}
_GROUP_RPCS: Final[Mapping[Any, tuple[str, ...]]] = {
    _Grp.CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT: (
        "create_volume_group_snapshot",
        "delete_volume_group_snapshot",
        "get_volume_group_snapshot",
    ),
}


def _overridden(service: object, base: type[Any], name: str) -> bool:
    return getattr(type(service), name) is not getattr(base, name)


def _check_capabilities(services: Iterable[object]) -> None:
    """Raise :class:`CapabilityError` naming each capability claimed by one of ``services``
    whose RPC is not overridden, and each plugin service the Identity claims but nothing
    serves. :class:`CSIServer` calls it before serving."""
    problems: list[str] = []
    served = list(services)
    for service in served:
        for base, table in (
            (v1.ControllerBase, _CONTROLLER_RPCS),
            (v1.NodeBase, _NODE_RPCS),
            (v1.GroupControllerBase, _GROUP_RPCS),
        ):
            if not isinstance(service, base):
                continue
            claimed = getattr(service, "capabilities", ())
            for capability in sorted(claimed, key=lambda c: c.value):
                for name in table.get(capability, ()):
                    if not _overridden(service, base, name):
                        problems.append(
                            f"{type(service).__name__} claims {capability.name} but does not "
                            f"implement {name}"
                        )
    for identity in served:
        if not isinstance(identity, IdentityService):
            continue
        plugin = v1.PluginCapabilityServiceType
        wanted: tuple[tuple[Any, type[Any]], ...] = (
            (plugin.CONTROLLER_SERVICE, v1.ControllerBase),
            (plugin.GROUP_CONTROLLER_SERVICE, v1.GroupControllerBase),
            (plugin.SNAPSHOT_METADATA_SERVICE, v1.SnapshotMetadataBase),
        )
        for capability, base in wanted:
            if capability in identity.plugin_services and not any(
                isinstance(s, base) for s in served
            ):
                problems.append(
                    f"{type(identity).__name__} claims {capability.name} but no "
                    f"{base.__name__.removesuffix('Base')} service is served"
                )
    if problems:
        raise CapabilityError(
            "claimed CSI capabilities without their RPCs (override the methods or drop the "
            "capabilities): " + "; ".join(problems)
        )


# -- serving ---------------------------------------------------------------------------------------


class _TrackingSocket(socket.socket):
    """The listening socket, remembering the connections it accepts (asyncio's event loop
    accepts on the socket it is given), so that stopping the server can end them: grpclib's
    ``Server.close()`` leaves established connections open, and a client would go on
    talking to a "stopped" driver."""

    def __init__(self, family: int, kind: int) -> None:
        super().__init__(family, kind)
        self.accepted: weakref.WeakSet[socket.socket] = weakref.WeakSet()

    def accept(self) -> tuple[socket.socket, Any]:
        conn, address = super().accept()
        self.accepted.add(conn)
        return conn, address

    def open_connections(self) -> list[socket.socket]:
        return [conn for conn in list(self.accepted) if conn.fileno() != -1]


class CSIServer:
    """Serves CSI services on a unix socket; an async context manager.

    ``async with CSIServer([identity, controller], endpoint) as server:`` listens until the
    block ends. A stale socket file left by a previous process is removed before binding.
    A request message larger than ``max_receive_message_length`` bytes is refused with
    RESOURCE_EXHAUSTED. Constructing the server checks that every claimed capability has
    its RPC (:class:`CapabilityError`), and keeps the Identity's GROUP_CONTROLLER_SERVICE
    capability in step with whether a :class:`GroupControllerService` is served.
    ``check_capabilities=False`` skips the first check, for test doubles that advertise
    capabilities they never serve (to test how a sidecar reacts to them).
    """

    def __init__(
        self,
        services: Iterable[betterproto2.grpclib.ServiceBase],
        endpoint: str,
        *,
        max_receive_message_length: int = DEFAULT_MAX_RECEIVE_MESSAGE_LENGTH,
        check_capabilities: bool = True,
    ) -> None:
        self.services = list(services)
        identities = [s for s in self.services if isinstance(s, v1.IdentityBase)]
        if not identities:
            raise ValueError("a CSI server needs an Identity service")
        if max_receive_message_length <= 0:
            raise ValueError(
                f"max_receive_message_length must be positive, got {max_receive_message_length}"
            )
        group = any(isinstance(s, v1.GroupControllerBase) for s in self.services)
        for identity in identities:
            if isinstance(identity, IdentityService):
                identity.group_controller_served = group
        if check_capabilities:
            _check_capabilities(self.services)
        self.path = unix_socket_path(endpoint)
        self.max_receive_message_length = max_receive_message_length
        self._server: grpclib.server.Server | None = None
        self._socket: _TrackingSocket | None = None

    @property
    def endpoint(self) -> str:
        """``unix://`` endpoint clients connect to."""
        return f"unix://{self.path}"

    @property
    def connections(self) -> int:
        """Client connections open now."""
        return len(self._socket.open_connections()) if self._socket is not None else 0

    async def start(self) -> None:
        """Bind the socket and start serving."""
        if self._server is not None:
            raise RuntimeError("server already started")
        if self.path.is_socket():
            self.path.unlink()
        served: list[Any] = [_Mapped(s) for s in self.services]
        served += [
            _Unserved(base)
            for base in _CSI_SERVICES
            if not any(isinstance(s, base) for s in self.services)
        ]
        server = grpclib.server.Server(served, codec=_CheckedCodec(self.max_receive_message_length))
        sock = _TrackingSocket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(os.fspath(self.path))
            sock.listen(100)
            sock.setblocking(False)
            await server.start(sock=sock)
        except BaseException:
            sock.close()
            raise
        self._server, self._socket = server, sock
        log.info("csi server listening", endpoint=self.endpoint)

    async def stop(self) -> None:
        """Stop accepting, close connections, and remove the socket file."""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        if self._socket is not None:
            for conn in self._socket.open_connections():
                # The transport sees the end of its stream and closes itself.
                with contextlib.suppress(OSError):  # already gone
                    conn.shutdown(socket.SHUT_RDWR)
        await server.wait_closed()
        if self.path.is_socket():
            self.path.unlink()
        log.info("csi server stopped", endpoint=self.endpoint)

    async def __aenter__(self) -> CSIServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

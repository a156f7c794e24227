"""A kit for serving CSI (Identity, Controller, Node) from Python on a unix socket with grpclib.

Subclass :class:`ControllerService` / :class:`NodeService` and override the RPCs the driver
implements (the rest answer UNIMPLEMENTED); declare capabilities once, in the constructors;
hand the services to :class:`CSIServer`. Every call is logged with its secrets stripped; a
:class:`CSIError` raised by a handler becomes that gRPC status, any other exception becomes
INTERNAL with the traceback logged, and the server keeps serving.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import time
import traceback
from collections.abc import Awaitable, Callable, Iterable
from types import TracebackType
from typing import Any

import betterproto2
import grpclib.const
import grpclib.server
import structlog
from betterproto2.casing import snake_case
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from grpclib.protocol import H2Protocol

from pyprovlib.csi._proto.csi import v1
from pyprovlib.csi.redact import Sanitized, scrub_secret_values

__all__ = [
    "CSIError",
    "CSIServer",
    "ControllerService",
    "IdentityService",
    "NodeService",
    "unix_socket_path",
]

log = structlog.get_logger(__name__)


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
    """Wraps a generated service's handlers with logging and exception mapping."""

    def __init__(self, service: betterproto2.grpclib.ServiceBase) -> None:
        self.service = service

    def __mapping__(self) -> dict[str, grpclib.const.Handler]:
        # Generated services define __mapping__; betterproto2's ServiceBase does not declare it.
        mapping: dict[str, grpclib.const.Handler] = getattr(self.service, "__mapping__")()  # noqa: B009
        wrapped: dict[str, grpclib.const.Handler] = {}
        for path, handler in mapping.items():
            if handler.cardinality is grpclib.const.Cardinality.UNARY_UNARY:
                method = getattr(self.service, snake_case(path.rsplit("/", 1)[1]))
                func = _unary(path, method)
            else:
                func = _guarded(path, handler.func)
            wrapped[path] = grpclib.const.Handler(
                func, handler.cardinality, handler.request_type, handler.reply_type
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


def _unary(
    path: str, method: Callable[[Any], Awaitable[betterproto2.Message]]
) -> Callable[[_Stream], Awaitable[None]]:
    async def handle(stream: _Stream) -> None:
        request = await stream.recv_message()
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


def _guarded(
    path: str, func: Callable[[_Stream], Awaitable[None]]
) -> Callable[[_Stream], Awaitable[None]]:
    async def handle(stream: _Stream) -> None:
        try:
            await func(stream)
        except Exception as exc:
            raise _to_grpc_error(path, exc) from None

    return handle


class _ClosingServer(grpclib.server.Server):
    """grpclib's Server, plus closing the client connections on stop.

    ``Server.close()`` stops listening and cancels running requests but keeps established
    HTTP/2 connections open, so a client would go on talking to a "stopped" driver. A driver
    process that stops drops its connections; so does this server (clients see the loss).
    """

    def __init__(self, handlers: list[Any]) -> None:
        super().__init__(handlers)
        self._transports: set[asyncio.BaseTransport] = set()

    def _protocol_factory(self) -> H2Protocol:
        protocol = super()._protocol_factory()
        made = protocol.connection_made
        transports = self._transports

        def connection_made(transport: asyncio.BaseTransport) -> None:
            transports.add(transport)
            made(transport)

        protocol.connection_made = connection_made  # type: ignore[method-assign]
        return protocol

    def close_connections(self) -> None:
        for transport in self._transports:
            transport.close()
        self._transports.clear()


class CSIServer:
    """Serves CSI services on a unix socket; an async context manager.

    ``async with CSIServer([identity, controller], endpoint) as server:`` listens until the
    block ends. A stale socket file left by a previous process is removed before binding.
    """

    def __init__(self, services: Iterable[betterproto2.grpclib.ServiceBase], endpoint: str) -> None:
        self.services = list(services)
        if not any(isinstance(s, v1.IdentityBase) for s in self.services):
            raise ValueError("a CSI server needs an Identity service")
        self.path = unix_socket_path(endpoint)
        self._server: _ClosingServer | None = None

    @property
    def endpoint(self) -> str:
        """``unix://`` endpoint clients connect to."""
        return f"unix://{self.path}"

    async def start(self) -> None:
        """Bind the socket and start serving."""
        if self._server is not None:
            raise RuntimeError("server already started")
        if self.path.is_socket():
            self.path.unlink()
        server = _ClosingServer([_Mapped(s) for s in self.services])
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

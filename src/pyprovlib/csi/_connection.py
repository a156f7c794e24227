"""A connection to a CSI driver: connect, probe until ready, identify, call with metrics.

Port of csi-lib-utils' ``connection`` (Connect, OnConnectionLoss, the ``csi_sidecar``
operations histogram) and ``rpc`` (ProbeForever, GetDriverName, capabilities), on grpclib's
``Channel``: each unary method's :class:`grpclib.client.UnaryUnaryMethod` is made once per
channel, so a call does no per-call set-up beyond grpclib's own.
Endpoints are ``unix:///path``, ``unix:/path``, ``/path`` or ``host:port``. Every call has a
timeout, is timed into ``csi_sidecar_operations_seconds{driver_name,method_name,
grpc_status_code}``, is logged with its secrets stripped, and fails with a
:class:`CSICallError` carrying the gRPC status and a message free of secrets.
"""

from __future__ import annotations

import asyncio
import logging
import pathlib
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import betterproto2
import grpclib.exceptions
import structlog
from grpclib.client import Channel, UnaryUnaryMethod
from grpclib.const import Cardinality, Status
from prometheus_client import REGISTRY, CollectorRegistry, Histogram
from structlog.testing import LogCapture

from pyprovlib._errors import PyprovlibError
from pyprovlib._logging import get_logger, log_quietly
from pyprovlib.csi._proto.csi import v1
from pyprovlib.csi._redact import Sanitized, scrub_secret_values
from pyprovlib.kube._clock import Clock, RealClock

__all__ = [
    "GO_STATUS_NAMES",
    "OPERATIONS_BUCKETS",
    "UNARY_METHODS",
    "CSICallError",
    "CSIConnection",
    "CSIConnectionLost",
    "CSIMetrics",
    "ConnectionOptions",
    "DriverNotReadyError",
    "Endpoint",
    "PluginCapabilities",
    "default_csi_metrics",
    "identified_driver",
    "parse_endpoint",
]

log = get_logger(__name__)
_stdlib_log = logging.getLogger(__name__)


def _call_lines_wanted() -> bool:
    """Whether a call's debug lines would reach anyone: pyprovlib's loggers drop a record when
    stdlib's level says so, unless ``structlog.testing.capture_logs`` is active (see
    :mod:`pyprovlib._logging`). Asked once per call, so a disabled line costs no record (the
    three lines of a call cost ~35 µs when built and dropped)."""
    if _stdlib_log.isEnabledFor(logging.DEBUG):
        return True
    if not structlog.is_configured():
        return False
    for processor in structlog.get_config()["processors"]:
        if isinstance(processor, LogCapture):
            return True
    return False


Resp = TypeVar("Resp", bound=betterproto2.Message)

OPERATIONS_BUCKETS: Final = (
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    15.0,
    25.0,
    50.0,
    120.0,
    300.0,
    600.0,
)
"""csi-lib-utils' buckets for ``csi_sidecar_operations_seconds``."""

GO_STATUS_NAMES: Final[dict[Status, str]] = {
    Status.OK: "OK",
    Status.CANCELLED: "Canceled",
    Status.UNKNOWN: "Unknown",
    Status.INVALID_ARGUMENT: "InvalidArgument",
    Status.DEADLINE_EXCEEDED: "DeadlineExceeded",
    Status.NOT_FOUND: "NotFound",
    Status.ALREADY_EXISTS: "AlreadyExists",
    Status.PERMISSION_DENIED: "PermissionDenied",
    Status.RESOURCE_EXHAUSTED: "ResourceExhausted",
    Status.FAILED_PRECONDITION: "FailedPrecondition",
    Status.ABORTED: "Aborted",
    Status.OUT_OF_RANGE: "OutOfRange",
    Status.UNIMPLEMENTED: "Unimplemented",
    Status.INTERNAL: "Internal",
    Status.UNAVAILABLE: "Unavailable",
    Status.DATA_LOSS: "DataLoss",
    Status.UNAUTHENTICATED: "Unauthenticated",
}
"""grpc-go's ``codes.Code.String()`` names, the values of the ``grpc_status_code`` label."""


class CSIMetrics:
    """The ``csi_sidecar_operations_seconds`` histogram, registered once per registry."""

    def __init__(self, registry: CollectorRegistry | None = REGISTRY) -> None:
        self.operations_seconds = Histogram(
            "operations_seconds",
            "Container Storage Interface operation duration with gRPC error code status total",
            ["driver_name", "method_name", "grpc_status_code"],
            subsystem="csi_sidecar",
            registry=registry,
            buckets=OPERATIONS_BUCKETS,
        )
        # prometheus_client's labelled children, kept: ``labels()`` validates and looks the
        # labels up under a lock on every call (~3 µs of the ~8 µs an observation costs).
        self._children: dict[tuple[str, str, Status], Any] = {}

    def observe(self, driver: str, method: str, status: Status, seconds: float) -> None:
        """Record one call."""
        key = (driver, method, status)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self.operations_seconds.labels(
                driver, method, GO_STATUS_NAMES[status]
            )
        child.observe(seconds)


_default_metrics: CSIMetrics | None = None


def default_csi_metrics() -> CSIMetrics:
    """The process-wide collectors in prometheus_client's default registry (created once)."""
    global _default_metrics  # noqa: PLW0603 - one registration per process, on first use
    if _default_metrics is None:
        _default_metrics = CSIMetrics()
    return _default_metrics


class CSICallError(PyprovlibError):
    """A CSI call failed: ``status`` is the gRPC code, ``message`` has no secrets in it.

    Its text is grpc-go's status error, as upstream's sidecars put it in events and logs:
    ``rpc error: code = ResourceExhausted desc = pool full`` (``method`` names the call).
    ``transport`` is True when the call never got an answer from the driver (socket missing,
    connection refused or lost); such errors carry ``Status.UNAVAILABLE``.
    """

    def __init__(self, method: str, status: Status, message: str, *, transport: bool = False):
        super().__init__(f"rpc error: code = {GO_STATUS_NAMES[status]} desc = {message}")
        self.method = method
        self.status = status
        self.message = message
        self.transport = transport


class DriverNotReadyError(PyprovlibError):
    """The driver did not become ready (or its socket did not appear) within the deadline."""


class CSIConnectionLost(PyprovlibError):
    """The connection to the driver was lost and the options say to give up (upstream exits)."""


@dataclass(frozen=True)
class Endpoint:
    """A parsed CSI address: a unix socket ``path``, or ``host`` and ``port``."""

    path: pathlib.Path | None = None
    host: str | None = None
    port: int | None = None

    def __str__(self) -> str:
        return f"unix://{self.path}" if self.path is not None else f"{self.host}:{self.port}"


def parse_endpoint(address: str) -> Endpoint:
    """Parse ``unix:///path``, ``unix:/path``, ``/path`` or ``host:port``."""
    if address.startswith("unix:"):
        rest = address.removeprefix("unix:")
        path = "/" + rest.lstrip("/") if rest.startswith("//") else rest
        if not path.startswith("/"):
            raise ValueError(f"CSI address {address!r}: a unix socket path must be absolute")
        return Endpoint(path=pathlib.Path(path))
    if address.startswith("/"):
        return Endpoint(path=pathlib.Path(address))
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"CSI address {address!r}: expected unix:///path, /path or host:port")
    return Endpoint(host=host.strip("[]"), port=int(port))


@dataclass(frozen=True)
class PluginCapabilities:
    """What GetPluginCapabilities reported."""

    services: frozenset[v1.PluginCapabilityServiceType] = frozenset()
    volume_expansion: frozenset[v1.PluginCapabilityVolumeExpansionType] = frozenset()

    @property
    def controller_service(self) -> bool:
        """The driver serves the Controller service."""
        return v1.PluginCapabilityServiceType.CONTROLLER_SERVICE in self.services

    @property
    def accessibility_constraints(self) -> bool:
        """The driver's volumes have topology (VOLUME_ACCESSIBILITY_CONSTRAINTS)."""
        return v1.PluginCapabilityServiceType.VOLUME_ACCESSIBILITY_CONSTRAINTS in self.services


@dataclass(frozen=True)
class ConnectionOptions:
    """How to connect, probe and call. Defaults follow external-provisioner."""

    timeout: float = 10.0
    """Per-call timeout in seconds (``--timeout``)."""
    connect_timeout: float | None = None
    """Give up waiting for the unix socket to appear after this long; None waits forever."""
    probe_timeout: float | None = None
    """Give up probing for readiness after this long; None probes forever (upstream)."""
    backoff_start: float = 1.0
    """First wait between connection or probe attempts (upstream probes every second)."""
    backoff_max: float = 10.0
    """Longest wait between attempts."""
    still_waiting_log_interval: float = 10.0
    """How often a wait for the socket logs that it is still waiting (upstream: 10 s)."""
    exit_on_connection_loss: bool = True
    """True: a lost connection makes :meth:`CSIConnection.monitor` raise
    :class:`CSIConnectionLost` so the process exits and is restarted, like upstream. False:
    the loss is logged, and the connection re-established once the driver is ready again."""


def _unary_methods() -> dict[str, tuple[type[betterproto2.Message], type[betterproto2.Message]]]:
    """Full method name → (request type, response type) of every unary-unary CSI method,
    read from the generated services' method tables."""
    bases: list[Any] = [
        v1.IdentityBase,
        v1.ControllerBase,
        v1.NodeBase,
        v1.GroupControllerBase,
        v1.SnapshotMetadataBase,
    ]
    table: dict[str, tuple[type[betterproto2.Message], type[betterproto2.Message]]] = {}
    for base in bases:
        for path, handler in base().__mapping__().items():
            if handler.cardinality is Cardinality.UNARY_UNARY:
                table[path] = (handler.request_type, handler.reply_type)
    return table


UNARY_METHODS: Final = _unary_methods()
"""Every unary CSI method: full name → (request type, response type)."""

_TRANSPORT_ERRORS: Final = (
    OSError,
    grpclib.exceptions.StreamTerminatedError,
    grpclib.exceptions.ProtocolError,
)


class CSIConnection:
    """One gRPC channel to a CSI driver, with the driver's identity once :meth:`open` returns.

    Use ``async with await CSIConnection.open(address) as conn`` or call :meth:`open` /
    :meth:`close`. Run :meth:`monitor` in a task the owner awaits, to notice a lost connection.
    """

    def __init__(
        self,
        address: str,
        options: ConnectionOptions | None = None,
        *,
        metrics: CSIMetrics | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.address = address
        self.endpoint = parse_endpoint(address)
        self.options = options or ConnectionOptions()
        self.metrics = metrics or default_csi_metrics()
        self.clock: Clock = clock or RealClock()
        self.driver_name = ""
        self.plugin_capabilities = PluginCapabilities()
        self.controller_capabilities: frozenset[v1.ControllerServiceCapabilityRpcType] = frozenset()
        self._channel: Channel | None = None
        # grpclib's method objects by full method name, made once per channel.
        self._methods: dict[str, UnaryUnaryMethod[Any, Any]] = {}
        self._lost = asyncio.Event()
        # Bumped whenever the driver is (again) known to answer: a call begun before that and
        # failing afterwards reports an outage already over, not a new one.
        self._epoch = 0
        self._log = log.bind(csi_address=str(self.endpoint))

    # -- lifecycle -------------------------------------------------------------------------

    @classmethod
    async def open(
        cls,
        address: str,
        options: ConnectionOptions | None = None,
        *,
        metrics: CSIMetrics | None = None,
        clock: Clock | None = None,
    ) -> CSIConnection:
        """Connect, wait until the driver is ready, read its name and capabilities.

        A driver that goes away between answering the probe and answering the identity calls
        (a restart during start-up) is waited for again instead of failing the start (upstream
        exits and relies on a restart, which backs off ever longer in a crash loop).
        """
        conn = cls(address, options, metrics=metrics, clock=clock)
        try:
            await conn.connect()
            while True:
                await conn.wait_ready()
                try:
                    await conn.identify()
                except CSICallError as exc:
                    if not exc.transport:
                        raise
                    conn._log.warning(
                        "lost the CSI driver while reading its identity; waiting for it again",
                        error=str(exc),
                    )
                    continue
                break
            conn._recovered()
        except BaseException:
            conn.close()
            raise
        return conn

    async def connect(self) -> None:
        """Wait for the unix socket to appear (see ``connect_timeout``), then set up grpclib's
        channel (it connects on the first call, and again on the first call after a loss)."""
        if self.endpoint.path is not None:
            await self._wait_for_socket(self.endpoint.path)
        self.close()
        if self.endpoint.path is not None:
            self._channel = Channel(path=str(self.endpoint.path))
        else:
            self._channel = Channel(self.endpoint.host, self.endpoint.port)

    @property
    def channel(self) -> Channel | None:
        """grpclib's channel to the driver (None before :meth:`connect` and after
        :meth:`close`), e.g. for a streaming method's stub; unary calls go through
        :meth:`call`, which times, logs and maps their errors."""
        return self._channel

    async def _wait_for_socket(self, path: pathlib.Path) -> None:
        started = self.clock.monotonic()
        last_log = started
        delay = min(0.05, self.options.backoff_start)
        if not path.is_socket():  # noqa: ASYNC240 - see below
            self._log.info("waiting for the CSI socket to appear", path=str(path))
        # A stat of a local socket path costs microseconds: not worth a thread per poll.
        while not path.is_socket():  # noqa: ASYNC240
            now = self.clock.monotonic()
            if (
                self.options.connect_timeout is not None
                and now - started >= self.options.connect_timeout
            ):
                raise DriverNotReadyError(
                    f"CSI socket {path} did not appear within {self.options.connect_timeout:g}s:"
                    " check --csi-address and that the driver container is running"
                )
            if now - last_log >= self.options.still_waiting_log_interval:
                self._log.warning("still waiting for the CSI socket", path=str(path))
                last_log = now
            await self.clock.sleep(delay)
            delay = min(delay * 2, self.options.backoff_max)

    def close(self) -> None:
        """Close the channel."""
        channel, self._channel = self._channel, None
        self._methods.clear()
        if channel is not None:
            channel.close()

    async def __aenter__(self) -> CSIConnection:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    async def wait_ready(self) -> None:
        """Probe until the driver reports ready (csi-lib-utils' ProbeForever, with backoff).

        Not ready, a timed-out probe and an unreachable driver are retried; any other error
        (e.g. Probe unimplemented) is final. ``probe_timeout`` bounds the whole wait.
        """
        started = self.clock.monotonic()
        delay = self.options.backoff_start
        attempt = 0
        while True:
            attempt += 1
            self._log.info("probing CSI driver for readiness", attempt=attempt)
            try:
                response = await self.probe()
            except CSICallError as exc:
                if exc.status not in (Status.DEADLINE_EXCEEDED, Status.UNAVAILABLE):
                    raise
                self._log.warning("CSI driver probe failed", attempt=attempt, error=str(exc))
            else:
                if response.ready is None or response.ready:
                    # An absent ``ready`` means ready (CSI spec: the field is optional).
                    self._log.info("CSI driver is ready", attempts=attempt)
                    return
                self._log.warning("CSI driver is not ready", attempt=attempt)
            elapsed = self.clock.monotonic() - started
            if self.options.probe_timeout is not None and elapsed >= self.options.probe_timeout:
                raise DriverNotReadyError(
                    f"CSI driver at {self.endpoint} not ready after {attempt} probes"
                    f" ({elapsed:.1f}s)"
                )
            await self.clock.sleep(delay)
            delay = min(delay * 2, self.options.backoff_max)

    async def identify(self) -> None:
        """Read the driver name and its plugin and controller capabilities."""
        info = await self.call("/csi.v1.Identity/GetPluginInfo", v1.GetPluginInfoRequest())
        if not info.name:
            raise CSICallError(
                "/csi.v1.Identity/GetPluginInfo", Status.INVALID_ARGUMENT, "driver name is empty"
            )
        self.driver_name = info.name
        self._log = self._log.bind(driver=info.name)
        plugin = await self.call(
            "/csi.v1.Identity/GetPluginCapabilities", v1.GetPluginCapabilitiesRequest()
        )
        services: set[v1.PluginCapabilityServiceType] = set()
        expansion: set[v1.PluginCapabilityVolumeExpansionType] = set()
        for cap in plugin.capabilities:
            if cap.service is not None:
                services.add(cap.service.type)
            if cap.volume_expansion is not None:
                expansion.add(cap.volume_expansion.type)
        self.plugin_capabilities = PluginCapabilities(frozenset(services), frozenset(expansion))
        if self.plugin_capabilities.controller_service:
            ctrl = await self.call(
                "/csi.v1.Controller/ControllerGetCapabilities",
                v1.ControllerGetCapabilitiesRequest(),
            )
            self.controller_capabilities = frozenset(
                c.rpc.type for c in ctrl.capabilities if c.rpc is not None
            )
        self._log.info(
            "CSI driver identified",
            vendor_version=info.vendor_version,
            plugin_capabilities=sorted(s.name for s in services),
            controller_capabilities=sorted(c.name for c in self.controller_capabilities),
        )

    async def monitor(self) -> None:
        """Watch the connection until cancelled: react when a call found it lost.

        As upstream, an idle connection is not probed: after start-up (:meth:`open` probes
        until ready, csi-lib-utils' ProbeForever) a lost connection is found by the calls,
        which fail with ``Status.UNAVAILABLE`` and ``transport=True``. With
        ``exit_on_connection_loss`` the loss then raises :class:`CSIConnectionLost` (upstream
        exits); otherwise it is logged and the driver probed (with backoff) until it answers
        again. A driver that restarted while the connection was idle is reconnected to by the
        next call (grpclib reconnects a channel whose connection closed), with no loss seen.
        """
        while True:
            await self._lost.wait()
            self._log.error("lost connection to the CSI driver")
            if self.options.exit_on_connection_loss:
                raise CSIConnectionLost(f"lost connection to the CSI driver at {self.endpoint}")
            # The probes of this wait fail while the driver is away and mark the connection
            # lost again; only once the driver answers is the outage over.
            await self.wait_ready()
            self._recovered()
            self._log.info("reconnected to the CSI driver")

    @property
    def lost(self) -> bool:
        """True from a transport failure until the monitor has reconnected."""
        return self._lost.is_set()

    def _recovered(self) -> None:
        """The driver answers: forget the outage, and failures of calls begun during it."""
        self._epoch += 1
        self._lost.clear()

    def _mark_lost(self, epoch: int) -> None:
        if epoch == self._epoch:
            self._lost.set()

    # -- calls -----------------------------------------------------------------------------

    async def call(self, method: str, request: Any, *, call_timeout: float | None = None) -> Any:
        """Call ``method`` (``/csi.v1.Service/Method``) with ``request``; the typed wrappers
        below are the usual entry points."""
        return await self._invoke(method, request, call_timeout)

    async def _invoke(
        self, method: str, request: betterproto2.Message, call_timeout: float | None
    ) -> Any:
        stub_method = self._methods.get(method)
        if stub_method is None:
            if self._channel is None:
                raise CSICallError(method, Status.UNAVAILABLE, "not connected", transport=True)
            stub_method = self._methods[method] = self._method(self._channel, method)
        limit = self.options.timeout if call_timeout is None else call_timeout
        epoch = self._epoch
        started = self.clock.monotonic()
        lines = _call_lines_wanted()
        if lines:
            log_quietly(self._log, "debug", "csi call", method=method, request=Sanitized(request))
        status = Status.OK
        try:
            response = await stub_method(request, timeout=limit)
        except grpclib.exceptions.GRPCError as exc:
            status = exc.status
            raise CSICallError(
                method, status, scrub_secret_values(exc.message or "", request)
            ) from None
        except TimeoutError:
            status = Status.DEADLINE_EXCEEDED
            raise CSICallError(method, status, f"no answer within {limit:g}s") from None
        except _TRANSPORT_ERRORS as exc:
            status = Status.UNAVAILABLE
            self._mark_lost(epoch)
            text = scrub_secret_values(f"{type(exc).__name__}: {exc}", request)
            raise CSICallError(
                method, status, f"connection to the CSI driver failed: {text}", transport=True
            ) from None
        finally:
            seconds = self.clock.monotonic() - started
            self.metrics.observe(self.driver_name, method, status, seconds)
            if lines and status is not Status.OK:
                log_quietly(
                    self._log,
                    "debug",
                    "csi call failed",
                    method=method,
                    code=GO_STATUS_NAMES[status],
                    seconds=seconds,
                )
        # Logging is no part of the answer: it can neither raise into it nor change it.
        if lines:
            log_quietly(
                self._log,
                "debug",
                "csi call done",
                method=method,
                response=Sanitized(response),
                seconds=seconds,
            )
        return response

    @staticmethod
    def _method(channel: Channel, method: str) -> UnaryUnaryMethod[Any, Any]:
        """grpclib's callable for the unary ``method`` on ``channel``."""
        try:
            request_type, reply_type = UNARY_METHODS[method]
        except KeyError:
            raise ValueError(
                f"{method!r} is not a unary CSI method: use connection.channel with the "
                "generated stub for streaming methods"
            ) from None
        return UnaryUnaryMethod(channel, method, request_type, reply_type)

    async def probe(self) -> v1.ProbeResponse:
        """Identity.Probe."""
        result: v1.ProbeResponse = await self.call("/csi.v1.Identity/Probe", v1.ProbeRequest())
        return result

    async def create_volume(
        self, request: v1.CreateVolumeRequest, *, call_timeout: float | None = None
    ) -> v1.CreateVolumeResponse:
        """Controller.CreateVolume."""
        result: v1.CreateVolumeResponse = await self.call(
            "/csi.v1.Controller/CreateVolume", request, call_timeout=call_timeout
        )
        return result

    async def delete_volume(
        self, request: v1.DeleteVolumeRequest, *, call_timeout: float | None = None
    ) -> v1.DeleteVolumeResponse:
        """Controller.DeleteVolume."""
        result: v1.DeleteVolumeResponse = await self.call(
            "/csi.v1.Controller/DeleteVolume", request, call_timeout=call_timeout
        )
        return result


def identified_driver(connection: CSIConnection) -> str:
    """The driver name of ``connection``, for a controller piece built on it; raises
    :class:`ValueError` while the driver has not said its name (GetPluginInfo)."""
    if not connection.driver_name:
        raise ValueError(
            f"the CSI connection to {connection.endpoint} has not identified its driver yet: "
            "open it with CSIConnection.open"
        )
    return connection.driver_name

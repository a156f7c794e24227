"""CSIConnection against the Python test driver over a real unix socket."""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
from collections.abc import AsyncIterator, Callable

import pytest
import structlog
from csi_driver import DRIVER_NAME, DriverState, Fault, serve_driver
from grpclib.const import Status
from prometheus_client import CollectorRegistry

from pyprovlib import testing
from pyprovlib.csi._connection import (
    ConnectionOptions,
    CSICallError,
    CSIConnection,
    CSIConnectionLost,
    CSIMetrics,
    DriverNotReadyError,
    parse_endpoint,
)
from pyprovlib.csi._proto.csi import v1
from pyprovlib.csi._server import CSIServer, IdentityService
from pyprovlib.kube._clock import FakeClock

FAST = ConnectionOptions(backoff_start=0.01, backoff_max=0.05)


async def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    await testing.eventually(predicate, timeout=timeout, message="condition")


def sample(registry: CollectorRegistry, method: str, code: str) -> float | None:
    return registry.get_sample_value(
        "csi_sidecar_operations_seconds_count",
        {"driver_name": DRIVER_NAME, "method_name": method, "grpc_status_code": code},
    )


CREATE = v1.CreateVolumeRequest(
    name="pvc-1",
    volume_capabilities=[v1.VolumeCapability(block=v1.VolumeCapabilityBlockVolume())],
)


def probes(registry: CollectorRegistry) -> float:
    """Probe calls of every outcome, whatever the driver name (empty before it is known)."""
    return sum(
        sample.value
        for metric in registry.collect()
        for sample in metric.samples
        if sample.name == "csi_sidecar_operations_seconds_count"
        and sample.labels["method_name"] == "/csi.v1.Identity/Probe"
    )


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("unix:///run/csi/socket", "unix:///run/csi/socket"),
        ("unix:/run/csi/socket", "unix:///run/csi/socket"),
        ("/run/csi/socket", "unix:///run/csi/socket"),
        ("localhost:10000", "localhost:10000"),
        ("[::1]:10000", "::1:10000"),
    ],
)
def test_parse_endpoint(address: str, expected: str) -> None:
    assert str(parse_endpoint(address)) == expected


@pytest.mark.parametrize("address", ["unix:relative/sock", "csi.sock", "host:port"])
def test_parse_endpoint_rejects(address: str) -> None:
    with pytest.raises(ValueError, match="CSI address"):
        parse_endpoint(address)


async def test_socket_appearing_late_is_waited_for(sock_dir: pathlib.Path) -> None:
    registry = CollectorRegistry()
    with structlog.testing.capture_logs() as logs:
        opening = asyncio.create_task(
            CSIConnection.open(
                f"unix://{sock_dir / 'csi.sock'}", FAST, metrics=CSIMetrics(registry)
            )
        )
        await wait_for(
            lambda: any(e["event"] == "waiting for the CSI socket to appear" for e in logs)
        )
    assert not opening.done()
    async with serve_driver(sock_dir, topology=True):
        conn = await asyncio.wait_for(opening, 5)
        try:
            assert conn.driver_name == DRIVER_NAME
            assert conn.plugin_capabilities.controller_service
            assert conn.plugin_capabilities.accessibility_constraints
            assert (
                v1.ControllerServiceCapabilityRpcType.CLONE_VOLUME in conn.controller_capabilities
            )
            # Like csi-lib-utils, calls made before the name is known carry an empty driver_name.
            assert sample(registry, "/csi.v1.Controller/ControllerGetCapabilities", "OK") == 1
        finally:
            conn.close()


async def test_socket_never_appearing_is_a_clear_error(sock_dir: pathlib.Path) -> None:
    path = sock_dir / "missing.sock"
    options = ConnectionOptions(connect_timeout=0.2, backoff_start=0.01)
    with pytest.raises(DriverNotReadyError, match=str(path)):
        await CSIConnection.open(f"unix://{path}", options, metrics=CSIMetrics(None))


async def test_probes_until_ready_logging_each_attempt(sock_dir: pathlib.Path) -> None:
    state = DriverState(ready=False)
    state.fail("Probe", Fault(status=Status.UNAVAILABLE, message="warming up"))
    async with serve_driver(sock_dir, state=state):
        with structlog.testing.capture_logs() as logs:
            opening = asyncio.create_task(
                CSIConnection.open(str(sock_dir / "csi.sock"), FAST, metrics=CSIMetrics(None))
            )
            await wait_for(lambda: sum(e["event"] == "CSI driver is not ready" for e in logs) >= 2)
            assert not opening.done()
            state.ready = True
            conn = await asyncio.wait_for(opening, 5)
            conn.close()
    events = [e["event"] for e in logs]
    assert "CSI driver probe failed" in events
    assert events.count("probing CSI driver for readiness") >= 4
    assert "CSI driver is ready" in events


async def test_driver_never_ready_gives_up_at_probe_deadline(sock_dir: pathlib.Path) -> None:
    options = ConnectionOptions(probe_timeout=0.3, backoff_start=0.01, backoff_max=0.05)
    async with serve_driver(sock_dir, state=DriverState(ready=False)):
        with pytest.raises(DriverNotReadyError, match="not ready after"):
            await CSIConnection.open(str(sock_dir / "csi.sock"), options, metrics=CSIMetrics(None))


async def test_probe_final_error_is_not_retried(sock_dir: pathlib.Path) -> None:
    state = DriverState()
    state.fail("Probe", Fault(status=Status.FAILED_PRECONDITION, message="bad config"))
    async with serve_driver(sock_dir, state=state):
        with pytest.raises(CSICallError) as info:
            await CSIConnection.open(str(sock_dir / "csi.sock"), FAST, metrics=CSIMetrics(None))
    assert info.value.status is Status.FAILED_PRECONDITION
    assert "bad config" in str(info.value)


async def test_call_timeout_metrics_and_secret_scrubbing(sock_dir: pathlib.Path) -> None:
    registry = CollectorRegistry()
    async with serve_driver(sock_dir) as (state, _):
        conn = await CSIConnection.open(
            str(sock_dir / "csi.sock"), FAST, metrics=CSIMetrics(registry)
        )
        try:
            state.fail("CreateVolume", Fault(delay=2.0))
            request = v1.CreateVolumeRequest(
                name="pvc-1",
                volume_capabilities=[v1.VolumeCapability(block=v1.VolumeCapabilityBlockVolume())],
                secrets={"password": "s3cr3t-value"},
            )
            with pytest.raises(CSICallError) as info:
                await conn.create_volume(request, call_timeout=0.1)
            assert info.value.status is Status.DEADLINE_EXCEEDED
            method = "/csi.v1.Controller/CreateVolume"
            assert sample(registry, method, "DeadlineExceeded") == 1

            # A driver that echoes the request's secret in its error does not leak it.
            state.fail(
                "CreateVolume",
                Fault(status=Status.INVALID_ARGUMENT, message="bad password s3cr3t-value"),
            )
            with pytest.raises(CSICallError) as info:
                await conn.create_volume(request)
            assert info.value.status is Status.INVALID_ARGUMENT
            assert "s3cr3t-value" not in str(info.value)
            assert "***stripped***" in info.value.message
            assert sample(registry, method, "InvalidArgument") == 1

            response = await conn.create_volume(request)
            assert response.volume is not None
            assert sample(registry, method, "OK") == 1
        finally:
            conn.close()


@contextlib.asynccontextmanager
async def monitored(conn: CSIConnection) -> AsyncIterator[asyncio.Task[None]]:
    """``conn``'s monitor running for the block; then cancelled, and ``conn`` closed."""
    monitor = asyncio.create_task(conn.monitor())
    try:
        yield monitor
    finally:
        monitor.cancel()
        with pytest.raises(asyncio.CancelledError):
            await monitor
        conn.close()


async def test_idle_connection_is_not_probed(sock_dir: pathlib.Path) -> None:
    # Issue 18: an idle sidecar called Probe every second. As upstream, Probe runs until ready
    # at start-up only; the monitor waits for a call to find the connection lost. Time moves
    # on both clocks (the injected one by an hour, the loop's by more than main's 1 s
    # interval), and the driver sees no further Probe.
    registry = CollectorRegistry()
    clock = FakeClock()
    async with serve_driver(sock_dir):
        conn = await CSIConnection.open(
            str(sock_dir / "csi.sock"), metrics=CSIMetrics(registry), clock=clock
        )
        async with monitored(conn) as monitor:
            assert probes(registry) == 1
            loop = asyncio.get_running_loop()
            until = loop.time() + 1.5
            while loop.time() < until or clock.monotonic() < 3600:
                await clock.advance(120)
                await asyncio.sleep(0.05)
            assert probes(registry) == 1
            assert not monitor.done()


async def test_lost_connection_found_by_a_call_exits_when_configured(
    sock_dir: pathlib.Path,
) -> None:
    async with serve_driver(sock_dir) as (_, server):
        conn = await CSIConnection.open(str(sock_dir / "csi.sock"), FAST, metrics=CSIMetrics(None))
        monitor = asyncio.create_task(conn.monitor())
        await server.stop()
        with pytest.raises(CSICallError) as info:
            await conn.create_volume(CREATE)
        assert info.value.transport
        assert str(info.value).startswith("rpc error: code = Unavailable desc = ")
        with pytest.raises(CSIConnectionLost):
            await asyncio.wait_for(monitor, 5)
        conn.close()


async def test_driver_restart_while_idle_is_recovered_by_the_next_call(
    sock_dir: pathlib.Path,
) -> None:
    # grpclib reconnects a channel whose connection closed: the driver restarted between
    # calls answers the next one, even where a loss means exit.
    state = DriverState()
    async with serve_driver(sock_dir, state=state) as (_, server):
        conn = await CSIConnection.open(str(sock_dir / "csi.sock"), FAST, metrics=CSIMetrics(None))
        async with monitored(conn) as monitor:
            await server.stop()
            async with serve_driver(sock_dir, state=state):
                response = await conn.create_volume(CREATE)
                assert response.volume is not None
                assert not conn.lost
                assert not monitor.done()


async def test_lost_connection_reconnects_when_configured(sock_dir: pathlib.Path) -> None:
    options = ConnectionOptions(backoff_start=0.01, backoff_max=0.05, exit_on_connection_loss=False)
    registry = CollectorRegistry()
    state = DriverState()
    async with serve_driver(sock_dir, state=state) as (_, server):
        conn = await CSIConnection.open(
            str(sock_dir / "csi.sock"), options, metrics=CSIMetrics(registry)
        )
        with structlog.testing.capture_logs() as logs:
            async with monitored(conn):
                await server.stop()
                with pytest.raises(CSICallError) as info:
                    await conn.create_volume(CREATE)
                assert info.value.transport
                assert info.value.status is Status.UNAVAILABLE
                assert conn.lost
                # While lost, the monitor probes (with backoff) until the driver answers.
                await wait_for(
                    lambda: (sample(registry, "/csi.v1.Identity/Probe", "Unavailable") or 0) >= 2
                )
                async with serve_driver(sock_dir, state=state):
                    await wait_for(lambda: not conn.lost)
                    response = await conn.create_volume(CREATE)
                    assert response.volume is not None
    events = [e["event"] for e in logs]
    # One outage is one loss and one reconnect (regression: the failing probes of the wait
    # marked the connection lost again after it had cleared).
    assert events.count("lost connection to the CSI driver") == 1, events
    assert events.count("reconnected to the CSI driver") == 1, events


async def test_tcp_endpoint() -> None:
    from grpclib.server import Server

    from pyprovlib.csi._server import IdentityService

    server = Server([IdentityService("tcp.driver", "1")])
    await server.start("127.0.0.1", 0)
    try:
        listening = server._server
        assert isinstance(listening, asyncio.Server)
        port = listening.sockets[0].getsockname()[1]
        conn = await CSIConnection.open(f"127.0.0.1:{port}", FAST, metrics=CSIMetrics(None))
        try:
            assert conn.driver_name == "tcp.driver"
            assert not conn.plugin_capabilities.controller_service
            assert conn.controller_capabilities == frozenset()
        finally:
            conn.close()
    finally:
        server.close()
        await server.wait_closed()


def test_default_metrics_are_registered_once() -> None:
    from prometheus_client import REGISTRY

    from pyprovlib.csi._connection import default_csi_metrics

    first = CSIConnection("unix:///nonexistent/a.sock").metrics
    second = CSIConnection("unix:///nonexistent/b.sock").metrics
    assert first is second is default_csi_metrics()
    names = {m.name for m in REGISTRY.collect()}
    assert "csi_sidecar_operations_seconds" in names


class VanishingIdentity(IdentityService):
    """An Identity whose first GetPluginInfo never answers: the test stops the server under
    it, as a driver restarting right after it first reported ready."""

    def __init__(self) -> None:
        super().__init__(DRIVER_NAME, "1.0.0")
        self.cut = asyncio.Event()

    async def get_plugin_info(self, message: v1.GetPluginInfoRequest) -> v1.GetPluginInfoResponse:
        if not self.cut.is_set():
            self.cut.set()
            await asyncio.Event().wait()  # cancelled when the server stops
        return await super().get_plugin_info(message)


async def test_driver_restarting_while_identified_is_waited_for(sock_dir: pathlib.Path) -> None:
    # Regression: a driver going away between answering the probe and answering
    # GetPluginInfo made CSIConnection.open fail with UNAVAILABLE (a sidecar start failing
    # whenever the driver restarts at that moment).
    identity = VanishingIdentity()
    server = CSIServer([identity], f"unix://{sock_dir / 'csi.sock'}")
    await server.start()
    try:
        with structlog.testing.capture_logs() as logs:
            opening = asyncio.create_task(
                CSIConnection.open(str(sock_dir / "csi.sock"), FAST, metrics=CSIMetrics(None))
            )
            await asyncio.wait_for(identity.cut.wait(), 5)
            await server.stop()
            await wait_for(
                lambda: any(e["event"] == "CSI driver probe failed" for e in logs) or opening.done()
            )
            assert not opening.done(), opening
            await server.start()
            conn = await asyncio.wait_for(opening, 5)
        try:
            assert conn.driver_name == DRIVER_NAME
            assert not conn.lost
        finally:
            conn.close()
        events = [e["event"] for e in logs]
        assert "lost the CSI driver while reading its identity; waiting for it again" in events
    finally:
        await server.stop()

"""The lean gRPC client (pyprovlib.csi.grpc_client) against the CSI server kit, an h2-based
server (an independent HTTP/2 implementation that rejects protocol violations) and a raw-frame
fake server scripted per test for the edge cases: errors, GOAWAY, RST_STREAM, PING,
CONTINUATION, padding, SETTINGS changes, lost connections, deadlines."""

from __future__ import annotations

import asyncio
import contextlib
import json
import pathlib
import struct
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import csi_driver
import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
import hpack
import pytest
from csi_driver import DRIVER_NAME, DriverState, Fault, serve_driver
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from prometheus_client import CollectorRegistry

from pyprovlib.csi._proto.csi import v1
from pyprovlib.csi.connection import (
    UNARY_METHODS,
    ConnectionOptions,
    CSICallError,
    CSIConnection,
    CSIMetrics,
)
from pyprovlib.csi.grpc_client import (
    USER_AGENT,
    ConnectionTerminatedError,
    GrpcClient,
    encode_grpc_timeout,
)
from pyprovlib.csi.server import CSIError, CSIServer, NodeService

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY = range(8)
WINDOW_UPDATE, CONTINUATION = 8, 9
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
S_MAX_CONCURRENT, S_INITIAL_WINDOW, S_MAX_FRAME = 3, 4, 5
NO_ERROR, PROTOCOL_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = 0, 1, 7, 8, 9

CREATE = "/csi.v1.Controller/CreateVolume"
PROBE = "/csi.v1.Identity/Probe"


async def wait_for(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.005)


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    size = len(payload)
    return struct.pack(">BHBBI", size >> 16, size & 0xFFFF, kind, flags, stream_id) + payload


def message(payload: bytes, flag: int = 0) -> bytes:
    return struct.pack(">BI", flag, len(payload)) + payload


# -- the raw-frame fake server -----------------------------------------------------------------


@dataclass
class Request:
    stream_id: int
    headers: list[tuple[str, str]]
    body: bytes

    @property
    def message(self) -> bytes:
        flag, length = struct.unpack(">BI", self.body[:5])
        assert flag == 0
        assert len(self.body) == 5 + length
        return self.body[5:]


@dataclass
class Peer:
    """One client connection, driven frame by frame by the test."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    encoder: hpack.Encoder = field(default_factory=hpack.Encoder)
    decoder: hpack.Decoder = field(default_factory=hpack.Decoder)
    frames: list[tuple[int, int, int, bytes]] = field(default_factory=list)
    partial: dict[int, tuple[list[tuple[str, str]], bytearray]] = field(default_factory=dict)
    done: list[Request] = field(default_factory=list)

    def send(self, kind: int, flags: int, stream_id: int, payload: bytes = b"") -> None:
        self.writer.write(frame(kind, flags, stream_id, payload))

    def block(self, headers: list[tuple[str, str]]) -> bytes:
        return self.encoder.encode(headers)

    def send_headers(
        self, stream_id: int, headers: list[tuple[str, str]], *, end_stream: bool = False
    ) -> None:
        flags = END_HEADERS | (END_STREAM if end_stream else 0)
        self.send(HEADERS, flags, stream_id, self.block(headers))

    def respond(
        self,
        stream_id: int,
        payload: bytes | None,
        *,
        status: int = 0,
        text: str | None = None,
    ) -> None:
        self.send_headers(stream_id, [(":status", "200"), ("content-type", "application/grpc")])
        if payload is not None:
            body = message(payload)
            for start in range(0, len(body), 16_384):
                self.send(DATA, 0, stream_id, body[start : start + 16_384])
        trailers = [("grpc-status", str(status))]
        if text is not None:
            trailers.append(("grpc-message", text))
        self.send_headers(stream_id, trailers, end_stream=True)

    async def handshake(self, settings: dict[int, int] | None = None) -> None:
        assert await self.reader.readexactly(24) == PREFACE
        payload = b"".join(struct.pack(">HI", k, v) for k, v in (settings or {}).items())
        self.send(SETTINGS, 0, 0, payload)

    async def frame(self) -> tuple[int, int, int, bytes]:
        header = await self.reader.readexactly(9)
        high, low, kind, flags, stream_id = struct.unpack(">BHBBI", header)
        payload = await self.reader.readexactly((high << 16) | low)
        frame = (kind, flags, stream_id & 0x7FFFFFFF, payload)
        self.frames.append(frame)
        return frame

    async def until(self, kind: int, stream_id: int | None = None) -> tuple[int, int, int, bytes]:
        """The next frame of ``kind`` (on ``stream_id``), requests seen on the way kept."""
        while True:
            frame = await self.frame()
            self._track(frame)
            if frame[0] == kind and (stream_id is None or frame[2] == stream_id):
                return frame

    def _track(self, frame: tuple[int, int, int, bytes]) -> None:
        kind, flags, stream_id, payload = frame
        if kind == HEADERS:
            assert flags & END_HEADERS, "the client's header blocks fit in one frame"
            decoded = [(str(n), str(v)) for n, v in self.decoder.decode(payload)]
            self.partial[stream_id] = (decoded, bytearray())
        elif kind == DATA:
            self.partial[stream_id][1].extend(payload)
        if kind in (HEADERS, DATA) and flags & END_STREAM:
            headers, body = self.partial.pop(stream_id)
            self.done.append(Request(stream_id, headers, bytes(body)))

    async def request(self) -> Request:
        """The next complete request (HEADERS and DATA up to END_STREAM)."""
        while not self.done:
            self._track(await self.frame())
        return self.done.pop(0)

    def sent(self, kind: int) -> list[tuple[int, int, int, bytes]]:
        return [f for f in self.frames if f[0] == kind]

    async def eof(self) -> None:
        """Read until the client closes the connection."""
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                await self.frame()


class FakeServer:
    """A unix-socket server handing each connection to the test as a :class:`Peer`."""

    def __init__(self, path: pathlib.Path) -> None:
        self.path = path
        self.peers: asyncio.Queue[Peer] = asyncio.Queue()
        self.server: asyncio.AbstractServer | None = None
        self.writers: list[asyncio.StreamWriter] = []

    async def __aenter__(self) -> FakeServer:
        async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.writers.append(writer)
            await self.peers.put(Peer(reader, writer))

        self.server = await asyncio.start_unix_server(accepted, path=str(self.path))
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        for writer in self.writers:
            writer.close()
        await self.server.wait_closed()

    async def accept(self, settings: dict[int, int] | None = None) -> Peer:
        peer = await asyncio.wait_for(self.peers.get(), 5)
        await peer.handshake(settings)
        return peer


@pytest.fixture
async def fake(sock_dir: pathlib.Path) -> AsyncIterator[FakeServer]:
    async with FakeServer(sock_dir / "fake.sock") as server:
        yield server


@contextlib.asynccontextmanager
async def client_for(path: pathlib.Path, **kwargs: Any) -> AsyncIterator[GrpcClient]:
    client = GrpcClient(path=str(path), **kwargs)
    try:
        yield client
    finally:
        client.close()


Probe = v1.ProbeRequest
READY = bytes(v1.ProbeResponse(ready=True))


def probe(client: GrpcClient, timeout: float | None = 5.0) -> asyncio.Task[v1.ProbeResponse]:
    return asyncio.create_task(client.unary(PROBE, Probe(), v1.ProbeResponse, timeout=timeout))


async def failure(task: asyncio.Task[Any]) -> BaseException:
    with pytest.raises(BaseException) as info:  # noqa: PT011 - the caller checks the type
        await asyncio.wait_for(task, 5)
    return info.value


# -- against the CSI server kit ------------------------------------------------------------------


class FullController(csi_driver.TestController):
    """The test driver's controller plus the other unary RPCs the sidecars call."""

    async def controller_publish_volume(
        self, message: v1.ControllerPublishVolumeRequest
    ) -> v1.ControllerPublishVolumeResponse:
        if message.volume_id == "missing":
            raise CSIError(Status.NOT_FOUND, "volume missing: 100% gone, naïve")
        return v1.ControllerPublishVolumeResponse(
            publish_context={"node": message.node_id, "ro": str(message.readonly)}
        )

    async def controller_unpublish_volume(
        self, message: v1.ControllerUnpublishVolumeRequest
    ) -> v1.ControllerUnpublishVolumeResponse:
        return v1.ControllerUnpublishVolumeResponse()

    async def controller_expand_volume(
        self, message: v1.ControllerExpandVolumeRequest
    ) -> v1.ControllerExpandVolumeResponse:
        required = message.capacity_range.required_bytes if message.capacity_range else 0
        return v1.ControllerExpandVolumeResponse(
            capacity_bytes=required, node_expansion_required=True
        )

    async def list_volumes(self, message: v1.ListVolumesRequest) -> v1.ListVolumesResponse:
        return v1.ListVolumesResponse(
            entries=[
                v1.ListVolumesResponseEntry(
                    volume=v1.Volume(volume_id=v.volume_id, capacity_bytes=v.capacity),
                    status=v1.ListVolumesResponseVolumeStatus(published_node_ids=["node-1"]),
                )
                for v in self.state.volumes.values()
            ],
            next_token="",
        )

    async def get_capacity(self, message: v1.GetCapacityRequest) -> v1.GetCapacityResponse:
        return v1.GetCapacityResponse(available_capacity=1 << 40)

    async def controller_get_volume(
        self, message: v1.ControllerGetVolumeRequest
    ) -> v1.ControllerGetVolumeResponse:
        return v1.ControllerGetVolumeResponse(volume=v1.Volume(volume_id=message.volume_id))

    async def controller_modify_volume(
        self, message: v1.ControllerModifyVolumeRequest
    ) -> v1.ControllerModifyVolumeResponse:
        return v1.ControllerModifyVolumeResponse()

    async def validate_volume_capabilities(
        self, message: v1.ValidateVolumeCapabilitiesRequest
    ) -> v1.ValidateVolumeCapabilitiesResponse:
        return v1.ValidateVolumeCapabilitiesResponse(
            confirmed=v1.ValidateVolumeCapabilitiesResponseConfirmed(
                volume_capabilities=message.volume_capabilities
            )
        )

    async def create_volume(self, message: v1.CreateVolumeRequest) -> v1.CreateVolumeResponse:
        response = await super().create_volume(message)
        if "echo" in message.parameters:  # large messages both ways
            assert response.volume is not None
            response.volume.volume_context = {"echo": message.parameters["echo"] * 2}
        return response


@contextlib.asynccontextmanager
async def full_driver(
    directory: pathlib.Path, **server_args: Any
) -> AsyncIterator[tuple[DriverState, CSIServer]]:
    state = DriverState()
    caps = v1.ControllerServiceCapabilityRpcType
    controller = FullController(state, topology=False)
    controller.capabilities = controller.capabilities | {
        caps.PUBLISH_UNPUBLISH_VOLUME,
        caps.EXPAND_VOLUME,
        caps.LIST_VOLUMES,
        caps.LIST_VOLUMES_PUBLISHED_NODES,
        caps.GET_CAPACITY,
        caps.GET_VOLUME,
        caps.MODIFY_VOLUME,
    }
    node = NodeService("node-1")
    server = CSIServer(
        [csi_driver.TestIdentity(state, topology=False), controller, node],
        f"unix://{directory / 'csi.sock'}",
        **server_args,
    )
    async with server:
        yield state, server


def test_unary_method_table_covers_the_sidecars_calls() -> None:
    for method in (
        "/csi.v1.Identity/GetPluginInfo",
        "/csi.v1.Identity/GetPluginCapabilities",
        "/csi.v1.Identity/Probe",
        "/csi.v1.Controller/ControllerGetCapabilities",
        "/csi.v1.Controller/CreateVolume",
        "/csi.v1.Controller/DeleteVolume",
        "/csi.v1.Controller/ControllerPublishVolume",
        "/csi.v1.Controller/ControllerUnpublishVolume",
        "/csi.v1.Controller/ControllerExpandVolume",
        "/csi.v1.Controller/ControllerModifyVolume",
        "/csi.v1.Controller/ListVolumes",
        "/csi.v1.Controller/CreateSnapshot",
        "/csi.v1.Controller/DeleteSnapshot",
        "/csi.v1.Node/NodeGetInfo",
    ):
        assert method in UNARY_METHODS
    assert UNARY_METHODS[CREATE] == (v1.CreateVolumeRequest, v1.CreateVolumeResponse)
    # Streaming methods stay on grpclib.
    assert "/csi.v1.SnapshotMetadata/GetMetadataAllocated" not in UNARY_METHODS


def test_grpc_timeout_encoding() -> None:
    assert encode_grpc_timeout(10) == "10000000u"
    assert encode_grpc_timeout(0.05) == "50000000n"
    assert encode_grpc_timeout(0.5) == "500000u"
    assert encode_grpc_timeout(3600) == "3600000m"
    assert encode_grpc_timeout(200_000) == "200000S"
    assert encode_grpc_timeout(0) == "0n"
    assert encode_grpc_timeout(-1) == "0n"


@pytest.mark.parametrize("grpc_client", ["lean", "grpclib"])
async def test_every_sidecar_unary_call_through_the_connection(
    sock_dir: pathlib.Path, grpc_client: str
) -> None:
    registry = CollectorRegistry()
    options = ConnectionOptions(grpc_client=grpc_client)  # type: ignore[arg-type]
    async with (
        full_driver(sock_dir) as (state, server),
        await CSIConnection.open(server.endpoint, options, metrics=CSIMetrics(registry)) as conn,
    ):
        assert conn.driver_name == DRIVER_NAME
        assert v1.ControllerServiceCapabilityRpcType.GET_CAPACITY in conn.controller_capabilities
        capability = v1.VolumeCapability(
            mount=v1.VolumeCapabilityMountVolume(fs_type="ext4"),
            access_mode=v1.VolumeCapabilityAccessMode(
                mode=v1.VolumeCapabilityAccessModeMode.SINGLE_NODE_WRITER
            ),
        )
        created = await conn.create_volume(
            v1.CreateVolumeRequest(
                name="pvc-1",
                capacity_range=v1.CapacityRange(required_bytes=5 << 20),
                volume_capabilities=[capability],
                secrets={"password": "s3cret"},
            )
        )
        assert created.volume is not None
        volume_id = created.volume.volume_id
        assert created.volume.capacity_bytes == 5 << 20
        assert state.requests("CreateVolume")[0].secrets == {"password": "s3cret"}  # type: ignore[attr-defined]
        calls: list[tuple[str, Any, Any]] = [
            (
                "/csi.v1.Controller/ControllerPublishVolume",
                v1.ControllerPublishVolumeRequest(
                    volume_id=volume_id, node_id="node-1", volume_capability=capability
                ),
                v1.ControllerPublishVolumeResponse(
                    publish_context={"node": "node-1", "ro": "False"}
                ),
            ),
            (
                "/csi.v1.Controller/ControllerExpandVolume",
                v1.ControllerExpandVolumeRequest(
                    volume_id=volume_id, capacity_range=v1.CapacityRange(required_bytes=1 << 30)
                ),
                v1.ControllerExpandVolumeResponse(
                    capacity_bytes=1 << 30, node_expansion_required=True
                ),
            ),
            (
                "/csi.v1.Controller/ListVolumes",
                v1.ListVolumesRequest(),
                v1.ListVolumesResponse(
                    entries=[
                        v1.ListVolumesResponseEntry(
                            volume=v1.Volume(volume_id=volume_id, capacity_bytes=5 << 20),
                            status=v1.ListVolumesResponseVolumeStatus(
                                published_node_ids=["node-1"]
                            ),
                        )
                    ]
                ),
            ),
            (
                "/csi.v1.Controller/GetCapacity",
                v1.GetCapacityRequest(),
                v1.GetCapacityResponse(available_capacity=1 << 40),
            ),
            (
                "/csi.v1.Controller/ControllerGetVolume",
                v1.ControllerGetVolumeRequest(volume_id=volume_id),
                v1.ControllerGetVolumeResponse(volume=v1.Volume(volume_id=volume_id)),
            ),
            (
                "/csi.v1.Controller/ControllerModifyVolume",
                v1.ControllerModifyVolumeRequest(volume_id=volume_id),
                v1.ControllerModifyVolumeResponse(),
            ),
            (
                "/csi.v1.Controller/ValidateVolumeCapabilities",
                v1.ValidateVolumeCapabilitiesRequest(
                    volume_id=volume_id, volume_capabilities=[capability]
                ),
                v1.ValidateVolumeCapabilitiesResponse(
                    confirmed=v1.ValidateVolumeCapabilitiesResponseConfirmed(
                        volume_capabilities=[capability]
                    )
                ),
            ),
            (
                "/csi.v1.Controller/ControllerUnpublishVolume",
                v1.ControllerUnpublishVolumeRequest(volume_id=volume_id, node_id="node-1"),
                v1.ControllerUnpublishVolumeResponse(),
            ),
            (
                "/csi.v1.Node/NodeGetInfo",
                v1.NodeGetInfoRequest(),
                v1.NodeGetInfoResponse(node_id="node-1"),
            ),
        ]
        for method, request, expected in calls:
            assert await conn.call(method, request) == expected, method
        snapshot = await conn.call(
            "/csi.v1.Controller/CreateSnapshot",
            v1.CreateSnapshotRequest(name="snap", source_volume_id=volume_id),
        )
        assert snapshot.snapshot.source_volume_id == volume_id
        await conn.call(
            "/csi.v1.Controller/DeleteSnapshot",
            v1.DeleteSnapshotRequest(snapshot_id=snapshot.snapshot.snapshot_id),
        )
        await conn.delete_volume(v1.DeleteVolumeRequest(volume_id=volume_id))
        assert not state.volumes
        # A gRPC error status, with a message that needs percent-encoding on the wire.
        with pytest.raises(CSICallError) as info:
            await conn.call(
                "/csi.v1.Controller/ControllerPublishVolume",
                v1.ControllerPublishVolumeRequest(volume_id="missing", node_id="n"),
            )
        assert info.value.status is Status.NOT_FOUND
        assert info.value.message == "volume missing: 100% gone, naïve"
        assert not info.value.transport
        # A method the driver does not serve.
        with pytest.raises(CSICallError) as info:
            await conn.call("/csi.v1.Node/NodeStageVolume", v1.NodeStageVolumeRequest())
        assert info.value.status is Status.UNIMPLEMENTED
        # Which client carried the calls: grpclib's channel only as the fallback.
        assert (conn._channel is not None) == (grpc_client == "grpclib")
        assert (conn._client is not None) == (grpc_client == "lean")
        labels = {
            "driver_name": DRIVER_NAME,
            "method_name": "/csi.v1.Controller/ControllerPublishVolume",
            "grpc_status_code": "NotFound",
        }
        assert registry.get_sample_value("csi_sidecar_operations_seconds_count", labels) == 1


async def test_large_messages_both_ways_against_the_kit(sock_dir: pathlib.Path) -> None:
    """A 5 MiB request overruns grpclib's 4 MiB windows (the client waits for WINDOW_UPDATEs
    and splits DATA at 16 KiB frames); a 3 MiB answer spans hundreds of frames and makes the
    client replenish its windows; a 5 MiB answer is refused as grpc-go refuses it."""
    echo = "x" * (5 << 19)  # 2.5 MiB, answered twice over
    async with (
        full_driver(sock_dir, max_receive_message_length=8 << 20) as (state, server),
        client_for(server.path) as client,
    ):
        capability = v1.VolumeCapability(block=v1.VolumeCapabilityBlockVolume())
        big = v1.CreateVolumeRequest(
            name="big", volume_capabilities=[capability], parameters={"pad": "p" * (5 << 20)}
        )
        response = await client.unary(CREATE, big, v1.CreateVolumeResponse, timeout=30)
        assert response.volume is not None
        assert state.requests("CreateVolume")[0].parameters["pad"] == "p" * (5 << 20)  # type: ignore[attr-defined]
        medium = v1.CreateVolumeRequest(
            name="medium", volume_capabilities=[capability], parameters={"echo": echo[: 3 << 19]}
        )
        response = await client.unary(CREATE, medium, v1.CreateVolumeResponse, timeout=30)
        assert response.volume is not None
        assert response.volume.volume_context["echo"] == echo[: 3 << 19] * 2
        huge = v1.CreateVolumeRequest(
            name="huge", volume_capabilities=[capability], parameters={"echo": echo}
        )
        with pytest.raises(GRPCError) as info:
            await client.unary(CREATE, huge, v1.CreateVolumeResponse, timeout=30)
        assert info.value.status is Status.RESOURCE_EXHAUSTED
        assert "larger than max" in (info.value.message or "")
        # The connection survives all of it.
        assert (await client.unary(PROBE, Probe(), v1.ProbeResponse, timeout=5)).ready


async def test_many_concurrent_calls_share_one_connection(sock_dir: pathlib.Path) -> None:
    async with serve_driver(sock_dir) as (_, server), client_for(server.path) as client:
        capability = v1.VolumeCapability(block=v1.VolumeCapabilityBlockVolume())
        responses = await asyncio.gather(
            *(
                client.unary(
                    CREATE,
                    v1.CreateVolumeRequest(name=f"pvc-{i}", volume_capabilities=[capability]),
                    v1.CreateVolumeResponse,
                    timeout=30,
                )
                for i in range(300)
            )
        )
        assert len({r.volume.volume_id for r in responses if r.volume}) == 300
        assert server.connections == 1


async def test_driver_restart_reconnects_on_the_next_call(sock_dir: pathlib.Path) -> None:
    state = DriverState()
    async with client_for(sock_dir / "csi.sock") as client:
        async with serve_driver(sock_dir, state=state):
            assert (await client.unary(PROBE, Probe(), v1.ProbeResponse, timeout=5)).ready
        # The driver is gone: the socket is removed.
        # The socket is gone (OSError), unless the call raced the connection's end.
        with pytest.raises((OSError, ConnectionTerminatedError)):
            await client.unary(PROBE, Probe(), v1.ProbeResponse, timeout=5)
        async with serve_driver(sock_dir, state=state):
            assert (await client.unary(PROBE, Probe(), v1.ProbeResponse, timeout=5)).ready


async def test_connection_maps_lean_failures_like_grpclib(sock_dir: pathlib.Path) -> None:
    """What CSIConnection sees: a deadline is DEADLINE_EXCEEDED, a vanished driver a
    transport failure that marks the connection lost."""
    options = ConnectionOptions(timeout=0.2, backoff_start=0.01, backoff_max=0.05)
    async with serve_driver(sock_dir) as (state, server):
        conn = await CSIConnection.open(server.endpoint, options, metrics=CSIMetrics(None))
        try:
            state.fail("CreateVolume", Fault(delay=1.0))
            with pytest.raises(CSICallError) as info:
                await conn.create_volume(v1.CreateVolumeRequest(name="slow"))
            assert info.value.status is Status.DEADLINE_EXCEEDED
            await server.stop()
            with pytest.raises(CSICallError) as info:
                await conn.probe()
            assert info.value.status is Status.UNAVAILABLE
            assert info.value.transport
            assert conn.lost
        finally:
            conn.close()


# -- against an h2 server: flow control and concurrency, checked by h2 ---------------------------


class H2Echo(asyncio.Protocol):
    """An h2 server answering every call with its request message, after ``delay``; h2 fails
    the connection if the client breaks flow control, frame size or stream limits."""

    def __init__(self, settings: dict[int, int], delay: float, registry: H2Registry) -> None:
        self.settings = settings
        self.delay = delay
        self.registry = registry
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=False, header_encoding="utf-8")
        )
        self.transport: asyncio.Transport | None = None
        self.bodies: dict[int, bytearray] = {}
        self.window_open = asyncio.Event()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.conn.local_settings = h2.settings.Settings(
            client=False,
            initial_values={h2.settings.SettingCodes(k): v for k, v in self.settings.items()},
        )
        self.conn.initiate_connection()
        transport.write(self.conn.data_to_send())

    def data_received(self, data: bytes) -> None:
        try:
            events = self.conn.receive_data(data)
        except h2.exceptions.ProtocolError as err:
            self.registry.errors.append(repr(err))
            assert self.transport is not None
            self.transport.write(self.conn.data_to_send())
            self.transport.close()
            return
        for event in events:
            if isinstance(event, h2.events.RequestReceived):
                self.bodies[event.stream_id] = bytearray()
                self.registry.open += 1
                self.registry.most_open = max(self.registry.most_open, self.registry.open)
            elif isinstance(event, h2.events.DataReceived):
                self.bodies[event.stream_id].extend(event.data)
                self.registry.frame_sizes.append(event.flow_controlled_length)
                self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                body = bytes(self.bodies.pop(event.stream_id))
                self.registry.tasks.append(
                    asyncio.get_running_loop().create_task(self.answer(event.stream_id, body))
                )
            elif isinstance(event, h2.events.WindowUpdated):
                self.window_open.set()
        assert self.transport is not None
        self.transport.write(self.conn.data_to_send())

    async def answer(self, stream_id: int, body: bytes) -> None:
        assert self.transport is not None
        await asyncio.sleep(self.delay)  # the "work" that keeps streams open together
        self.conn.send_headers(
            stream_id, [(":status", "200"), ("content-type", "application/grpc")]
        )
        view = memoryview(body)
        while view:
            window = min(
                self.conn.local_flow_control_window(stream_id), self.conn.max_outbound_frame_size
            )
            if window <= 0:
                self.window_open.clear()
                self.transport.write(self.conn.data_to_send())
                await self.window_open.wait()
                continue
            self.conn.send_data(stream_id, bytes(view[:window]))
            view = view[window:]
        self.conn.send_headers(stream_id, [("grpc-status", "0")], end_stream=True)
        self.transport.write(self.conn.data_to_send())
        self.registry.open -= 1

    def connection_lost(self, exc: Exception | None) -> None:
        self.window_open.set()


@dataclass
class H2Registry:
    open: int = 0
    most_open: int = 0
    errors: list[str] = field(default_factory=list)
    frame_sizes: list[int] = field(default_factory=list)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


@contextlib.asynccontextmanager
async def h2_server(
    path: pathlib.Path, settings: dict[int, int], delay: float = 0.0
) -> AsyncIterator[H2Registry]:
    registry = H2Registry()
    loop = asyncio.get_running_loop()
    server = await loop.create_unix_server(
        lambda: H2Echo(settings, delay, registry), path=str(path)
    )
    try:
        yield registry
    finally:
        server.close()
        for task in registry.tasks:
            task.cancel()
        await asyncio.gather(*registry.tasks, return_exceptions=True)
        await server.wait_closed()


async def test_max_concurrent_streams_one_makes_calls_wait(sock_dir: pathlib.Path) -> None:
    settings = {S_MAX_CONCURRENT: 1}
    async with (
        h2_server(sock_dir / "h2.sock", settings, delay=0.002) as registry,
        client_for(sock_dir / "h2.sock") as client,
    ):
        requests = [v1.CreateVolumeRequest(name=f"pvc-{i}") for i in range(40)]
        answers = await asyncio.gather(
            *(client.unary(CREATE, r, v1.CreateVolumeRequest, timeout=20) for r in requests)
        )
        assert answers == requests
        assert registry.most_open == 1
        assert not registry.errors


async def test_flow_control_both_ways_against_h2(sock_dir: pathlib.Path) -> None:
    """h2 advertises 16 KiB stream windows and 16 KiB frames: a 300 KiB request must wait for
    its WINDOW_UPDATEs; the 300 KiB echo, and a 6 MiB one over the client's 4 MiB stream
    window, need the client's WINDOW_UPDATEs."""
    settings = {S_INITIAL_WINDOW: 16_384, S_MAX_CONCURRENT: 4}
    async with (
        h2_server(sock_dir / "h2.sock", settings) as registry,
        client_for(sock_dir / "h2.sock", max_receive_message_length=8 << 20) as client,
    ):
        small = v1.CreateVolumeRequest(name="n", parameters={"p": "a" * 300_000})
        large = v1.CreateVolumeRequest(name="m", parameters={"p": "b" * (6 << 20)})
        answers = await asyncio.gather(
            client.unary(CREATE, small, v1.CreateVolumeRequest, timeout=30),
            client.unary(CREATE, small, v1.CreateVolumeRequest, timeout=30),
            client.unary(CREATE, large, v1.CreateVolumeRequest, timeout=60),
        )
        assert list(answers) == [small, small, large]
        assert not registry.errors
        assert max(registry.frame_sizes) <= 16_384


# -- edge cases against the raw-frame fake ---------------------------------------------------------


async def test_request_headers_and_normal_response(fake: FakeServer) -> None:
    async with client_for(fake.path) as client:
        task = probe(client, timeout=10)
        peer = await fake.accept()
        request = await peer.request()
        assert request.stream_id == 1
        assert request.headers == [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", PROBE),
            (":authority", "127.0.0.1:50051"),
            ("te", "trailers"),
            ("content-type", "application/grpc"),
            ("user-agent", USER_AGENT),
            ("grpc-timeout", dict(request.headers)["grpc-timeout"]),
        ]
        # The first call waited for the connection: what is left of its 10 s.
        timeout = dict(request.headers)["grpc-timeout"]
        assert timeout.endswith("u")
        assert 9_000_000 < int(timeout[:-1]) <= 10_000_000
        assert request.message == b""
        # The client's SETTINGS: push off, a 4 MiB stream window; then a connection
        # WINDOW_UPDATE; our SETTINGS acknowledged.
        client_settings = dict(
            struct.unpack(">HI", peer.frames[0][3][i : i + 6])
            for i in range(0, len(peer.frames[0][3]), 6)
        )
        assert client_settings[2] == 0
        assert client_settings[S_INITIAL_WINDOW] == 4 << 20
        assert any(f[0] == SETTINGS and f[1] & ACK for f in peer.frames)
        assert any(f[0] == WINDOW_UPDATE and f[2] == 0 for f in peer.frames)
        peer.respond(1, READY)
        assert (await asyncio.wait_for(task, 5)).ready
        # The next calls: the next odd stream ids; the whole timeout; none without one.
        task = probe(client, timeout=10)
        request = await peer.request()
        assert request.stream_id == 3
        assert dict(request.headers)["grpc-timeout"] == "10000000u"
        peer.respond(3, READY)
        assert (await asyncio.wait_for(task, 5)).ready
        task = probe(client, timeout=None)
        request = await peer.request()
        assert request.stream_id == 5
        assert "grpc-timeout" not in dict(request.headers)
        peer.respond(5, b"")
        assert (await asyncio.wait_for(task, 5)).ready is None


async def test_trailers_only_error_with_percent_encoded_message(fake: FakeServer) -> None:
    async with client_for(fake.path) as client:
        task = probe(client)
        peer = await fake.accept()
        request = await peer.request()
        peer.send_headers(
            request.stream_id,
            [
                (":status", "200"),
                ("content-type", "application/grpc"),
                ("grpc-status", "5"),
                ("grpc-message", "volume%20%C3%A9t%C3%A9 not found: 100%25"),
            ],
            end_stream=True,
        )
        error = await failure(task)
        assert isinstance(error, GRPCError)
        assert error.status is Status.NOT_FOUND
        assert error.message == "volume été not found: 100%"


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ([(":status", "503"), ("content-type", "text/plain")], Status.UNAVAILABLE),
        ([(":status", "404")], Status.UNIMPLEMENTED),
        ([(":status", "401")], Status.UNAUTHENTICATED),
        ([(":status", "403")], Status.PERMISSION_DENIED),
        ([(":status", "400")], Status.INTERNAL),
        ([(":status", "429")], Status.UNAVAILABLE),
        ([(":status", "418")], Status.UNKNOWN),
        ([(":status", "200"), ("content-type", "text/html")], Status.UNKNOWN),
        ([(":status", "200")], Status.UNKNOWN),
        ([(":status", "200"), ("content-type", "application/grpc")], Status.UNKNOWN),
        (
            [(":status", "200"), ("content-type", "application/grpc"), ("grpc-status", "x")],
            Status.UNKNOWN,
        ),
        ([("content-type", "application/grpc")], Status.INTERNAL),
    ],
    ids=[
        "503",
        "404",
        "401",
        "403",
        "400",
        "429",
        "418",
        "html",
        "no-content-type",
        "no-grpc-status",
        "bad-grpc-status",
        "no-status",
    ],
)
async def test_http_errors_map_to_grpc_codes(
    fake: FakeServer, headers: list[tuple[str, str]], status: Status
) -> None:
    async with client_for(fake.path) as client:
        task = probe(client)
        peer = await fake.accept()
        request = await peer.request()
        peer.send_headers(request.stream_id, headers, end_stream=True)
        error = await failure(task)
        assert isinstance(error, GRPCError)
        assert error.status is status
        # The connection stays usable.
        task = probe(client)
        request = await peer.request()
        peer.respond(request.stream_id, READY)
        assert (await asyncio.wait_for(task, 5)).ready


@pytest.mark.parametrize(
    ("body", "encoding", "status"),
    [
        (message(b"\x08\x01", flag=1), None, Status.INTERNAL),
        (message(b"\x08\x01", flag=1), "gzip", Status.UNIMPLEMENTED),
        (message(b"\x08\x01", flag=7), None, Status.INTERNAL),
        (message(b"x" * 2000), None, Status.RESOURCE_EXHAUSTED),
        (message(READY) + message(READY), None, Status.INTERNAL),
        (b"", None, Status.INTERNAL),
        (message(READY)[:4], None, Status.INTERNAL),
    ],
    ids=["compressed", "gzip", "bad-flag", "too-large", "two-messages", "none", "truncated"],
)
async def test_bad_response_messages(
    fake: FakeServer, body: bytes, encoding: str | None, status: Status
) -> None:
    async with client_for(fake.path, max_receive_message_length=1000) as client:
        task = probe(client)
        peer = await fake.accept()
        request = await peer.request()
        headers = [(":status", "200"), ("content-type", "application/grpc")]
        if encoding:
            headers.append(("grpc-encoding", encoding))
        peer.send_headers(request.stream_id, headers)
        if body:
            peer.send(DATA, 0, request.stream_id, body)
        peer.send_headers(request.stream_id, [("grpc-status", "0")], end_stream=True)
        error = await failure(task)
        assert isinstance(error, GRPCError)
        assert error.status is status
        task = probe(client)
        request = await peer.request()
        peer.respond(request.stream_id, READY)
        assert (await asyncio.wait_for(task, 5)).ready


async def test_oversized_message_resets_the_stream_before_it_is_read(fake: FakeServer) -> None:
    async with client_for(fake.path, max_receive_message_length=100) as client:
        task = probe(client)
        peer = await fake.accept()
        request = await peer.request()
        peer.send_headers(
            request.stream_id, [(":status", "200"), ("content-type", "application/grpc")]
        )
        peer.send(DATA, 0, request.stream_id, struct.pack(">BI", 0, 10_000) + b"x" * 50)
        error = await failure(task)
        assert isinstance(error, GRPCError)
        assert error.status is Status.RESOURCE_EXHAUSTED
        _, _, stream_id, payload = await peer.until(RST_STREAM)
        assert (stream_id, payload) == (request.stream_id, struct.pack(">I", CANCEL))
        # Frames still in flight on the reset stream are ignored, the connection goes on.
        peer.send(DATA, 0, request.stream_id, b"y" * 100)
        peer.send_headers(request.stream_id, [("grpc-status", "0")], end_stream=True)
        task = probe(client)
        request = await peer.request()
        peer.respond(request.stream_id, READY)
        assert (await asyncio.wait_for(task, 5)).ready


async def test_goaway_mid_call(fake: FakeServer) -> None:
    async with client_for(fake.path) as client:
        first = probe(client)
        peer = await fake.accept()
        one = await peer.request()
        second = probe(client)
        three = await peer.request()
        assert (one.stream_id, three.stream_id) == (1, 3)
        peer.send(GOAWAY, 0, 0, struct.pack(">II", 1, NO_ERROR) + b"restarting")
        error = await failure(second)
        assert isinstance(error, ConnectionTerminatedError)
        assert "GOAWAY" in str(error)
        # The call the server processed still completes on the old connection...
        peer.respond(1, READY)
        assert (await asyncio.wait_for(first, 5)).ready
        # ...which then closes; the next call opens a new one.
        third = probe(client)
        other = await fake.accept()
        request = await other.request()
        assert request.stream_id == 1
        other.respond(1, READY)
        assert (await asyncio.wait_for(third, 5)).ready
        await asyncio.wait_for(peer.eof(), 5)
        assert any(f[0] == GOAWAY for f in peer.frames)


async def test_goaway_through_the_connection_is_a_transport_failure(fake: FakeServer) -> None:
    conn = CSIConnection(
        f"unix://{fake.path}", ConnectionOptions(timeout=5), metrics=CSIMetrics(None)
    )
    await conn.connect()
    try:
        task = asyncio.create_task(conn.probe())
        peer = await fake.accept()
        await peer.request()
        peer.send(GOAWAY, 0, 0, struct.pack(">II", 0, NO_ERROR))
        with pytest.raises(CSICallError) as info:
            await asyncio.wait_for(task, 5)
        assert info.value.status is Status.UNAVAILABLE
        assert info.value.transport
        assert conn.lost
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("code", "status"),
    [
        (REFUSED_STREAM, Status.UNAVAILABLE),
        (CANCEL, Status.CANCELLED),
        (PROTOCOL_ERROR, Status.INTERNAL),
        (NO_ERROR, Status.INTERNAL),
        (0xB, Status.RESOURCE_EXHAUSTED),
    ],
)
async def test_rst_stream_from_the_server(fake: FakeServer, code: int, status: Status) -> None:
    async with client_for(fake.path) as client:
        task = probe(client)
        peer = await fake.accept()
        request = await peer.request()
        peer.send(RST_STREAM, 0, request.stream_id, struct.pack(">I", code))
        error = await failure(task)
        assert isinstance(error, GRPCError)
        assert error.status is status
        task = probe(client)
        request = await peer.request()
        assert request.stream_id == 3
        peer.respond(3, READY)
        assert (await asyncio.wait_for(task, 5)).ready


async def test_ping_is_answered(fake: FakeServer) -> None:
    async with client_for(fake.path) as client:
        task = probe(client)
        peer = await fake.accept()
        request = await peer.request()
        peer.send(PING, 0, 0, b"12345678")
        _, flags, _, payload = await peer.until(PING)
        assert (flags, payload) == (ACK, b"12345678")
        peer.send(PING, ACK, 0, b"ignored!")  # an ACK is not answered
        peer.respond(request.stream_id, READY)
        assert (await asyncio.wait_for(task, 5)).ready
        assert len(peer.sent(PING)) == 1


async def test_continuation_padding_priority_and_unknown_frames(fake: FakeServer) -> None:
    async with client_for(fake.path) as client:
        task = probe(client)
        peer = await fake.accept(settings={S_MAX_FRAME: 16_384})
        request = await peer.request()
        sid = request.stream_id
        # Response headers in a HEADERS frame with padding and priority, then CONTINUATIONs.
        block = peer.block(
            [(":status", "200"), ("content-type", "application/grpc"), ("x-big", "v" * 40_000)]
        )
        first, rest = block[:100], block[100:]
        padded = bytes([7]) + struct.pack(">IB", 0, 15) + first + b"\0" * 7
        peer.send(HEADERS, PADDED | PRIORITY_FLAG, sid, padded)
        peer.send(CONTINUATION, 0, sid, rest[:16_000])
        peer.send(CONTINUATION, 0, sid, rest[16_000:32_000])
        peer.send(CONTINUATION, END_HEADERS, sid, rest[32_000:])
        peer.send(PRIORITY, 0, sid, struct.pack(">IB", 0, 200))
        peer.send(0xFA, 0x3, sid, b"an extension frame")
        body = message(READY)
        peer.send(DATA, PADDED, sid, bytes([20]) + body[:3] + b"\0" * 20)
        peer.send(DATA, PADDED, sid, bytes([0]) + body[3:])
        trailers = peer.block([("grpc-status", "0"), ("x-trailer", "t" * 20_000)])
        peer.send(HEADERS, END_STREAM, sid, trailers[:10])
        peer.send(CONTINUATION, 0, sid, trailers[10:16_000])
        peer.send(CONTINUATION, END_HEADERS, sid, trailers[16_000:])
        assert (await asyncio.wait_for(task, 5)).ready


async def test_error_message_in_continuation_frames(fake: FakeServer) -> None:
    text = "e" * 30_000
    async with client_for(fake.path) as client:
        task = probe(client)
        peer = await fake.accept()
        request = await peer.request()
        block = peer.block(
            [
                (":status", "200"),
                ("content-type", "application/grpc"),
                ("grpc-status", "9"),
                ("grpc-message", text),
            ]
        )
        peer.send(HEADERS, END_STREAM, request.stream_id, block[:16_000])
        peer.send(CONTINUATION, END_HEADERS, request.stream_id, block[16_000:])
        error = await failure(task)
        assert isinstance(error, GRPCError)
        assert (error.status, error.message) == (Status.FAILED_PRECONDITION, text)


async def test_server_closing_the_socket_mid_call(fake: FakeServer) -> None:
    async with client_for(fake.path) as client:
        task = probe(client)
        peer = await fake.accept()
        await peer.request()
        peer.writer.close()
        error = await failure(task)
        assert isinstance(error, ConnectionTerminatedError)
        assert not client.connected
        # The next call reconnects.
        task = probe(client)
        other = await fake.accept()
        request = await other.request()
        other.respond(request.stream_id, READY)
        assert (await asyncio.wait_for(task, 5)).ready


async def test_server_closing_before_its_settings(fake: FakeServer) -> None:
    async with client_for(fake.path) as client:
        task = probe(client)
        peer = await asyncio.wait_for(fake.peers.get(), 5)
        peer.writer.close()
        error = await failure(task)
        assert isinstance(error, ConnectionTerminatedError)


async def test_deadline_resets_the_stream(fake: FakeServer) -> None:
    async with client_for(fake.path) as client:
        task = probe(client, timeout=0.2)
        peer = await fake.accept()
        request = await peer.request()
        timeout = dict(request.headers)["grpc-timeout"]  # what is left of the 0.2 s
        assert timeout.endswith("u")
        assert 100_000 < int(timeout[:-1]) <= 200_000
        error = await failure(task)
        assert isinstance(error, TimeoutError)
        _, _, stream_id, payload = await peer.until(RST_STREAM)
        assert (stream_id, payload) == (request.stream_id, struct.pack(">I", CANCEL))
        # A late answer on the reset stream is ignored.
        peer.respond(request.stream_id, READY)
        task = probe(client)
        request = await peer.request()
        peer.respond(request.stream_id, READY)
        assert (await asyncio.wait_for(task, 5)).ready


async def test_deadline_while_connecting_to_a_silent_server(fake: FakeServer) -> None:
    async with client_for(fake.path) as client:
        task = probe(client, timeout=0.2)
        error = await failure(task)  # the server never sends its SETTINGS
        assert isinstance(error, TimeoutError)


async def test_cancelled_call_resets_the_stream(fake: FakeServer) -> None:
    async with client_for(fake.path) as client:
        task = probe(client)
        peer = await fake.accept()
        request = await peer.request()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        _, _, stream_id, payload = await peer.until(RST_STREAM)
        assert (stream_id, payload) == (request.stream_id, struct.pack(">I", CANCEL))


async def test_settings_changes_flow_control_and_frame_size(fake: FakeServer) -> None:
    """The server starts with a 100-byte stream window: the request waits; a SETTINGS raising
    INITIAL_WINDOW_SIZE (applied to the open stream) and WINDOW_UPDATEs let it through, in
    frames no larger than the window allows."""
    async with client_for(fake.path) as client:
        request = v1.CreateVolumeRequest(name="w", parameters={"p": "z" * 40_000})
        task = asyncio.create_task(
            client.unary(CREATE, request, v1.CreateVolumeRequest, timeout=10)
        )
        peer = await fake.accept(settings={S_INITIAL_WINDOW: 100})
        _, flags, sid, _ = await peer.until(HEADERS)
        assert not flags & END_STREAM
        _, flags, _, payload = await peer.until(DATA)
        assert len(payload) == 100
        assert not flags & END_STREAM
        # Raise the window by 1,000 through SETTINGS: exactly 1,000 more bytes come.
        peer.send(SETTINGS, 0, 0, struct.pack(">HI", S_INITIAL_WINDOW, 1100))
        _, _, _, payload = await peer.until(DATA)
        assert len(payload) == 1000
        # A big stream WINDOW_UPDATE: the rest, split at 16 KiB frames, the last ends the stream.
        peer.send(WINDOW_UPDATE, 0, sid, struct.pack(">I", 1 << 20))
        sizes = []
        while True:
            _, flags, _, payload = await peer.until(DATA)
            sizes.append(len(payload))
            if flags & END_STREAM:
                break
        total = len(bytes(request)) + 5
        assert 100 + 1000 + sum(sizes) == total
        assert max(sizes) <= 16_384
        peer.respond(sid, bytes(request))
        assert await asyncio.wait_for(task, 5) == request
        # Our SETTINGS were all acknowledged.
        assert len([f for f in peer.frames if f[0] == SETTINGS and f[1] & ACK]) == 2


async def test_connection_window_limits_sending(fake: FakeServer) -> None:
    async with client_for(fake.path) as client:
        request = v1.CreateVolumeRequest(name="c", parameters={"p": "q" * 100_000})
        task = asyncio.create_task(
            client.unary(CREATE, request, v1.CreateVolumeRequest, timeout=10)
        )
        peer = await fake.accept(settings={S_INITIAL_WINDOW: 1 << 20, S_MAX_FRAME: 1 << 20})
        received = 0
        while received < 65_535:
            _, _, sid, payload = await peer.until(DATA)
            received += len(payload)
        assert received == 65_535  # the connection's initial window, not a byte more
        peer.send(WINDOW_UPDATE, 0, 0, struct.pack(">I", 1 << 20))
        _, flags, _, payload = await peer.until(DATA)
        assert flags & END_STREAM
        assert received + len(payload) == len(bytes(request)) + 5
        peer.respond(sid, b"")
        assert await asyncio.wait_for(task, 5) == v1.CreateVolumeRequest()


async def test_max_concurrent_streams_changes(fake: FakeServer) -> None:
    async with client_for(fake.path) as client:
        first = probe(client)
        peer = await fake.accept(settings={S_MAX_CONCURRENT: 1})
        one = await peer.request()
        second = probe(client)
        third = probe(client)
        # Both wait for the one stream allowed; lowering the limit to 0 holds them on.
        peer.send(SETTINGS, 0, 0, struct.pack(">HI", S_MAX_CONCURRENT, 0))
        await peer.until(SETTINGS)
        peer.respond(one.stream_id, READY)
        assert (await asyncio.wait_for(first, 5)).ready
        assert not second.done()
        assert not third.done()
        peer.send(SETTINGS, 0, 0, struct.pack(">HI", S_MAX_CONCURRENT, 2))
        two, three = await peer.request(), await peer.request()
        assert {two.stream_id, three.stream_id} == {3, 5}
        peer.respond(two.stream_id, READY)
        peer.respond(three.stream_id, READY)
        assert (await asyncio.wait_for(second, 5)).ready
        assert (await asyncio.wait_for(third, 5)).ready


async def test_woken_waiter_that_gives_up_passes_its_turn(fake: FakeServer) -> None:
    async with client_for(fake.path) as client:
        first = probe(client)
        peer = await fake.accept(settings={S_MAX_CONCURRENT: 1})
        one = await peer.request()
        second = probe(client)
        third = probe(client)
        conn = client._conn
        assert conn is not None
        await wait_for(lambda: len(conn.waiters) == 2)
        # The answer to the first call, handed to the connection as if just read: the stream
        # it frees goes to the second call, cancelled before it can use it.
        headers = peer.block([(":status", "200"), ("content-type", "application/grpc")])
        trailers = peer.block([("grpc-status", "0")])
        conn.data_received(
            frame(HEADERS, END_HEADERS, one.stream_id, headers)
            + frame(DATA, 0, one.stream_id, message(READY))
            + frame(HEADERS, END_HEADERS | END_STREAM, one.stream_id, trailers)
        )
        second.cancel()
        assert (await asyncio.wait_for(first, 5)).ready
        with pytest.raises(asyncio.CancelledError):
            await second
        # The third call gets the stream.
        request = await asyncio.wait_for(peer.request(), 5)
        peer.respond(request.stream_id, READY)
        assert (await asyncio.wait_for(third, 5)).ready


@pytest.mark.parametrize(
    "frames",
    [
        [(DATA, 0, 0, b"x")],
        [(DATA, 0, 99, b"x")],
        [(HEADERS, END_HEADERS, 2, b"\x88")],
        [(PUSH_PROMISE, END_HEADERS, 1, struct.pack(">I", 2) + b"\x82")],
        [(SETTINGS, 0, 0, b"\0\0\0")],
        [(SETTINGS, 0, 0, struct.pack(">HI", S_MAX_FRAME, 100))],
        [(SETTINGS, 0, 0, struct.pack(">HI", S_INITIAL_WINDOW, 1 << 31))],
        [(PING, 0, 0, b"short")],
        [(WINDOW_UPDATE, 0, 0, struct.pack(">I", 0))],
        [(WINDOW_UPDATE, 0, 0, struct.pack(">I", (1 << 31) - 1))],
        [(HEADERS, 0, 1, b"\x88"), (DATA, 0, 1, b"")],
        [(CONTINUATION, END_HEADERS, 1, b"\x88")],
        [(HEADERS, END_HEADERS, 1, b"\xff\xff\xff\xff\x0f")],
        [(DATA, PADDED, 1, b"\x05ab")],
        [(0x0, 0, 1, b"x" * 16_385)],
    ],
    ids=[
        "data-stream-0",
        "data-idle-stream",
        "headers-even-stream",
        "push-promise",
        "settings-length",
        "max-frame-size",
        "window-too-large",
        "ping-length",
        "window-update-0",
        "window-overflow",
        "interrupted-header-block",
        "stray-continuation",
        "hpack-garbage",
        "padding-too-long",
        "frame-too-large",
    ],
)
async def test_protocol_errors_close_the_connection_with_goaway(
    fake: FakeServer, frames: list[tuple[int, int, int, bytes]]
) -> None:
    async with client_for(fake.path) as client:
        task = probe(client)
        peer = await fake.accept()
        await peer.request()
        for kind, flags, stream_id, payload in frames:
            peer.send(kind, flags, stream_id, payload)
        error = await failure(task)
        assert isinstance(error, ConnectionTerminatedError)
        _, _, _, payload = await asyncio.wait_for(peer.until(GOAWAY), 5)
        last_stream, code = struct.unpack(">II", payload[:8])
        assert last_stream == 0
        assert code != NO_ERROR
        await asyncio.wait_for(peer.eof(), 5)
        # A new connection for the next call.
        task = probe(client)
        other = await fake.accept()
        request = await other.request()
        other.respond(request.stream_id, READY)
        assert (await asyncio.wait_for(task, 5)).ready


async def test_header_list_over_the_limit_is_a_connection_error(fake: FakeServer) -> None:
    async with client_for(fake.path) as client:
        task = probe(client)
        peer = await fake.accept()
        request = await peer.request()
        block = peer.block([(":status", "200"), ("x-huge", "h" * 70_000)])
        peer.send(HEADERS, 0, request.stream_id, block[:16_000])
        for start in range(16_000, len(block), 16_000):
            last = start + 16_000 >= len(block)
            flags = END_HEADERS if last else 0
            peer.send(CONTINUATION, flags, request.stream_id, block[start : start + 16_000])
        error = await failure(task)
        assert isinstance(error, ConnectionTerminatedError)
        _, _, _, payload = await peer.until(GOAWAY)
        assert struct.unpack(">II", payload[:8])[1] == COMPRESSION_ERROR


async def test_stream_ids_running_out_move_calls_to_a_new_connection(fake: FakeServer) -> None:
    async with client_for(fake.path) as client:
        client.max_stream_id = 5
        task = probe(client)
        peer = await fake.accept()
        for expected in (1, 3, 5):
            if expected > 1:
                task = probe(client)
            request = await peer.request()
            assert request.stream_id == expected
            peer.respond(expected, READY)
            assert (await asyncio.wait_for(task, 5)).ready
        # Stream 5 was the last: the old connection said goodbye; a new one starts at 1.
        await asyncio.wait_for(peer.eof(), 5)
        assert any(f[0] == GOAWAY for f in peer.frames)
        task = probe(client)
        other = await fake.accept()
        request = await other.request()
        assert request.stream_id == 1
        other.respond(1, READY)
        assert (await asyncio.wait_for(task, 5)).ready


async def test_close_fails_running_calls_and_sends_goaway(fake: FakeServer) -> None:
    client = GrpcClient(path=str(fake.path))
    task = probe(client)
    peer = await fake.accept()
    await peer.request()
    client.close()
    error = await failure(task)
    assert isinstance(error, ConnectionTerminatedError)
    await asyncio.wait_for(peer.eof(), 5)
    _, _, _, payload = peer.sent(GOAWAY)[0]
    assert struct.unpack(">II", payload[:8]) == (0, NO_ERROR)


async def test_close_fails_calls_waiting_for_a_stream(fake: FakeServer) -> None:
    client = GrpcClient(path=str(fake.path))
    first = probe(client)
    peer = await fake.accept(settings={S_MAX_CONCURRENT: 1})
    await peer.request()
    second = probe(client)
    conn = client._conn
    assert conn is not None
    await wait_for(lambda: len(conn.waiters) == 1)
    client.close()
    assert isinstance(await failure(first), ConnectionTerminatedError)
    assert isinstance(await failure(second), ConnectionTerminatedError)
    assert fake.peers.empty()  # the waiting call did not open a new connection
    assert not client.connected


async def test_informational_headers_and_answer_before_request_end(fake: FakeServer) -> None:
    """A 1xx response is skipped; an answer while the request is still being sent (the
    window closed) completes the call and stops the upload with RST_STREAM(CANCEL)."""
    async with client_for(fake.path) as client:
        request = v1.CreateVolumeRequest(name="early", parameters={"p": "r" * 1000})
        task = asyncio.create_task(
            client.unary(CREATE, request, v1.CreateVolumeRequest, timeout=10)
        )
        peer = await fake.accept(settings={S_INITIAL_WINDOW: 10})
        _, _, sid, _ = await peer.until(HEADERS)
        peer.send_headers(sid, [(":status", "100")])
        peer.respond(sid, bytes(v1.CreateVolumeRequest(name="ok")))
        assert await asyncio.wait_for(task, 5) == v1.CreateVolumeRequest(name="ok")
        _, _, stream_id, payload = await peer.until(RST_STREAM)
        assert (stream_id, payload) == (sid, struct.pack(">I", CANCEL))


async def test_tcp_endpoint() -> None:
    """host:port: the same client over TCP, :authority naming the host and port."""
    seen: list[Request] = []

    async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = Peer(reader, writer)
        await peer.handshake()
        request = await peer.request()
        seen.append(request)
        peer.respond(request.stream_id, READY)
        await writer.drain()
        await peer.eof()
        writer.close()

    server = await asyncio.start_server(accepted, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = GrpcClient(host="127.0.0.1", port=port)
    try:
        assert (await client.unary(PROBE, Probe(), v1.ProbeResponse, timeout=5)).ready
        assert dict(seen[0].headers)[":authority"] == f"127.0.0.1:{port}"
    finally:
        client.close()
        server.close()
        await server.wait_closed()


def test_client_arguments_are_checked() -> None:
    async def build(**kwargs: Any) -> GrpcClient:
        return GrpcClient(**kwargs)

    with pytest.raises(ValueError, match="not both"):
        asyncio.run(build(path="/x", host="h"))
    with pytest.raises(ValueError, match="positive"):
        asyncio.run(build(path="/x", max_receive_message_length=0))


@pytest.mark.parametrize("grpc_client", ["lean", "grpclib"])
def test_bench_runs_with_either_client(grpc_client: str) -> None:
    """bench/csi_provision.py --grpc-client: the isolated CSI path runs over either client."""
    bench = pathlib.Path(__file__).resolve().parents[2] / "bench" / "csi_provision.py"
    args = ["--isolated", "--volumes", "30", "--repeat", "1", "--threadiness", "4"]
    out = subprocess.run(
        [sys.executable, str(bench), *args, "--grpc-client", grpc_client],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["grpc_client"] == grpc_client
    assert result["csi_client_calls"]["CreateVolume/OK"] == 130
    assert result["provision_outcomes"] == {"ok": 130}

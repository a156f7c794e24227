"""The CSI server kit: capabilities, error mapping, redacted request logging."""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
import structlog
from grpclib.client import Channel, UnaryUnaryMethod
from grpclib.const import Status
from grpclib.encoding.base import CodecBase
from grpclib.exceptions import GRPCError

from pyprovlib.csi._proto.csi import v1
from pyprovlib.csi.server import (
    ControllerService,
    CSIError,
    CSIServer,
    IdentityService,
    NodeService,
    unix_socket_path,
)

SECRET = "very-secret-token-42"


class Controller(ControllerService):
    def __init__(self) -> None:
        super().__init__([v1.ControllerServiceCapabilityRpcType.CREATE_DELETE_VOLUME])
        self.calls = 0

    async def create_volume(self, message: v1.CreateVolumeRequest) -> v1.CreateVolumeResponse:
        self.calls += 1
        if message.name == "deliberate":
            raise CSIError(Status.RESOURCE_EXHAUSTED, "pool full")
        if message.name == "boom":
            raise KeyError(f"unexpected {message.secrets}")
        return v1.CreateVolumeResponse(volume=v1.Volume(volume_id=message.name, capacity_bytes=1))

    async def delete_volume(self, message: v1.DeleteVolumeRequest) -> v1.DeleteVolumeResponse:
        return v1.DeleteVolumeResponse()


def test_unix_socket_path_forms() -> None:
    for form in ("unix:///a/b.sock", "unix:/a/b.sock", "/a/b.sock"):
        assert unix_socket_path(form) == pathlib.Path("/a/b.sock")
    with pytest.raises(ValueError, match="not a unix socket"):
        unix_socket_path("localhost:1234")


def test_a_server_needs_identity(sock_dir: pathlib.Path) -> None:
    with pytest.raises(ValueError, match="Identity"):
        CSIServer([Controller()], str(sock_dir / "csi.sock"))


async def test_capabilities_errors_and_logging(sock_dir: pathlib.Path) -> None:
    identity = IdentityService(
        "kit.test",
        "0.1",
        services=[v1.PluginCapabilityServiceType.CONTROLLER_SERVICE],
        volume_expansion=v1.PluginCapabilityVolumeExpansionType.ONLINE,
    )
    controller = Controller()
    node = NodeService("node-1", accessible_topology={"zone": "a"})
    path = sock_dir / "csi.sock"
    # A stale socket file from a previous run does not prevent binding.
    async with CSIServer([identity, controller, node], f"unix://{path}"):
        pass
    async with CSIServer([identity, controller, node], f"unix://{path}") as server:
        assert server.endpoint == f"unix://{path}"
        channel = Channel(path=str(path))
        try:
            ident = v1.IdentityStub(channel)
            ctrl = v1.ControllerStub(channel)
            node_stub = v1.NodeStub(channel)
            info = await ident.get_plugin_info(v1.GetPluginInfoRequest())
            assert (info.name, info.vendor_version) == ("kit.test", "0.1")
            caps = await ident.get_plugin_capabilities(v1.GetPluginCapabilitiesRequest())
            assert [c.service.type for c in caps.capabilities if c.service] == [
                v1.PluginCapabilityServiceType.CONTROLLER_SERVICE
            ]
            assert [c.volume_expansion.type for c in caps.capabilities if c.volume_expansion] == [
                v1.PluginCapabilityVolumeExpansionType.ONLINE
            ]
            assert (await ident.probe(v1.ProbeRequest())).ready
            ccaps = await ctrl.controller_get_capabilities(v1.ControllerGetCapabilitiesRequest())
            assert [c.rpc.type for c in ccaps.capabilities if c.rpc] == [
                v1.ControllerServiceCapabilityRpcType.CREATE_DELETE_VOLUME
            ]
            ninfo = await node_stub.node_get_info(v1.NodeGetInfoRequest())
            assert ninfo.node_id == "node-1"
            assert ninfo.accessible_topology is not None
            assert ninfo.accessible_topology.segments == {"zone": "a"}

            with structlog.testing.capture_logs() as logs:
                with pytest.raises(GRPCError) as info_err:
                    await ctrl.create_volume(
                        v1.CreateVolumeRequest(name="deliberate", secrets={"t": SECRET})
                    )
                assert info_err.value.status is Status.RESOURCE_EXHAUSTED
                assert info_err.value.message == "pool full"

                with pytest.raises(GRPCError) as info_err:
                    await ctrl.create_volume(
                        v1.CreateVolumeRequest(name="boom", secrets={"t": SECRET})
                    )
                assert info_err.value.status is Status.INTERNAL
                assert "KeyError" in (info_err.value.message or "")
                assert SECRET not in (info_err.value.message or "")

                with pytest.raises(GRPCError) as info_err:
                    await ctrl.list_volumes(v1.ListVolumesRequest())
                assert info_err.value.status is Status.UNIMPLEMENTED

                # The server survived the unexpected exception.
                ok = await ctrl.create_volume(
                    v1.CreateVolumeRequest(name="fine", secrets={"t": SECRET})
                )
                assert ok.volume is not None
                assert ok.volume.volume_id == "fine"
            assert controller.calls == 3
            failed = [e for e in logs if e["event"] == "csi handler failed"]
            assert len(failed) == 1
            assert failed[0]["error_type"] == "KeyError"
            assert "Traceback" in failed[0]["traceback"]
            assert "create_volume" in failed[0]["traceback"]
            assert SECRET not in failed[0]["traceback"]
            requests = [str(e["request"]) for e in logs if e["event"] == "csi call"]
            assert len(requests) == 4
            assert all(SECRET not in r for r in requests)
            assert any("***stripped***" in r for r in requests)
        finally:
            channel.close()
    assert not path.exists()


class RawCodec(CodecBase):
    """Sends a payload's bytes as they are (to hand the server bytes no stub would send)."""

    __content_subtype__ = "proto"

    def encode(self, message: Any, message_type: Any) -> bytes:
        assert isinstance(message, bytes)
        return message

    def decode(self, data: bytes, message_type: Any) -> Any:
        return data


async def raw_call(path: pathlib.Path, method: str, payload: bytes) -> Status:
    channel = Channel(path=str(path), codec=RawCodec())
    try:
        call: UnaryUnaryMethod[bytes, bytes] = UnaryUnaryMethod(channel, method, bytes, bytes)
        try:
            await call(payload, timeout=5)
        except GRPCError as err:
            return err.status
        return Status.OK
    finally:
        channel.close()


def kit_identity() -> IdentityService:
    return IdentityService("kit.test", "0.1")


async def test_malformed_requests_never_reach_the_handler(sock_dir: pathlib.Path) -> None:
    # Regression: betterproto2 parses leniently and the kit handed its result over: a name whose
    # length ran past the end became a shorter name (another volume), a name sent as a varint
    # reached the handler as an int.
    controller = Controller()
    path = sock_dir / "csi.sock"
    async with CSIServer([kit_identity(), controller], f"unix://{path}"):
        for payload in (b"\x0a\x05ab", b"\x08\x05", b"\x0a\x02\xff\xfe", b"\x0f"):
            assert await raw_call(path, "/csi.v1.Controller/CreateVolume", payload) is (
                Status.INTERNAL
            )
        assert controller.calls == 0
        # A valid encoding with an unknown field is fine (protobuf keeps unknown fields).
        assert await raw_call(
            path, "/csi.v1.Controller/CreateVolume", b"\x0a\x01a\xf8\x01\x01"
        ) is (Status.OK)
        assert controller.calls == 1


async def test_unknown_methods_are_unimplemented_for_grpc_clients(sock_dir: pathlib.Path) -> None:
    # Regression: grpclib answered an unknown path with a Trailers-Only response lacking
    # content-type, which grpc clients (grpclib's, grpc-go's) read as UNKNOWN.
    path = sock_dir / "csi.sock"
    async with CSIServer([kit_identity(), Controller()], f"unix://{path}"):
        channel = Channel(path=str(path))
        try:
            with pytest.raises(GRPCError) as info:
                await v1.NodeStub(channel).node_get_info(v1.NodeGetInfoRequest())
            assert info.value.status is Status.UNIMPLEMENTED
            assert info.value.message == "unknown service csi.v1.Node"
            with pytest.raises(GRPCError) as info:
                await v1.ControllerStub(channel).list_volumes(v1.ListVolumesRequest())
            assert info.value.status is Status.UNIMPLEMENTED  # declared, not overridden
        finally:
            channel.close()
        # Paths outside the CSI spec get grpclib's own answer (see docs/reference/csi.md):
        # refused, whatever a client makes of the status.
        assert await raw_call(path, "/csi.v1.Controller/Nope", b"") in (
            Status.UNIMPLEMENTED,
            Status.UNKNOWN,
        )


async def test_messages_over_the_limit_are_resource_exhausted(sock_dir: pathlib.Path) -> None:
    controller = Controller()
    path = sock_dir / "csi.sock"
    identity = kit_identity()
    async with CSIServer([identity, controller], f"unix://{path}", max_receive_message_length=100):
        big = bytes(v1.CreateVolumeRequest(name="v" * 200))
        assert await raw_call(path, "/csi.v1.Controller/CreateVolume", big) is (
            Status.RESOURCE_EXHAUSTED
        )
        assert controller.calls == 0


async def test_closed_client_connections_are_forgotten(sock_dir: pathlib.Path) -> None:
    # Regression: the server kept every client connection it ever had (to close them on stop),
    # so a long-running driver grew with each connection.
    path = sock_dir / "csi.sock"
    async with CSIServer([kit_identity()], f"unix://{path}") as server:
        for _ in range(20):
            channel = Channel(path=str(path))
            await v1.IdentityStub(channel).probe(v1.ProbeRequest())
            assert server.connections >= 1
            channel.close()
        async with asyncio.timeout(5):
            while server.connections:
                await asyncio.sleep(0.01)
    assert server.connections == 0


class SnapshotMetadata(v1.SnapshotMetadataBase):
    """A server-streaming service: a few responses, or a deliberate error after one."""

    def __init__(self) -> None:
        self.requests: list[v1.GetMetadataAllocatedRequest] = []

    async def get_metadata_allocated(
        self, message: v1.GetMetadataAllocatedRequest
    ) -> AsyncIterator[v1.GetMetadataAllocatedResponse]:
        self.requests.append(message)
        yield v1.GetMetadataAllocatedResponse(volume_capacity_bytes=1)
        if message.snapshot_id == "fail":
            raise CSIError(Status.NOT_FOUND, "snapshot gone")
        yield v1.GetMetadataAllocatedResponse(volume_capacity_bytes=2)


async def test_server_streaming_methods_are_served_and_checked(sock_dir: pathlib.Path) -> None:
    service = SnapshotMetadata()
    path = sock_dir / "csi.sock"
    async with CSIServer([kit_identity(), service], f"unix://{path}"):
        channel = Channel(path=str(path))
        try:
            stub = v1.SnapshotMetadataStub(channel)
            request = v1.GetMetadataAllocatedRequest(snapshot_id="snap")
            sizes = [r.volume_capacity_bytes async for r in stub.get_metadata_allocated(request)]
            assert sizes == [1, 2]
            failing = v1.GetMetadataAllocatedRequest(snapshot_id="fail")
            with pytest.raises(GRPCError) as info:
                _ = [r async for r in stub.get_metadata_allocated(failing)]
            assert info.value.status is Status.NOT_FOUND
            assert info.value.message == "snapshot gone"
        finally:
            channel.close()
        # The request of a streaming method is checked like a unary one.
        method = "/csi.v1.SnapshotMetadata/GetMetadataAllocated"
        assert await raw_call(path, method, b"\x0a\x09snap") is Status.INTERNAL
        assert len(service.requests) == 2

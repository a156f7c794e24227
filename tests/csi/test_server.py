"""The CSI server kit: capabilities, error mapping, redacted request logging."""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
import structlog
from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import GRPCError
from raw_grpc import raw_call

from pyprovlib.csi._proto.csi import v1
from pyprovlib.csi._server import (
    CapabilityError,
    ControllerService,
    CSIError,
    CSIServer,
    GroupControllerService,
    IdentityService,
    NodeService,
    unix_socket_path,
)
from pyprovlib.csi._validate import (
    capacity_from_range,
    check_volume_capabilities,
    check_volume_capability,
    require,
    unsupported_capability,
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


async def raw_status(path: pathlib.Path, method: str, payload: bytes) -> Status:
    code, _ = await raw_call(path, method, payload)
    return Status(code)


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
            assert await raw_status(path, "/csi.v1.Controller/CreateVolume", payload) is (
                Status.INTERNAL
            )
        assert controller.calls == 0
        # A valid encoding with an unknown field is fine (protobuf keeps unknown fields).
        assert await raw_status(
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
        assert await raw_status(path, "/csi.v1.Controller/Nope", b"") in (
            Status.UNIMPLEMENTED,
            Status.UNKNOWN,
        )


async def test_messages_over_the_limit_are_resource_exhausted(sock_dir: pathlib.Path) -> None:
    controller = Controller()
    path = sock_dir / "csi.sock"
    identity = kit_identity()
    async with CSIServer([identity, controller], f"unix://{path}", max_receive_message_length=100):
        big = bytes(v1.CreateVolumeRequest(name="v" * 200))
        assert await raw_status(path, "/csi.v1.Controller/CreateVolume", big) is (
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
        assert await raw_status(path, method, b"\x0a\x09snap") is Status.INTERNAL
        assert len(service.requests) == 2


# -- the kit's helpers ----------------------------------------------------------------------------


def test_status_and_csierror_come_from_the_kit() -> None:
    from pyprovlib.csi import _server as server
    from pyprovlib.csi import _validate as validate

    assert server.Status is Status
    assert server.CSIError is validate.CSIError


def test_a_claimed_capability_without_its_rpc_refuses_to_start(sock_dir: pathlib.Path) -> None:
    class Half(ControllerService):
        async def create_volume(self, message: v1.CreateVolumeRequest) -> v1.CreateVolumeResponse:
            return v1.CreateVolumeResponse()

    caps = v1.ControllerServiceCapabilityRpcType
    half = Half([caps.CREATE_DELETE_VOLUME, caps.GET_CAPACITY])
    with pytest.raises(CapabilityError) as info:
        CSIServer([kit_identity(), half], str(sock_dir / "csi.sock"))
    text = str(info.value)
    assert "Half claims CREATE_DELETE_VOLUME but does not implement delete_volume" in text
    assert "Half claims GET_CAPACITY but does not implement get_capacity" in text
    assert "create_volume" not in text.replace("CREATE_DELETE_VOLUME", "")

    node = NodeService("n", [v1.NodeServiceCapabilityRpcType.STAGE_UNSTAGE_VOLUME])
    with pytest.raises(CapabilityError, match="node_stage_volume"):
        CSIServer([kit_identity(), node], str(sock_dir / "csi.sock"))
    group = GroupControllerService(
        [v1.GroupControllerServiceCapabilityRpcType.CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT]
    )
    with pytest.raises(CapabilityError, match="get_volume_group_snapshot"):
        CSIServer([kit_identity(), group], str(sock_dir / "csi.sock"))
    # An Identity promising a Controller service that is not served.
    promising = IdentityService(
        "kit.test", "0.1", services=[v1.PluginCapabilityServiceType.CONTROLLER_SERVICE]
    )
    with pytest.raises(CapabilityError, match="CONTROLLER_SERVICE but no Controller"):
        CSIServer([promising], str(sock_dir / "csi.sock"))
    # A test double may advertise what it does not serve, when it says so.
    CSIServer([kit_identity(), half], str(sock_dir / "csi.sock"), check_capabilities=False)


async def test_group_controller_capability_follows_the_service(sock_dir: pathlib.Path) -> None:
    class Group(GroupControllerService):
        async def get_volume_group_snapshot(
            self, message: v1.GetVolumeGroupSnapshotRequest
        ) -> v1.GetVolumeGroupSnapshotResponse:
            raise CSIError(Status.NOT_FOUND, "no such group")

    group_type = v1.PluginCapabilityServiceType.GROUP_CONTROLLER_SERVICE
    path = sock_dir / "csi.sock"
    for served, expected in (([Group()], True), ([], False)):
        # Declared or not, the Identity advertises GROUP_CONTROLLER_SERVICE iff one is served.
        identity = IdentityService("kit.test", "0.1", services=[group_type])
        async with CSIServer([identity, *served], f"unix://{path}"):
            channel = Channel(path=str(path))
            try:
                caps = await v1.IdentityStub(channel).get_plugin_capabilities(
                    v1.GetPluginCapabilitiesRequest()
                )
                types = [c.service.type for c in caps.capabilities if c.service]
                assert (group_type in types) is expected
                stub = v1.GroupControllerStub(channel)
                with pytest.raises(GRPCError) as info:
                    await stub.get_volume_group_snapshot(
                        v1.GetVolumeGroupSnapshotRequest(group_snapshot_id="g")
                    )
                wanted = Status.NOT_FOUND if expected else Status.UNIMPLEMENTED
                assert info.value.status is wanted
                ccaps = (
                    await stub.group_controller_get_capabilities(
                        v1.GroupControllerGetCapabilitiesRequest()
                    )
                    if expected
                    else None
                )
                assert ccaps is None or ccaps.capabilities == []
            finally:
                channel.close()


def test_validation_helpers_answer_the_spec_codes() -> None:
    mode = v1.VolumeCapabilityAccessModeMode
    mount = v1.VolumeCapability(
        mount=v1.VolumeCapabilityMountVolume(fs_type="ext4"),
        access_mode=v1.VolumeCapabilityAccessMode(mode=mode.SINGLE_NODE_WRITER),
    )
    block = v1.VolumeCapability(
        block=v1.VolumeCapabilityBlockVolume(),
        access_mode=v1.VolumeCapabilityAccessMode(mode=mode.MULTI_NODE_MULTI_WRITER),
    )

    def code(call: Any) -> Status | None:
        try:
            call()
        except CSIError as err:
            return err.status
        return None

    assert code(lambda: require(v1.CreateVolumeRequest(name="a"), "name")) is None
    with pytest.raises(CSIError, match="CreateVolumeRequest: volume_capabilities is required"):
        require(v1.CreateVolumeRequest(name="a"), "name", "volume_capabilities")
    assert code(lambda: require(v1.CreateVolumeRequest(), "name")) is Status.INVALID_ARGUMENT
    assert code(lambda: check_volume_capabilities([])) is Status.INVALID_ARGUMENT
    assert code(lambda: check_volume_capabilities([mount, block])) is None
    assert code(lambda: check_volume_capabilities([block], block=False)) is (
        Status.INVALID_ARGUMENT
    )
    assert code(lambda: check_volume_capabilities([v1.VolumeCapability()])) is (
        Status.INVALID_ARGUMENT
    )
    assert code(lambda: check_volume_capability(None)) is Status.INVALID_ARGUMENT
    assert (
        unsupported_capability(mount, fs_types={"xfs"})
        == "file system type 'ext4' is not supported"
    )
    assert unsupported_capability(block, access_modes={mode.SINGLE_NODE_WRITER}) == (
        "access mode MULTI_NODE_MULTI_WRITER is not supported"
    )
    assert unsupported_capability(mount, access_modes={mode.SINGLE_NODE_WRITER}) is None

    def size(required: int = 0, limit: int = 0, **kw: Any) -> int:
        return capacity_from_range(
            v1.CapacityRange(required_bytes=required, limit_bytes=limit), default=100, **kw
        )

    assert capacity_from_range(None, default=100) == 100
    assert size() == 100
    assert size(required=10) == 10
    assert size(limit=50) == 50
    assert size(required=10, granularity=8) == 16
    assert code(lambda: size(required=10, limit=12, granularity=8)) is Status.OUT_OF_RANGE
    assert code(lambda: size(required=20, limit=10)) is Status.OUT_OF_RANGE
    assert code(lambda: size(required=200, maximum=100)) is Status.OUT_OF_RANGE
    assert code(lambda: size(required=-1)) is Status.INVALID_ARGUMENT

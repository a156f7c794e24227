"""The CSI server kit: capabilities, error mapping, redacted request logging."""

from __future__ import annotations

import pathlib

import pytest
import structlog
from grpclib.client import Channel
from grpclib.const import Status
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
    node = NodeService(
        "node-1",
        [v1.NodeServiceCapabilityRpcType.STAGE_UNSTAGE_VOLUME],
        accessible_topology={"zone": "a"},
    )
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
                    await ctrl.delete_volume(v1.DeleteVolumeRequest(volume_id="x"))
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

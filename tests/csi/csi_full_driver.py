"""The in-memory CSI test driver of ``csi_driver`` with what the attacher and the resizer need
too: ControllerPublishVolume / ControllerUnpublishVolume, ControllerExpandVolume and
ControllerModifyVolume, for the tests of ``python -m pyprovlib.csi`` (the controllers in one
process) and its bench.

Every call is recorded in ``state.calls`` (method, request), Identity calls included, so a test
can count how often the sidecars connected (GetPluginInfo is asked once per connection).
"""

from __future__ import annotations

import contextlib
import pathlib
from collections.abc import AsyncIterator

from csi_driver import DriverState, TestController, TestIdentity
from grpclib.const import Status

from pyprovlib.csi._proto.csi import v1
from pyprovlib.csi._server import CSIError, CSIServer

Caps = v1.ControllerServiceCapabilityRpcType


class FullIdentity(TestIdentity):
    """Records GetPluginInfo (one per connection a sidecar opens)."""

    __test__ = False

    async def get_plugin_info(self, message: v1.GetPluginInfoRequest) -> v1.GetPluginInfoResponse:
        self.state.calls.append(("GetPluginInfo", message))
        return await super().get_plugin_info(message)


class FullController(TestController):
    """Create/delete (from the test driver), publish/unpublish (read-only too), expand and
    modify (the mutable parameters of each volume, by volume id, in :attr:`mutable`)."""

    __test__ = False

    def __init__(self, state: DriverState) -> None:
        super().__init__(state, topology=False, snapshots=False)
        self.capabilities = frozenset(
            {
                Caps.CREATE_DELETE_VOLUME,
                Caps.MODIFY_VOLUME,
                Caps.PUBLISH_UNPUBLISH_VOLUME,
                Caps.PUBLISH_READONLY,
                Caps.EXPAND_VOLUME,
                *([Caps.GET_CAPACITY] if state.capacity is not None else []),
            }
        )
        self.published: dict[str, set[str]] = {}
        self.mutable: dict[str, dict[str, str]] = {}

    def _volume(self, volume_id: str) -> str:
        for name, volume in self.state.volumes.items():
            if volume.volume_id == volume_id:
                return name
        raise CSIError(Status.NOT_FOUND, f"volume {volume_id} not found")

    async def controller_publish_volume(
        self, message: v1.ControllerPublishVolumeRequest
    ) -> v1.ControllerPublishVolumeResponse:
        await self.state.called("ControllerPublishVolume", message)
        self._volume(message.volume_id)
        self.published.setdefault(message.volume_id, set()).add(message.node_id)
        return v1.ControllerPublishVolumeResponse(
            publish_context={"devicePath": f"/dev/test/{message.volume_id}"}
        )

    async def controller_unpublish_volume(
        self, message: v1.ControllerUnpublishVolumeRequest
    ) -> v1.ControllerUnpublishVolumeResponse:
        await self.state.called("ControllerUnpublishVolume", message)
        self.published.get(message.volume_id, set()).discard(message.node_id)
        return v1.ControllerUnpublishVolumeResponse()

    async def controller_expand_volume(
        self, message: v1.ControllerExpandVolumeRequest
    ) -> v1.ControllerExpandVolumeResponse:
        await self.state.called("ControllerExpandVolume", message)
        volume = self.state.volumes[self._volume(message.volume_id)]
        required = message.capacity_range.required_bytes if message.capacity_range else 0
        volume.capacity = max(volume.capacity, required)
        return v1.ControllerExpandVolumeResponse(
            capacity_bytes=volume.capacity, node_expansion_required=False
        )

    async def create_volume(self, message: v1.CreateVolumeRequest) -> v1.CreateVolumeResponse:
        response = await super().create_volume(message)
        if response.volume is not None and message.mutable_parameters:
            self.mutable.setdefault(response.volume.volume_id, {}).update(
                message.mutable_parameters
            )
        return response

    async def controller_modify_volume(
        self, message: v1.ControllerModifyVolumeRequest
    ) -> v1.ControllerModifyVolumeResponse:
        await self.state.called("ControllerModifyVolume", message)
        self._volume(message.volume_id)
        self.mutable.setdefault(message.volume_id, {}).update(message.mutable_parameters)
        return v1.ControllerModifyVolumeResponse()


@contextlib.asynccontextmanager
async def serve_full_driver(
    directory: pathlib.Path, state: DriverState | None = None
) -> AsyncIterator[tuple[DriverState, FullController, CSIServer]]:
    """Serve the driver on ``directory/csi.sock`` until the block ends."""
    state = state or DriverState()
    controller = FullController(state)
    server = CSIServer(
        [FullIdentity(state, topology=False), controller], f"unix://{directory / 'csi.sock'}"
    )
    async with server:
        yield state, controller, server

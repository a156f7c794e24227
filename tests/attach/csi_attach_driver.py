"""A CSI driver for the attacher tests, served over a real unix socket with pyprovlib's kit.

It publishes volumes to nodes in memory, records every publish/unpublish request, lists what it
published (with paging) when asked to have LIST_VOLUMES_PUBLISHED_NODES, and takes injected
faults per method: a gRPC status for some calls, or a delay after which the call still
completes (a slow backend). It can be stopped and started again on the same socket with its
state kept, like a driver container restarting.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from csi_faults import Fault, play
from grpclib.const import Status

from pyprovlib.csi._proto.csi import v1
from pyprovlib.csi._server import ControllerService, CSIError, CSIServer, IdentityService

Caps = v1.ControllerServiceCapabilityRpcType

ATTACH_CAPS = (Caps.PUBLISH_UNPUBLISH_VOLUME, Caps.PUBLISH_READONLY)
LIST_CAPS = (Caps.LIST_VOLUMES, Caps.LIST_VOLUMES_PUBLISHED_NODES)


@dataclass
class AttachDriverState:
    """What the driver knows; survives restarts."""

    published: dict[str, set[str]] = field(default_factory=dict)
    publish_requests: list[v1.ControllerPublishVolumeRequest] = field(default_factory=list)
    unpublish_requests: list[v1.ControllerUnpublishVolumeRequest] = field(default_factory=list)
    list_requests: list[v1.ListVolumesRequest] = field(default_factory=list)
    faults: dict[str, list[Fault]] = field(default_factory=dict)

    def fail(self, method: str, fault: Fault) -> None:
        self.faults.setdefault(method, []).append(fault)

    def is_published(self, volume_id: str, node_id: str) -> bool:
        return node_id in self.published.get(volume_id, set())

    async def apply_fault(self, method: str) -> None:
        await play(self.faults.get(method))


class AttachController(ControllerService):
    """Publish/unpublish/list over :class:`AttachDriverState`."""

    def __init__(self, state: AttachDriverState, capabilities: Iterable[Caps]) -> None:
        super().__init__(capabilities)
        self.state = state

    async def controller_publish_volume(
        self, message: v1.ControllerPublishVolumeRequest
    ) -> v1.ControllerPublishVolumeResponse:
        self.state.publish_requests.append(message)
        await self.state.apply_fault("ControllerPublishVolume")
        if not message.volume_id or not message.node_id:
            raise CSIError(Status.INVALID_ARGUMENT, "volume_id and node_id are required")
        self.state.published.setdefault(message.volume_id, set()).add(message.node_id)
        return v1.ControllerPublishVolumeResponse(
            publish_context={"devicePath": f"/dev/disk/{message.volume_id}"}
        )

    async def controller_unpublish_volume(
        self, message: v1.ControllerUnpublishVolumeRequest
    ) -> v1.ControllerUnpublishVolumeResponse:
        self.state.unpublish_requests.append(message)
        await self.state.apply_fault("ControllerUnpublishVolume")
        nodes = self.state.published.get(message.volume_id)
        if nodes is not None:
            nodes.discard(message.node_id)
        return v1.ControllerUnpublishVolumeResponse()

    async def list_volumes(self, message: v1.ListVolumesRequest) -> v1.ListVolumesResponse:
        self.state.list_requests.append(message)
        await self.state.apply_fault("ListVolumes")
        ids = sorted(self.state.published)
        start = int(message.starting_token or 0)
        end = len(ids) if not message.max_entries else start + message.max_entries
        entries = [
            v1.ListVolumesResponseEntry(
                volume=v1.Volume(volume_id=volume_id),
                status=v1.ListVolumesResponseVolumeStatus(
                    published_node_ids=sorted(self.state.published[volume_id])
                ),
            )
            for volume_id in ids[start:end]
        ]
        return v1.ListVolumesResponse(
            entries=entries, next_token=str(end) if end < len(ids) else ""
        )


class AttachDriver:
    """The driver process: ``start()``/``stop()`` (a restart keeps the state)."""

    def __init__(
        self,
        name: str,
        socket: Path,
        *,
        controller_service: bool = True,
        capabilities: Iterable[Caps] = ATTACH_CAPS,
    ) -> None:
        self.name = name
        self.socket = socket
        self.state = AttachDriverState()
        services = [v1.PluginCapabilityServiceType.CONTROLLER_SERVICE] if controller_service else []
        self.identity = IdentityService(name, "1.0.0", services=services)
        self.controller = AttachController(self.state, capabilities)
        self._server: CSIServer | None = None

    @property
    def endpoint(self) -> str:
        return f"unix://{self.socket}"

    async def start(self) -> None:
        services = [self.identity, self.controller]
        # Advertises capabilities it does not serve: the sidecar's reaction is under test.
        self._server = CSIServer(services, self.endpoint, check_capabilities=False)
        await self._server.start()

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop()
            self._server = None

    async def __aenter__(self) -> AttachDriver:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

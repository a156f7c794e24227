"""A CSI driver for the resizer tests, served over a real unix socket with pyprovlib's kit.

It keeps volume sizes in memory, expands them on ControllerExpandVolume (rounding up to
``granularity`` bytes, never shrinking), records every request, says whether the node must
still expand (``node_expansion_required``), and takes injected faults: a gRPC status for the
next calls, or a delay after which the call still completes. With MODIFY_VOLUME it keeps each
volume's mutable parameters, refusing keys outside ``mutable_keys`` as INVALID_ARGUMENT.
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
EXPAND_CAPS = (Caps.EXPAND_VOLUME,)
MODIFY_CAPS = (Caps.EXPAND_VOLUME, Caps.MODIFY_VOLUME)


@dataclass
class ResizeDriverState:
    """What the driver knows."""

    sizes: dict[str, int] = field(default_factory=dict)
    requests: list[v1.ControllerExpandVolumeRequest] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    node_expansion_required: bool = False
    granularity: int = 1
    max_size: int | None = None
    mutable: dict[str, dict[str, str]] = field(default_factory=dict)
    modify_requests: list[v1.ControllerModifyVolumeRequest] = field(default_factory=list)
    mutable_keys: frozenset[str] = frozenset({"iops", "throughput"})

    def fail(self, fault: Fault) -> None:
        self.faults.append(fault)

    async def apply_fault(self) -> None:
        await play(self.faults)


class ResizeControllerService(ControllerService):
    """ControllerExpandVolume over :class:`ResizeDriverState`."""

    def __init__(self, state: ResizeDriverState, capabilities: Iterable[Caps]) -> None:
        super().__init__(capabilities)
        self.state = state

    async def controller_expand_volume(
        self, message: v1.ControllerExpandVolumeRequest
    ) -> v1.ControllerExpandVolumeResponse:
        self.state.requests.append(message)
        await self.state.apply_fault()
        if not message.volume_id:
            raise CSIError(Status.INVALID_ARGUMENT, "volume_id is required")
        if message.volume_id not in self.state.sizes:
            raise CSIError(Status.NOT_FOUND, f"volume {message.volume_id} not found")
        required = message.capacity_range.required_bytes if message.capacity_range else 0
        if self.state.max_size is not None and required > self.state.max_size:
            raise CSIError(
                Status.OUT_OF_RANGE,
                f"requested {required} bytes, more than the maximum of {self.state.max_size}",
            )
        g = self.state.granularity
        rounded = -(-required // g) * g
        size = max(self.state.sizes[message.volume_id], rounded)
        self.state.sizes[message.volume_id] = size
        return v1.ControllerExpandVolumeResponse(
            capacity_bytes=size, node_expansion_required=self.state.node_expansion_required
        )

    async def controller_modify_volume(
        self, message: v1.ControllerModifyVolumeRequest
    ) -> v1.ControllerModifyVolumeResponse:
        self.state.modify_requests.append(message)
        await self.state.apply_fault()
        if message.volume_id not in self.state.sizes:
            raise CSIError(Status.NOT_FOUND, f"volume {message.volume_id} not found")
        unknown = sorted(set(message.mutable_parameters) - self.state.mutable_keys)
        if unknown:
            raise CSIError(Status.INVALID_ARGUMENT, f"invalid parameters: {unknown}")
        self.state.mutable.setdefault(message.volume_id, {}).update(message.mutable_parameters)
        return v1.ControllerModifyVolumeResponse()


class ResizeDriver:
    """The driver process: ``async with`` starts and stops it."""

    def __init__(
        self,
        name: str,
        socket: Path,
        *,
        capabilities: Iterable[Caps] = EXPAND_CAPS,
        volume_expansion: v1.PluginCapabilityVolumeExpansionType | None = None,
    ) -> None:
        self.name = name
        self.socket = socket
        self.state = ResizeDriverState()
        self.identity = IdentityService(
            name,
            "1.0.0",
            services=[v1.PluginCapabilityServiceType.CONTROLLER_SERVICE],
            volume_expansion=volume_expansion,
        )
        self.controller = ResizeControllerService(self.state, capabilities)
        self._server: CSIServer | None = None

    @property
    def endpoint(self) -> str:
        return f"unix://{self.socket}"

    async def __aenter__(self) -> ResizeDriver:
        # Advertises capabilities it does not serve: the sidecar's reaction is under test.
        self._server = CSIServer(
            [self.identity, self.controller], self.endpoint, check_capabilities=False
        )
        await self._server.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            await self._server.stop()
            self._server = None

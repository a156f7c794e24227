"""An in-memory CSI driver for the tests, served over a real unix socket with pyprovlib's kit.

It keeps volumes and snapshots in dicts, records every request it receives, and takes injected
faults per method: a delay, a gRPC status (for a number of calls), an undersized answer, a
volume restored without its content source.
"""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

from csi_faults import Fault, play
from grpclib.const import Status

from pyprovlib.csi._proto.csi import v1
from pyprovlib.csi._server import (
    ControllerService,
    CSIError,
    CSIServer,
    IdentityService,
    NodeService,
)

DRIVER_NAME = "test.csi.pyprovlib.io"
TOPOLOGY_KEY = "topology.test.csi/zone"

Caps = v1.ControllerServiceCapabilityRpcType
Plugin = v1.PluginCapabilityServiceType


@dataclass
class Volume:
    volume_id: str
    name: str
    capacity: int
    parameters: dict[str, str]
    topology: dict[str, str] | None
    source: v1.VolumeContentSource | None


@dataclass
class Snapshot:
    snapshot_id: str
    name: str
    source_volume_id: str
    size: int


@dataclass
class DriverState:
    name: str = DRIVER_NAME
    """The driver name GetPluginInfo reports (the provisioner's name). Tests on a shared
    cluster give every driver its own, so one test's provisioner never acts on (and deletes
    the volume handles of) the PVs another test left behind."""
    volumes: dict[str, Volume] = field(default_factory=dict)
    snapshots: dict[str, Snapshot] = field(default_factory=dict)
    calls: list[tuple[str, object]] = field(default_factory=list)
    create_started: list[float] = field(default_factory=list)
    """``time.monotonic()`` as each CreateVolume call came in: lower bounds on retry delays
    hold however slow the machine is, where a count read at some moment would not."""
    faults: dict[str, list[Fault]] = field(default_factory=dict)
    ready: bool = True
    undersize_by: int = 0
    drop_content_source: bool = False
    """Answer CreateVolume without the volume's content source (a driver that ignored it)."""
    capacity: dict[str, int] | None = None
    """Storage per value of :data:`TOPOLOGY_KEY` ('' without topology): set, the driver has
    GET_CAPACITY, reports what its volumes leave there, and refuses a volume that does not
    fit with RESOURCE_EXHAUSTED."""
    created: asyncio.Event = field(default_factory=asyncio.Event)
    next_volume: int = 0
    """The number of the last volume created (``vol-N``): kept here, with the volumes, so a
    driver served again on this state (a restart) never reuses an ID."""
    _next_snapshot: int = 0

    def fail(self, method: str, fault: Fault) -> None:
        self.faults.setdefault(method, []).append(fault)

    def take_snapshot(self, source_volume_id: str, name: str = "") -> Snapshot:
        """Snapshot a volume (what CreateSnapshot does; idempotent by name)."""
        for existing in self.snapshots.values():
            if name and existing.name == name:
                return existing
        volume = next((v for v in self.volumes.values() if v.volume_id == source_volume_id), None)
        if volume is None:
            raise CSIError(Status.NOT_FOUND, f"volume {source_volume_id} not found")
        self._next_snapshot += 1
        snap = Snapshot(
            snapshot_id=f"snap-{self._next_snapshot}",
            name=name or f"snapshot-{self._next_snapshot}",
            source_volume_id=source_volume_id,
            size=volume.capacity,
        )
        self.snapshots[snap.snapshot_id] = snap
        return snap

    def requests(self, method: str) -> list[Any]:
        return [r for m, r in self.calls if m == method]

    def available(self, zone: str) -> int:
        """What the volumes leave of the storage of ``zone`` (with :attr:`capacity`)."""
        total = (self.capacity or {}).get(zone, 0)
        used = sum(
            v.capacity
            for v in self.volumes.values()
            if (v.topology or {}).get(TOPOLOGY_KEY, "") == zone
        )
        return max(0, total - used)

    async def apply_fault(self, method: str) -> None:
        await play(self.faults.get(method))

    async def called(self, method: str, message: object) -> None:
        """Record the call of ``method`` with ``message``, then play its fault, if any."""
        self.calls.append((method, message))
        await self.apply_fault(method)


class TestIdentity(IdentityService):
    __test__ = False  # a driver service, not a pytest test class

    def __init__(self, state: DriverState, *, topology: bool) -> None:
        services = [Plugin.CONTROLLER_SERVICE]
        if topology:
            services.append(Plugin.VOLUME_ACCESSIBILITY_CONSTRAINTS)
        super().__init__(state.name, "1.0.0", services=services)
        self.state = state

    async def is_ready(self) -> bool:
        await self.state.apply_fault("Probe")
        return self.state.ready


class TestController(ControllerService):
    __test__ = False  # a driver service, not a pytest test class

    def __init__(
        self, state: DriverState, *, topology: bool, snapshots: bool = True, modify: bool = False
    ) -> None:
        caps = [
            Caps.CREATE_DELETE_VOLUME,
            Caps.CLONE_VOLUME,
            *([Caps.MODIFY_VOLUME] if modify else []),
        ]
        if snapshots:
            caps.append(Caps.CREATE_DELETE_SNAPSHOT)
        if state.capacity is not None:
            caps.append(Caps.GET_CAPACITY)
        super().__init__(caps)
        self.state = state
        self.topology = topology

    async def create_volume(self, message: v1.CreateVolumeRequest) -> v1.CreateVolumeResponse:
        self.state.calls.append(("CreateVolume", message))
        self.state.create_started.append(time.monotonic())
        await self.state.apply_fault("CreateVolume")
        if not message.name:
            raise CSIError(Status.INVALID_ARGUMENT, "name missing")
        if not message.volume_capabilities:
            raise CSIError(Status.INVALID_ARGUMENT, "volume capabilities missing")
        existing = self.state.volumes.get(message.name)
        if existing is None:
            required = message.capacity_range.required_bytes if message.capacity_range else 0
            capacity = max(required, 1 << 20) - self.state.undersize_by
            topology: dict[str, str] | None = None
            if self.topology:
                req = message.accessibility_requirements
                if req is not None and req.preferred:
                    topology = dict(req.preferred[0].segments)
                elif req is not None and req.requisite:
                    topology = dict(req.requisite[0].segments)
                else:
                    topology = {TOPOLOGY_KEY: "zone-default"}
            if self.state.capacity is not None:
                zone = (topology or {}).get(TOPOLOGY_KEY, "")
                if capacity > self.state.available(zone):
                    raise CSIError(
                        Status.RESOURCE_EXHAUSTED,
                        f"{capacity} bytes do not fit in {zone or 'the storage'}: "
                        f"{self.state.available(zone)} bytes left",
                    )
            source = message.volume_content_source
            known = {v.volume_id for v in self.state.volumes.values()}
            cloned = source.volume if source is not None else None
            if cloned is not None and cloned.volume_id not in known:
                raise CSIError(Status.NOT_FOUND, "source volume not found")
            restored = source.snapshot if source is not None else None
            if restored is not None:
                snap = self.state.snapshots.get(restored.snapshot_id)
                if snap is None:
                    raise CSIError(Status.NOT_FOUND, "source snapshot not found")
                if required and required < snap.size:
                    raise CSIError(Status.OUT_OF_RANGE, "volume smaller than the snapshot")
            self.state.next_volume += 1
            existing = Volume(
                volume_id=f"vol-{self.state.next_volume}",
                name=message.name,
                capacity=capacity,
                parameters=dict(message.parameters),
                topology=topology,
                source=source,
            )
            self.state.volumes[message.name] = existing
            self.state.created.set()
        return v1.CreateVolumeResponse(
            volume=v1.Volume(
                volume_id=existing.volume_id,
                capacity_bytes=existing.capacity,
                volume_context={"fromDriver": "yes"},
                accessible_topology=(
                    [v1.Topology(segments=existing.topology)] if existing.topology else []
                ),
                content_source=None if self.state.drop_content_source else existing.source,
            )
        )

    async def create_snapshot(self, message: v1.CreateSnapshotRequest) -> v1.CreateSnapshotResponse:
        await self.state.called("CreateSnapshot", message)
        if not message.name or not message.source_volume_id:
            raise CSIError(Status.INVALID_ARGUMENT, "name and source_volume_id are required")
        snap = self.state.take_snapshot(message.source_volume_id, message.name)
        return v1.CreateSnapshotResponse(
            snapshot=v1.Snapshot(
                snapshot_id=snap.snapshot_id,
                source_volume_id=snap.source_volume_id,
                size_bytes=snap.size,
                ready_to_use=True,
            )
        )

    async def delete_snapshot(self, message: v1.DeleteSnapshotRequest) -> v1.DeleteSnapshotResponse:
        await self.state.called("DeleteSnapshot", message)
        self.state.snapshots.pop(message.snapshot_id, None)
        return v1.DeleteSnapshotResponse()

    async def get_capacity(self, message: v1.GetCapacityRequest) -> v1.GetCapacityResponse:
        await self.state.called("GetCapacity", message)
        if self.state.capacity is None:
            raise CSIError(Status.UNIMPLEMENTED, "GetCapacity is not implemented")
        topology = message.accessible_topology
        zone = topology.segments.get(TOPOLOGY_KEY, "") if topology is not None else ""
        available = self.state.available(zone)
        return v1.GetCapacityResponse(available_capacity=available, maximum_volume_size=available)

    async def delete_volume(self, message: v1.DeleteVolumeRequest) -> v1.DeleteVolumeResponse:
        await self.state.called("DeleteVolume", message)
        for name, volume in list(self.state.volumes.items()):
            if volume.volume_id == message.volume_id:
                del self.state.volumes[name]
        return v1.DeleteVolumeResponse()

    async def controller_modify_volume(
        self, message: v1.ControllerModifyVolumeRequest
    ) -> v1.ControllerModifyVolumeResponse:
        await self.state.called("ControllerModifyVolume", message)
        return v1.ControllerModifyVolumeResponse()


def socket_dir(tmp_path: pathlib.Path) -> tuple[pathlib.Path, bool]:
    """A directory for the socket: tmp_path unless its path is too long for AF_UNIX."""
    if len(str(tmp_path / "csi.sock")) < 100:
        return tmp_path, False
    return pathlib.Path(tempfile.mkdtemp(prefix="pcsi-")), True


@contextlib.asynccontextmanager
async def serve_driver(
    directory: pathlib.Path,
    *,
    topology: bool = False,
    state: DriverState | None = None,
    snapshots: bool = True,
    modify: bool = False,
    node: str | None = None,
) -> AsyncIterator[tuple[DriverState, CSIServer]]:
    """The test driver on ``directory/csi.sock``; with ``node``, also a Node service whose
    NodeGetInfo reports that node ID and (with ``topology``) the segment
    ``{TOPOLOGY_KEY: node}``, as a driver deployed on that node would."""
    state = state or DriverState()
    services: list[Any] = [
        TestIdentity(state, topology=topology),
        TestController(state, topology=topology, snapshots=snapshots, modify=modify),
    ]
    if node is not None:
        services.append(
            NodeService(node, accessible_topology={TOPOLOGY_KEY: node} if topology else None)
        )
    server = CSIServer(
        services,
        f"unix://{directory / 'csi.sock'}",
    )
    async with server:
        yield state, server


@contextlib.contextmanager
def short_socket_dir(tmp_path: pathlib.Path) -> Iterator[pathlib.Path]:
    directory, temporary = socket_dir(tmp_path)
    try:
        yield directory
    finally:
        if temporary:
            shutil.rmtree(directory, ignore_errors=True)

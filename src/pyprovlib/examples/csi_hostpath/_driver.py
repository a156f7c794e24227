"""The CSI services of the hostpath driver: Identity, Controller and Node on
:mod:`pyprovlib.csi._server`, following kubernetes-csi/csi-driver-host-path's behaviour.

A volume is a directory in the state directory; a snapshot a copy of one. Node staging and
publishing create the directories the CO names and record them; with ``mount="bind"``
(:mod:`.mounter`) they also bind-mount the volume there, so pods on a real node use it; without,
the driver runs unprivileged, a faithful CSI peer for sidecars and csi-sanity. Every RPC
validates its request with :mod:`pyprovlib.csi._validate` and answers the spec's codes; create
and delete calls are idempotent; state changes are saved before the answer goes out.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import posixpath
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from pyprovlib._logging import get_logger
from pyprovlib.csi._proto.csi import v1
from pyprovlib.csi._server import (
    ControllerService,
    CSIError,
    GroupControllerService,
    IdentityService,
    NodeService,
    Status,
)
from pyprovlib.csi._validate import (
    capacity_from_range,
    check_volume_capabilities,
    check_volume_capability,
    require,
    unsupported_capability,
)
from pyprovlib.examples.csi_hostpath._mounter import mounter_for
from pyprovlib.examples.csi_hostpath._state import (
    GroupSnapshot,
    Snapshot,
    State,
    Volume,
    new_id,
    valid_id,
)

__all__ = [
    "DEFAULT_MUTABLE_PARAMETERS",
    "DEFAULT_VOLUME_SIZE",
    "TOPOLOGY_KEY",
    "DriverOptions",
    "HostPathController",
    "HostPathGroupController",
    "HostPathIdentity",
    "HostPathNode",
]

log = get_logger(__name__)

TOPOLOGY_KEY = "topology.hostpath.csi/node"
"""The topology segment key, as the Go driver names it."""

GIB = 1 << 30
TIB = 1 << 40
DEFAULT_VOLUME_SIZE = GIB
"""Size of a volume created without a capacity range."""
DEFAULT_MUTABLE_PARAMETERS = ("iops", "throughput")
"""The mutable parameters the driver accepts unless told otherwise: a volume's performance, the
usual subject of a VolumeAttributesClass. They are recorded, not enforced (a directory has no
IOPS)."""

Ctl = v1.ControllerServiceCapabilityRpcType
Nod = v1.NodeServiceCapabilityRpcType
T = TypeVar("T")


@dataclass(frozen=True)
class DriverOptions:
    """What the command line decides (the Go hostpathplugin's flag names in comments)."""

    drivername: str = "hostpath.csi.k8s.io"  # --drivername
    nodeid: str = ""  # --nodeid
    statedir: str = "/csi-data-dir"  # --statedir
    enable_attach: bool = False  # --enable-attach
    max_volumes_per_node: int = 0  # --maxvolumespernode
    capacity: int = TIB  # --capacity (total bytes the driver offers)
    max_volume_size: int = TIB  # --max-volume-size
    mount: str = "record"  # --mount: record (no mounts) or bind (a real node plugin)
    vendor_version: str = "0.1.0"
    enable_controller_modify_volume: bool = True  # --enable-controller-modify-volume
    accepted_mutable_parameter_names: tuple[str, ...] = DEFAULT_MUTABLE_PARAMETERS
    """The mutable parameters (VolumeAttributesClass keys) the driver accepts
    (``--accepted-mutable-parameter-names``); any other is INVALID_ARGUMENT. Empty: every key,
    as the Go driver when the flag is not given."""


def _page(items: Sequence[T], starting_token: str, max_entries: int) -> tuple[list[T], str]:
    """One page of ``items`` from the index in ``starting_token``; ABORTED for a token this
    driver did not hand out, as the spec asks."""
    if max_entries < 0:
        raise CSIError(Status.INVALID_ARGUMENT, "max_entries must not be negative")
    start = 0
    if starting_token:
        if not starting_token.isdigit() or int(starting_token) > len(items):
            raise CSIError(Status.ABORTED, f"starting_token {starting_token!r} is not valid")
        start = int(starting_token)
    end = len(items) if max_entries == 0 else min(len(items), start + max_entries)
    return list(items[start:end]), (str(end) if end < len(items) else "")


def _checked_path(value: str, field: str) -> str:
    """A path the CO sends (target, staging, volume path): absolute and normalized, or
    INVALID_ARGUMENT."""
    if "\x00" in value or not value.startswith("/") or posixpath.normpath(value) != value:
        raise CSIError(Status.INVALID_ARGUMENT, f"{field} must be an absolute, normalized path")
    if value == "/":
        raise CSIError(Status.INVALID_ARGUMENT, f"{field} must not be /")
    return value


def _check_fits(size: int, source_size: int, source: str) -> None:
    """OUT_OF_RANGE when a volume of ``size`` bytes cannot hold its ``source`` (a snapshot or
    a volume to clone)."""
    if source_size > size:
        raise CSIError(
            Status.OUT_OF_RANGE,
            f"the volume ({size} bytes) is smaller than its {source} ({source_size} bytes)",
        )


def _timestamp(ns: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(ns / 1e9, tz=datetime.UTC)


class Driver:
    """The state shared by the services, and the lock that orders its changes."""

    def __init__(self, options: DriverOptions, state: State) -> None:
        self.options = options
        self.state = state
        self.lock = asyncio.Lock()
        self.mounter = mounter_for(options.mount)

    @classmethod
    async def open(cls, options: DriverOptions) -> Driver:
        """Load (or create) the state in ``options.statedir``."""
        return cls(options, await asyncio.to_thread(State.load, options.statedir))

    async def save(self) -> None:
        await asyncio.to_thread(self.state.save)

    def volume(self, volume_id: str) -> Volume:
        found = self.state.volumes.get(volume_id) if valid_id(volume_id) else None
        if found is None:
            raise CSIError(Status.NOT_FOUND, f"volume {volume_id!r} does not exist")
        return found

    def snapshot(self, snapshot_id: str) -> Snapshot:
        found = self.state.snapshots.get(snapshot_id) if valid_id(snapshot_id) else None
        if found is None:
            raise CSIError(Status.NOT_FOUND, f"snapshot {snapshot_id!r} does not exist")
        return found

    def topology(self) -> list[v1.Topology]:
        return [v1.Topology(segments={TOPOLOGY_KEY: self.options.nodeid})]

    def used(self) -> int:
        return sum(v.capacity_bytes for v in self.state.volumes.values())

    def csi_volume(self, volume: Volume) -> v1.Volume:
        source: v1.VolumeContentSource | None = None
        if volume.source_snapshot_id:
            source = v1.VolumeContentSource(
                snapshot=v1.VolumeContentSourceSnapshotSource(snapshot_id=volume.source_snapshot_id)
            )
        elif volume.source_volume_id:
            source = v1.VolumeContentSource(
                volume=v1.VolumeContentSourceVolumeSource(volume_id=volume.source_volume_id)
            )
        return v1.Volume(
            volume_id=volume.volume_id,
            capacity_bytes=volume.capacity_bytes,
            volume_context=dict(volume.parameters),
            content_source=source,
            accessible_topology=self.topology(),
        )


def _csi_snapshot(snapshot: Snapshot) -> v1.Snapshot:
    return v1.Snapshot(
        snapshot_id=snapshot.snapshot_id,
        source_volume_id=snapshot.source_volume_id,
        size_bytes=snapshot.size_bytes,
        creation_time=_timestamp(snapshot.creation_time_ns),
        ready_to_use=True,
        group_snapshot_id=snapshot.group_snapshot_id,
    )


class HostPathIdentity(IdentityService):
    """Identity: the driver's name, CONTROLLER_SERVICE, topology, online expansion."""

    def __init__(self, options: DriverOptions) -> None:
        super().__init__(
            options.drivername,
            options.vendor_version,
            services=[
                v1.PluginCapabilityServiceType.CONTROLLER_SERVICE,
                v1.PluginCapabilityServiceType.VOLUME_ACCESSIBILITY_CONSTRAINTS,
            ],
            volume_expansion=v1.PluginCapabilityVolumeExpansionType.ONLINE,
        )


class HostPathController(ControllerService):
    """Controller: volumes, snapshots, capacity, expansion, modification of the mutable
    parameters (``--enable-controller-modify-volume``) and (``--enable-attach``) publishing to
    the one node this driver knows."""

    def __init__(self, driver: Driver) -> None:
        capabilities = [
            Ctl.CREATE_DELETE_VOLUME,
            Ctl.LIST_VOLUMES,
            Ctl.GET_CAPACITY,
            Ctl.CREATE_DELETE_SNAPSHOT,
            Ctl.LIST_SNAPSHOTS,
            Ctl.CLONE_VOLUME,
            Ctl.EXPAND_VOLUME,
            Ctl.GET_SNAPSHOT,
            Ctl.SINGLE_NODE_MULTI_WRITER,
        ]
        if driver.options.enable_attach:
            capabilities.append(Ctl.PUBLISH_UNPUBLISH_VOLUME)
        if driver.options.enable_controller_modify_volume:
            capabilities.append(Ctl.MODIFY_VOLUME)
        super().__init__(capabilities)
        self.driver = driver

    def _check_mutable(self, parameters: dict[str, str]) -> None:
        """INVALID_ARGUMENT for mutable parameters this driver does not take: all of them
        without MODIFY_VOLUME, the keys outside ``--accepted-mutable-parameter-names`` with it
        (a claim asking for them shows Infeasible)."""
        if not parameters:
            return
        options = self.driver.options
        if not options.enable_controller_modify_volume:
            raise CSIError(
                Status.INVALID_ARGUMENT,
                "mutable parameters given, but this driver does not modify volumes "
                "(--enable-controller-modify-volume=false)",
            )
        accepted = options.accepted_mutable_parameter_names
        unknown = sorted(k for k in parameters if accepted and k not in accepted)
        if unknown:
            raise CSIError(
                Status.INVALID_ARGUMENT,
                f"invalid mutable parameters {unknown}: this driver accepts {sorted(accepted)}",
            )

    # -- volumes ----------------------------------------------------------------------------

    async def create_volume(self, message: v1.CreateVolumeRequest) -> v1.CreateVolumeResponse:
        require(message, "name")
        check_volume_capabilities(message.volume_capabilities, block=False)
        self._check_mutable(dict(message.mutable_parameters))
        options = self.driver.options
        size = capacity_from_range(
            message.capacity_range, default=DEFAULT_VOLUME_SIZE, maximum=options.max_volume_size
        )
        source = message.volume_content_source
        async with self.driver.lock:
            state = self.driver.state
            for existing in state.volumes.values():
                if existing.name != message.name:
                    continue
                # Idempotent: the same request again gets the same volume.
                wanted_snapshot = source.snapshot.snapshot_id if source and source.snapshot else ""
                wanted_volume = source.volume.volume_id if source and source.volume else ""
                if (
                    existing.capacity_bytes < size
                    or (
                        message.capacity_range
                        and message.capacity_range.limit_bytes
                        and existing.capacity_bytes > message.capacity_range.limit_bytes
                    )
                    or existing.source_snapshot_id != wanted_snapshot
                    or existing.source_volume_id != wanted_volume
                ):
                    raise CSIError(
                        Status.ALREADY_EXISTS,
                        f"volume {message.name!r} exists with a different size or source",
                    )
                return v1.CreateVolumeResponse(volume=self.driver.csi_volume(existing))
            volume = Volume(
                volume_id=new_id(),
                name=message.name,
                capacity_bytes=size,
                parameters=dict(message.parameters),
                mutable_parameters=dict(message.mutable_parameters),
            )
            copy_from: str | None = None
            if source is not None and source.snapshot is not None:
                snapshot = self.driver.snapshot(source.snapshot.snapshot_id)
                _check_fits(size, snapshot.size_bytes, "snapshot")
                volume.source_snapshot_id = snapshot.snapshot_id
                copy_from = state.snapshot_path(snapshot.snapshot_id)
            elif source is not None and source.volume is not None:
                origin = self.driver.volume(source.volume.volume_id)
                _check_fits(size, origin.capacity_bytes, "source")
                volume.source_volume_id = origin.volume_id
                copy_from = state.volume_path(origin.volume_id)
            if self.driver.used() + size > options.capacity:
                raise CSIError(
                    Status.RESOURCE_EXHAUSTED,
                    f"not enough capacity for {size} bytes "
                    f"({options.capacity - self.driver.used()} bytes free)",
                )
            await asyncio.to_thread(state.make_volume_dir, volume.volume_id)
            if copy_from is not None:
                await asyncio.to_thread(state.copy_into_volume, copy_from, volume.volume_id)
            state.volumes[volume.volume_id] = volume
            await self.driver.save()
        log.info("volume created", volume=volume.volume_id, name=volume.name, size=size)
        return v1.CreateVolumeResponse(volume=self.driver.csi_volume(volume))

    async def delete_volume(self, message: v1.DeleteVolumeRequest) -> v1.DeleteVolumeResponse:
        require(message, "volume_id")
        async with self.driver.lock:
            state = self.driver.state
            volume = state.volumes.get(message.volume_id) if valid_id(message.volume_id) else None
            if volume is None:
                return v1.DeleteVolumeResponse()  # already gone: idempotent
            if volume.attached_nodes:
                raise CSIError(
                    Status.FAILED_PRECONDITION,
                    f"volume {volume.volume_id} is still published to {volume.attached_nodes}",
                )
            await asyncio.to_thread(state.remove_volume_dir, volume.volume_id)
            del state.volumes[volume.volume_id]
            await self.driver.save()
        log.info("volume deleted", volume=volume.volume_id)
        return v1.DeleteVolumeResponse()

    async def validate_volume_capabilities(
        self, message: v1.ValidateVolumeCapabilitiesRequest
    ) -> v1.ValidateVolumeCapabilitiesResponse:
        require(message, "volume_id", "volume_capabilities")
        self.driver.volume(message.volume_id)  # NOT_FOUND when it does not exist
        for capability in message.volume_capabilities:
            reason = unsupported_capability(capability, block=False)
            if reason is not None:
                return v1.ValidateVolumeCapabilitiesResponse(message=reason)
        return v1.ValidateVolumeCapabilitiesResponse(
            confirmed=v1.ValidateVolumeCapabilitiesResponseConfirmed(
                volume_context=dict(message.volume_context),
                volume_capabilities=list(message.volume_capabilities),
                parameters=dict(message.parameters),
            )
        )

    async def list_volumes(self, message: v1.ListVolumesRequest) -> v1.ListVolumesResponse:
        volumes = list(self.driver.state.volumes.values())
        page, token = _page(volumes, message.starting_token, message.max_entries)
        return v1.ListVolumesResponse(
            entries=[v1.ListVolumesResponseEntry(volume=self.driver.csi_volume(v)) for v in page],
            next_token=token,
        )

    async def get_capacity(self, message: v1.GetCapacityRequest) -> v1.GetCapacityResponse:
        for capability in message.volume_capabilities:
            if unsupported_capability(capability, block=False) is not None:
                return v1.GetCapacityResponse(available_capacity=0)
        options = self.driver.options
        # A real figure: what --capacity leaves after the volumes, and never more than the
        # file system holding them has free (volumes are directories, not preallocated).
        try:
            usage = await asyncio.to_thread(os.statvfs, options.statedir)
        except OSError as err:
            raise CSIError(
                Status.INTERNAL, f"cannot read the free space of {options.statedir}: {err}"
            ) from None
        free = usage.f_bavail * usage.f_frsize
        available = max(0, min(free, options.capacity - self.driver.used()))
        return v1.GetCapacityResponse(
            available_capacity=available,
            maximum_volume_size=min(available, options.max_volume_size),
        )

    async def controller_expand_volume(
        self, message: v1.ControllerExpandVolumeRequest
    ) -> v1.ControllerExpandVolumeResponse:
        require(message, "volume_id", "capacity_range")
        options = self.driver.options
        async with self.driver.lock:
            volume = self.driver.volume(message.volume_id)
            size = capacity_from_range(
                message.capacity_range,
                default=volume.capacity_bytes,
                maximum=options.max_volume_size,
            )
            if size > volume.capacity_bytes:
                if self.driver.used() - volume.capacity_bytes + size > options.capacity:
                    raise CSIError(Status.RESOURCE_EXHAUSTED, f"not enough capacity for {size}")
                volume.capacity_bytes = size
                await self.driver.save()
        return v1.ControllerExpandVolumeResponse(
            capacity_bytes=volume.capacity_bytes, node_expansion_required=True
        )

    async def controller_modify_volume(
        self, message: v1.ControllerModifyVolumeRequest
    ) -> v1.ControllerModifyVolumeResponse:
        """Set the given mutable parameters of a volume (keys not given keep their values,
        as the spec asks; none given changes nothing); idempotent."""
        require(message, "volume_id")
        parameters = dict(message.mutable_parameters)
        self._check_mutable(parameters)
        async with self.driver.lock:
            volume = self.driver.volume(message.volume_id)
            wanted = {**volume.mutable_parameters, **parameters}
            if wanted != volume.mutable_parameters:
                volume.mutable_parameters = wanted
                await self.driver.save()
        log.info("volume modified", volume=volume.volume_id, parameters=sorted(parameters))
        return v1.ControllerModifyVolumeResponse()

    # -- publishing -------------------------------------------------------------------------

    async def controller_publish_volume(
        self, message: v1.ControllerPublishVolumeRequest
    ) -> v1.ControllerPublishVolumeResponse:
        require(message, "volume_id", "node_id", "volume_capability")
        check_volume_capability(message.volume_capability, block=False)
        async with self.driver.lock:
            volume = self.driver.volume(message.volume_id)
            if message.node_id != self.driver.options.nodeid:
                raise CSIError(Status.NOT_FOUND, f"node {message.node_id!r} does not exist")
            if message.node_id not in volume.attached_nodes:
                volume.attached_nodes.append(message.node_id)
                await self.driver.save()
        return v1.ControllerPublishVolumeResponse(publish_context={})

    async def controller_unpublish_volume(
        self, message: v1.ControllerUnpublishVolumeRequest
    ) -> v1.ControllerUnpublishVolumeResponse:
        require(message, "volume_id")
        async with self.driver.lock:
            volume = (
                self.driver.state.volumes.get(message.volume_id)
                if valid_id(message.volume_id)
                else None
            )
            # A volume or node that is gone counts as unpublished (the spec's "SHOULD return 0").
            if volume is not None:
                remaining = [
                    n for n in volume.attached_nodes if message.node_id and n != message.node_id
                ]
                if remaining != volume.attached_nodes:
                    volume.attached_nodes = remaining
                    await self.driver.save()
        return v1.ControllerUnpublishVolumeResponse()

    # -- snapshots --------------------------------------------------------------------------

    async def create_snapshot(self, message: v1.CreateSnapshotRequest) -> v1.CreateSnapshotResponse:
        require(message, "name", "source_volume_id")
        async with self.driver.lock:
            state = self.driver.state
            for existing in state.snapshots.values():
                if existing.name == message.name:
                    if existing.source_volume_id != message.source_volume_id:
                        raise CSIError(
                            Status.ALREADY_EXISTS,
                            f"snapshot {message.name!r} exists for another volume",
                        )
                    return v1.CreateSnapshotResponse(snapshot=_csi_snapshot(existing))
            volume = self.driver.volume(message.source_volume_id)
            snapshot = Snapshot(
                snapshot_id=new_id(),
                name=message.name,
                source_volume_id=volume.volume_id,
                size_bytes=volume.capacity_bytes,
                creation_time_ns=time.time_ns(),
            )
            await asyncio.to_thread(state.take_snapshot, volume.volume_id, snapshot.snapshot_id)
            state.snapshots[snapshot.snapshot_id] = snapshot
            await self.driver.save()
        log.info("snapshot created", snapshot=snapshot.snapshot_id, volume=volume.volume_id)
        return v1.CreateSnapshotResponse(snapshot=_csi_snapshot(snapshot))

    async def delete_snapshot(self, message: v1.DeleteSnapshotRequest) -> v1.DeleteSnapshotResponse:
        require(message, "snapshot_id")
        async with self.driver.lock:
            state = self.driver.state
            snapshot = (
                state.snapshots.get(message.snapshot_id) if valid_id(message.snapshot_id) else None
            )
            if snapshot is not None and snapshot.group_snapshot_id:
                raise CSIError(
                    Status.FAILED_PRECONDITION,
                    f"snapshot {snapshot.snapshot_id} belongs to group snapshot "
                    f"{snapshot.group_snapshot_id}: delete the group",
                )
            if snapshot is not None:
                await asyncio.to_thread(state.remove_snapshot_dir, snapshot.snapshot_id)
                del state.snapshots[snapshot.snapshot_id]
                await self.driver.save()
        return v1.DeleteSnapshotResponse()

    async def get_snapshot(self, message: v1.GetSnapshotRequest) -> v1.GetSnapshotResponse:
        require(message, "snapshot_id")
        found = self.driver.snapshot(message.snapshot_id)
        return v1.GetSnapshotResponse(snapshot=_csi_snapshot(found))

    async def list_snapshots(self, message: v1.ListSnapshotsRequest) -> v1.ListSnapshotsResponse:
        snapshots = list(self.driver.state.snapshots.values())
        if message.snapshot_id:
            snapshots = [s for s in snapshots if s.snapshot_id == message.snapshot_id]
        if message.source_volume_id:
            snapshots = [s for s in snapshots if s.source_volume_id == message.source_volume_id]
        page, token = _page(snapshots, message.starting_token, message.max_entries)
        return v1.ListSnapshotsResponse(
            entries=[v1.ListSnapshotsResponseEntry(snapshot=_csi_snapshot(s)) for s in page],
            next_token=token,
        )


class HostPathGroupController(GroupControllerService):
    """GroupController: snapshots of several volumes taken together (serving it makes the
    Identity advertise GROUP_CONTROLLER_SERVICE)."""

    def __init__(self, driver: Driver) -> None:
        super().__init__(
            [v1.GroupControllerServiceCapabilityRpcType.CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT]
        )
        self.driver = driver

    def _group(self, group: GroupSnapshot) -> v1.VolumeGroupSnapshot:
        snapshots = self.driver.state.snapshots
        return v1.VolumeGroupSnapshot(
            group_snapshot_id=group.group_snapshot_id,
            snapshots=[_csi_snapshot(snapshots[i]) for i in group.snapshot_ids if i in snapshots],
            creation_time=_timestamp(group.creation_time_ns),
            ready_to_use=True,
        )

    def _found(self, group_snapshot_id: str) -> GroupSnapshot | None:
        if not valid_id(group_snapshot_id):
            return None
        return self.driver.state.groups.get(group_snapshot_id)

    async def create_volume_group_snapshot(
        self, message: v1.CreateVolumeGroupSnapshotRequest
    ) -> v1.CreateVolumeGroupSnapshotResponse:
        require(message, "name", "source_volume_ids")
        async with self.driver.lock:
            state = self.driver.state
            for existing in state.groups.values():
                if existing.name != message.name:
                    continue
                sources = sorted(state.snapshots[i].source_volume_id for i in existing.snapshot_ids)
                if sources != sorted(message.source_volume_ids):
                    raise CSIError(
                        Status.ALREADY_EXISTS,
                        f"group snapshot {message.name!r} exists for other volumes",
                    )
                return v1.CreateVolumeGroupSnapshotResponse(group_snapshot=self._group(existing))
            volumes = [self.driver.volume(i) for i in message.source_volume_ids]
            now = time.time_ns()
            group = GroupSnapshot(new_id(), message.name, [], now)
            for volume in volumes:
                snapshot = Snapshot(
                    snapshot_id=new_id(),
                    name=f"{message.name}-{volume.volume_id}",
                    source_volume_id=volume.volume_id,
                    size_bytes=volume.capacity_bytes,
                    creation_time_ns=now,
                    group_snapshot_id=group.group_snapshot_id,
                )
                await asyncio.to_thread(state.take_snapshot, volume.volume_id, snapshot.snapshot_id)
                state.snapshots[snapshot.snapshot_id] = snapshot
                group.snapshot_ids.append(snapshot.snapshot_id)
            state.groups[group.group_snapshot_id] = group
            await self.driver.save()
        return v1.CreateVolumeGroupSnapshotResponse(group_snapshot=self._group(group))

    async def delete_volume_group_snapshot(
        self, message: v1.DeleteVolumeGroupSnapshotRequest
    ) -> v1.DeleteVolumeGroupSnapshotResponse:
        require(message, "group_snapshot_id")
        async with self.driver.lock:
            state = self.driver.state
            group = self._found(message.group_snapshot_id)
            if group is None:
                return v1.DeleteVolumeGroupSnapshotResponse()  # already gone: idempotent
            if message.snapshot_ids and sorted(message.snapshot_ids) != sorted(group.snapshot_ids):
                raise CSIError(
                    Status.INVALID_ARGUMENT, "snapshot_ids do not match the group snapshot"
                )
            for snapshot_id in group.snapshot_ids:
                await asyncio.to_thread(state.remove_snapshot_dir, snapshot_id)
                state.snapshots.pop(snapshot_id, None)
            del state.groups[group.group_snapshot_id]
            await self.driver.save()
        return v1.DeleteVolumeGroupSnapshotResponse()

    async def get_volume_group_snapshot(
        self, message: v1.GetVolumeGroupSnapshotRequest
    ) -> v1.GetVolumeGroupSnapshotResponse:
        require(message, "group_snapshot_id")
        group = self._found(message.group_snapshot_id)
        if group is None:
            raise CSIError(
                Status.NOT_FOUND, f"group snapshot {message.group_snapshot_id!r} does not exist"
            )
        return v1.GetVolumeGroupSnapshotResponse(group_snapshot=self._group(group))


class HostPathNode(NodeService):
    """Node: staging and publishing as directories, volume stats, expansion."""

    def __init__(self, driver: Driver) -> None:
        options = driver.options
        super().__init__(
            options.nodeid,
            [
                Nod.STAGE_UNSTAGE_VOLUME,
                Nod.GET_VOLUME_STATS,
                Nod.EXPAND_VOLUME,
                Nod.SINGLE_NODE_MULTI_WRITER,
            ],
            max_volumes_per_node=options.max_volumes_per_node,
            accessible_topology={TOPOLOGY_KEY: options.nodeid},
        )
        self.driver = driver

    async def _bind(self, source: str, path: str, paths: list[str], *, read_only: bool) -> None:
        """Stage or publish: bind-mount ``source`` at ``path`` (the directory the CO named,
        created first) and record ``path`` among a volume's staged or published ``paths``
        (saved before the answer goes out); under the driver's lock."""
        await asyncio.to_thread(os.makedirs, path, 0o750, True)
        await self.driver.mounter.bind(source, path, read_only=read_only)
        if path not in paths:
            paths.append(path)
            await self.driver.save()

    async def _unbind(
        self, message: v1.NodeUnstageVolumeRequest | v1.NodeUnpublishVolumeRequest, field: str
    ) -> str:
        """Unstage or unpublish: drop the path in ``field`` from the volume's staged or published
        paths, unmount it and return it. A volume or path already gone is success (both calls
        are idempotent); under the driver's lock."""
        require(message, "volume_id", field)
        path = _checked_path(getattr(message, field), field)
        volume = self.driver.state.volumes.get(message.volume_id)
        if volume is not None:
            paths = (
                volume.staged_paths if field == "staging_target_path" else volume.published_paths
            )
            if path in paths:
                paths.remove(path)
                await self.driver.save()
        await self.driver.mounter.unmount(path)
        return path

    async def node_stage_volume(
        self, message: v1.NodeStageVolumeRequest
    ) -> v1.NodeStageVolumeResponse:
        require(message, "volume_id", "staging_target_path", "volume_capability")
        path = _checked_path(message.staging_target_path, "staging_target_path")
        check_volume_capability(message.volume_capability, block=False)
        async with self.driver.lock:
            volume = self.driver.volume(message.volume_id)
            source = self.driver.state.volume_path(volume.volume_id)
            await self._bind(source, path, volume.staged_paths, read_only=False)
        return v1.NodeStageVolumeResponse()

    async def node_unstage_volume(
        self, message: v1.NodeUnstageVolumeRequest
    ) -> v1.NodeUnstageVolumeResponse:
        async with self.driver.lock:
            await self._unbind(message, "staging_target_path")
        return v1.NodeUnstageVolumeResponse()

    async def node_publish_volume(
        self, message: v1.NodePublishVolumeRequest
    ) -> v1.NodePublishVolumeResponse:
        require(message, "volume_id", "target_path", "volume_capability")
        path = _checked_path(message.target_path, "target_path")
        if message.staging_target_path:
            _checked_path(message.staging_target_path, "staging_target_path")
        capability = check_volume_capability(message.volume_capability, block=False)
        single_writer = v1.VolumeCapabilityAccessModeMode.SINGLE_NODE_SINGLE_WRITER
        async with self.driver.lock:
            volume = self.driver.volume(message.volume_id)
            elsewhere = [p for p in volume.published_paths if p != path]
            if capability.access_mode is not None and (
                capability.access_mode.mode == single_writer and elsewhere
            ):
                raise CSIError(
                    Status.FAILED_PRECONDITION,
                    f"volume {volume.volume_id} is single-writer and already published "
                    "at another target path",
                )
            source = message.staging_target_path or self.driver.state.volume_path(volume.volume_id)
            await self._bind(source, path, volume.published_paths, read_only=message.readonly)
        return v1.NodePublishVolumeResponse()

    async def node_unpublish_volume(
        self, message: v1.NodeUnpublishVolumeRequest
    ) -> v1.NodeUnpublishVolumeResponse:
        async with self.driver.lock:
            path = await self._unbind(message, "target_path")
            # The spec: the plugin deletes what it created at the target path. Only an empty
            # directory goes (rmdir): whatever else is there is not ours to remove.
            try:
                await asyncio.to_thread(os.rmdir, path)
            except (FileNotFoundError, NotADirectoryError):
                pass
            except OSError as err:
                raise CSIError(
                    Status.INTERNAL, f"cannot remove target_path: {err.strerror}"
                ) from None
        return v1.NodeUnpublishVolumeResponse()

    async def node_get_volume_stats(
        self, message: v1.NodeGetVolumeStatsRequest
    ) -> v1.NodeGetVolumeStatsResponse:
        require(message, "volume_id", "volume_path")
        volume = self.driver.volume(message.volume_id)
        path = message.volume_path
        # A path the volume is not staged or published at is NOT_FOUND, as the spec has it.
        if path not in volume.published_paths and path not in volume.staged_paths:
            raise CSIError(Status.NOT_FOUND, f"volume {volume.volume_id} is not at volume_path")
        if not await asyncio.to_thread(os.path.isdir, path):
            raise CSIError(Status.NOT_FOUND, "volume_path does not exist")
        used = await asyncio.to_thread(self.driver.state.used_bytes, volume.volume_id)
        total = volume.capacity_bytes
        return v1.NodeGetVolumeStatsResponse(
            usage=[
                v1.VolumeUsage(
                    unit=v1.VolumeUsageUnit.BYTES,
                    total=total,
                    used=used,
                    available=max(0, total - used),
                )
            ]
        )

    async def node_expand_volume(
        self, message: v1.NodeExpandVolumeRequest
    ) -> v1.NodeExpandVolumeResponse:
        require(message, "volume_id", "volume_path")
        volume = self.driver.volume(message.volume_id)
        _checked_path(message.volume_path, "volume_path")
        if message.capacity_range is not None:
            size = capacity_from_range(message.capacity_range, default=volume.capacity_bytes)
            if size > volume.capacity_bytes:
                raise CSIError(
                    Status.OUT_OF_RANGE,
                    f"the volume has {volume.capacity_bytes} bytes; expand it on the controller "
                    "first",
                )
        return v1.NodeExpandVolumeResponse(capacity_bytes=volume.capacity_bytes)

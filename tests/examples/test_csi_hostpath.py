"""The example CSI driver beyond csi-sanity: state kept across a restart, paths and ids a caller
sends never reaching the filesystem unchecked."""

from __future__ import annotations

import asyncio
import os
import pathlib

import pytest
from csi_hostpath_support import MOUNT, serving
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from pyprovlib.csi._proto.csi import v1


async def status_of(call: object) -> Status | None:
    try:
        await call  # type: ignore[misc]
    except GRPCError as err:
        return err.status
    return None


async def test_volumes_and_snapshots_survive_a_restart(short_dir: pathlib.Path) -> None:
    async with serving(short_dir) as channel:
        ctrl = v1.ControllerStub(channel)
        created = await ctrl.create_volume(
            v1.CreateVolumeRequest(name="pvc-1", volume_capabilities=[MOUNT])
        )
        assert created.volume is not None
        volume_id = created.volume.volume_id
        data = short_dir / "state" / "volumes" / volume_id
        (data / "file").write_text("kept")
        snap = await ctrl.create_snapshot(
            v1.CreateSnapshotRequest(name="snap-1", source_volume_id=volume_id)
        )
        assert snap.snapshot is not None
        assert snap.snapshot.creation_time is not None
    async with serving(short_dir) as channel:
        ctrl = v1.ControllerStub(channel)
        again = await ctrl.create_volume(
            v1.CreateVolumeRequest(name="pvc-1", volume_capabilities=[MOUNT])
        )
        assert again.volume is not None
        assert again.volume.volume_id == volume_id  # idempotent across the restart
        listed = await ctrl.list_snapshots(v1.ListSnapshotsRequest(source_volume_id=volume_id))
        assert [e.snapshot.snapshot_id for e in listed.entries if e.snapshot] == [
            snap.snapshot.snapshot_id
        ]
        restored = await ctrl.create_volume(
            v1.CreateVolumeRequest(
                name="pvc-2",
                volume_capabilities=[MOUNT],
                volume_content_source=v1.VolumeContentSource(
                    snapshot=v1.VolumeContentSourceSnapshotSource(
                        snapshot_id=snap.snapshot.snapshot_id
                    )
                ),
            )
        )
        assert restored.volume is not None
        copy = short_dir / "state" / "volumes" / restored.volume.volume_id / "file"
        assert copy.read_text() == "kept"


def free_bytes(path: pathlib.Path) -> int:
    usage = os.statvfs(path)
    return usage.f_bavail * usage.f_frsize


async def test_get_capacity_reports_free_space_within_the_configured_capacity(
    short_dir: pathlib.Path,
) -> None:
    """GetCapacity (what --enable-capacity publishes) is a real figure: the free space of the
    file system holding the volumes, and no more than --capacity leaves after the volumes."""
    state = short_dir / "state"
    async with serving(short_dir) as channel:  # --capacity 1Ti: more than this disk has
        ctrl = v1.ControllerStub(channel)
        before = free_bytes(state)
        reply = await ctrl.get_capacity(v1.GetCapacityRequest())
        after = free_bytes(state)
        assert min(before, after) <= reply.available_capacity <= max(before, after)
        assert reply.maximum_volume_size == reply.available_capacity
    gib = 1 << 30
    if free_bytes(state) < 20 * gib:
        pytest.skip("needs 20Gi free where the test's state directory is")
    async with serving(short_dir, capacity=10 * gib, max_volume_size=5 * gib) as channel:
        ctrl = v1.ControllerStub(channel)
        reply = await ctrl.get_capacity(v1.GetCapacityRequest(parameters={"kind": "any"}))
        assert (reply.available_capacity, reply.maximum_volume_size) == (10 * gib, 5 * gib)
        for name in ("pvc-1", "pvc-2"):
            await ctrl.create_volume(
                v1.CreateVolumeRequest(
                    name=name,
                    volume_capabilities=[MOUNT],
                    capacity_range=v1.CapacityRange(required_bytes=3 * gib),
                )
            )
        reply = await ctrl.get_capacity(v1.GetCapacityRequest())
        assert (reply.available_capacity, reply.maximum_volume_size) == (4 * gib, 4 * gib)


async def test_ids_and_paths_from_callers_are_checked(short_dir: pathlib.Path) -> None:
    outside = short_dir / "outside"
    outside.mkdir()
    (outside / "precious").write_text("x")
    async with serving(short_dir) as channel:
        ctrl, node = v1.ControllerStub(channel), v1.NodeStub(channel)
        created = await ctrl.create_volume(
            v1.CreateVolumeRequest(name="pvc-1", volume_capabilities=[MOUNT])
        )
        assert created.volume is not None
        volume_id = created.volume.volume_id
        # Ids that are not the driver's own never name a directory: "../outside" deletes
        # nothing, and is simply not found.
        for bad in ("../outside", "..", "/etc", "a/b"):
            assert await status_of(ctrl.delete_volume(v1.DeleteVolumeRequest(volume_id=bad))) is (
                None
            )
            assert await status_of(
                ctrl.create_snapshot(v1.CreateSnapshotRequest(name="s", source_volume_id=bad))
            ) is (Status.NOT_FOUND)
        assert (outside / "precious").exists()
        for target in ("relative/path", f"{short_dir}/mnt/../outside", "/"):
            assert await status_of(
                node.node_publish_volume(
                    v1.NodePublishVolumeRequest(
                        volume_id=volume_id, target_path=target, volume_capability=MOUNT
                    )
                )
            ) is (Status.INVALID_ARGUMENT)
        target = str(short_dir / "mnt" / "target")
        publish = v1.NodePublishVolumeRequest(
            volume_id=volume_id, target_path=target, volume_capability=MOUNT
        )
        await node.node_publish_volume(publish)
        await node.node_publish_volume(publish)  # idempotent
        assert await asyncio.to_thread(os.path.isdir, target)
        await node.node_unpublish_volume(
            v1.NodeUnpublishVolumeRequest(volume_id=volume_id, target_path=target)
        )
        assert not await asyncio.to_thread(os.path.exists, target)
        # Size limits answer the spec's codes.
        too_big = v1.CreateVolumeRequest(
            name="huge",
            volume_capabilities=[MOUNT],
            capacity_range=v1.CapacityRange(required_bytes=2 << 40),
        )
        assert await status_of(ctrl.create_volume(too_big)) is Status.OUT_OF_RANGE

"""How the example CSI driver's node service makes a volume appear: ``--mount=record`` (no
mounts, unprivileged) and ``--mount=bind`` (real bind mounts, for a kubelet). The bind tests
need root; they mount only under their own temporary directory and unmount before they end."""

from __future__ import annotations

import os
import pathlib
import subprocess
from collections.abc import Iterator

import pytest
from csi_hostpath_support import MOUNT, serving
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from pyprovlib.csi._proto.csi import v1
from pyprovlib.csi._server import CSIError
from pyprovlib.examples.csi_hostpath import _cli as cli
from pyprovlib.examples.csi_hostpath._mounter import (
    BindMounter,
    RecordingMounter,
    is_mount_point,
    mounter_for,
)

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="bind mounts need root")


@pytest.fixture
def short_dir(short_dir: pathlib.Path) -> Iterator[pathlib.Path]:
    yield short_dir
    # Whatever a failed test left mounted goes before the directory does.
    for point in sorted(
        (p for p in _points() if p.startswith(f"{short_dir}/")), key=len, reverse=True
    ):
        subprocess.run(["umount", "--lazy", point], check=False)


def _write(path: str, text: str) -> None:
    pathlib.Path(path).write_text(text)


def _read(path: str) -> str:
    return pathlib.Path(path).read_text()


def _exists(path: str) -> bool:
    return os.path.exists(path)


def _points() -> list[str]:
    with open("/proc/self/mountinfo") as mountinfo:
        return [line.split()[4] for line in mountinfo if line.strip()]


def test_mount_modes() -> None:
    assert isinstance(mounter_for("record"), RecordingMounter)
    assert isinstance(mounter_for("bind"), BindMounter)
    with pytest.raises(ValueError, match="record, bind"):
        mounter_for("overlay")


def test_mount_points_are_found_for_bind_mounts_too(tmp_path: pathlib.Path) -> None:
    assert is_mount_point("/")
    assert not is_mount_point(str(tmp_path))


def test_cli_takes_the_mount_mode() -> None:
    parser = cli.build_parser()
    assert parser.parse_args(["--nodeid", "n"]).mount == "record"
    assert parser.parse_args(["--nodeid", "n", "--mount=bind"]).mount == "bind"
    with pytest.raises(SystemExit):
        parser.parse_args(["--nodeid", "n", "--mount=loop"])


async def test_recording_mounter_mounts_nothing(tmp_path: pathlib.Path) -> None:
    (tmp_path / "target").mkdir()
    await RecordingMounter().bind(str(tmp_path), str(tmp_path / "target"), read_only=False)
    assert not is_mount_point(str(tmp_path / "target"))


@needs_root
async def test_bind_mounter_is_idempotent_and_honours_read_only(short_dir: pathlib.Path) -> None:
    source, rw, ro = short_dir / "source", short_dir / "rw", short_dir / "ro"
    for directory in (source, rw, ro):
        directory.mkdir()
    (source / "file").write_text("data")
    mounter = BindMounter()
    await mounter.bind(str(source), str(rw), read_only=False)
    await mounter.bind(str(source), str(rw), read_only=False)  # again: success, one mount
    assert _points().count(str(rw)) == 1
    assert (rw / "file").read_text() == "data"
    with pytest.raises(CSIError) as caught:
        await mounter.bind(str(source), str(rw), read_only=True)
    assert caught.value.status == Status.ALREADY_EXISTS

    await mounter.bind(str(source), str(ro), read_only=True)
    with pytest.raises(OSError, match="Read-only"):
        (ro / "new").write_text("x")

    for target in (rw, ro):
        await mounter.unmount(str(target))
        await mounter.unmount(str(target))  # again: success
        assert not is_mount_point(str(target))
    assert (source / "file").read_text() == "data"


async def test_bind_mounter_failure_is_an_internal_error(short_dir: pathlib.Path) -> None:
    # As root, mount fails on a source that does not exist; otherwise on the privilege.
    source = str(short_dir / "missing") if os.geteuid() == 0 else str(short_dir)
    (short_dir / "target").mkdir()
    with pytest.raises(CSIError) as caught:
        await BindMounter().bind(source, str(short_dir / "target"), read_only=False)
    assert caught.value.status == Status.INTERNAL
    assert "mount failed" in str(caught.value)


@needs_root
async def test_stage_and_publish_bind_the_volume_there(short_dir: pathlib.Path) -> None:
    """NodeStage mounts the volume at the staging path, NodePublish the staging path at the
    target (read-only when asked); unpublish and unstage leave no mount behind."""
    staging, target = str(short_dir / "staging"), str(short_dir / "target")
    async with serving(short_dir, mount="bind") as channel:
        controller = v1.ControllerStub(channel)
        node = v1.NodeStub(channel)
        created = await controller.create_volume(
            v1.CreateVolumeRequest(name="vol", volume_capabilities=[MOUNT])
        )
        assert created.volume is not None
        volume_id = created.volume.volume_id
        await node.node_stage_volume(
            v1.NodeStageVolumeRequest(
                volume_id=volume_id, staging_target_path=staging, volume_capability=MOUNT
            )
        )
        assert is_mount_point(staging)
        await node.node_publish_volume(
            v1.NodePublishVolumeRequest(
                volume_id=volume_id,
                staging_target_path=staging,
                target_path=target,
                volume_capability=MOUNT,
                readonly=True,
            )
        )
        assert is_mount_point(target)
        _write(f"{staging}/written", "through the staging path")
        assert _read(f"{target}/written") == "through the staging path"
        with pytest.raises(OSError, match="Read-only"):
            _write(f"{target}/refused", "x")

        await node.node_unpublish_volume(
            v1.NodeUnpublishVolumeRequest(volume_id=volume_id, target_path=target)
        )
        assert not _exists(target)
        await node.node_unstage_volume(
            v1.NodeUnstageVolumeRequest(volume_id=volume_id, staging_target_path=staging)
        )
        assert not is_mount_point(staging)
        # The data stayed in the volume.
        listed = await controller.list_volumes(v1.ListVolumesRequest())
        assert [e.volume.volume_id if e.volume else None for e in listed.entries] == [volume_id]
        with pytest.raises(GRPCError):
            await node.node_publish_volume(
                v1.NodePublishVolumeRequest(
                    volume_id="nope", target_path=target, volume_capability=MOUNT
                )
            )
    assert not [p for p in _points() if p.startswith(str(short_dir))]

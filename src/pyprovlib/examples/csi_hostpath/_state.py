"""The driver's state — volumes, snapshots, where they are published — persisted as one JSON
file in the state directory, with each volume's and snapshot's data in a directory beside it.

Names and paths a caller sends never become file names here: volumes and snapshots live in
directories named by ids the driver generates (UUIDs), checked as single path components
before use, and every filesystem operation goes through :mod:`pyprovlib.examples._paths`, which
never follows a symbolic link out of the state directory. The functions here block; the
driver runs them with :func:`asyncio.to_thread`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import uuid
from dataclasses import dataclass, field
from typing import Any

from pyprovlib.examples._paths import make_directory_beneath, remove_beneath, validate_component

__all__ = ["GroupSnapshot", "Snapshot", "State", "Volume", "new_id", "valid_id"]

VOLUMES = "volumes"
SNAPSHOTS = "snapshots"
STATE_FILE = "state.json"


def new_id() -> str:
    """A fresh volume or snapshot id (also its directory name)."""
    return str(uuid.uuid4())


def valid_id(value: str) -> bool:
    """Whether ``value`` can be an id this driver generated (so it may name a directory)."""
    try:
        return str(uuid.UUID(value)) == value
    except ValueError:
        return False


@dataclass
class Volume:
    """A volume: its directory is ``volumes/<volume_id>``; where it is attached, staged and
    published is recorded here."""

    volume_id: str
    name: str
    capacity_bytes: int
    parameters: dict[str, str] = field(default_factory=dict)
    mutable_parameters: dict[str, str] = field(default_factory=dict)
    """What CreateVolume and ControllerModifyVolume set (a VolumeAttributesClass's)."""
    source_snapshot_id: str = ""
    source_volume_id: str = ""
    attached_nodes: list[str] = field(default_factory=list)
    staged_paths: list[str] = field(default_factory=list)
    published_paths: list[str] = field(default_factory=list)


@dataclass
class Snapshot:
    """A snapshot: a copy of its volume's directory in ``snapshots/<snapshot_id>``."""

    snapshot_id: str
    name: str
    source_volume_id: str
    size_bytes: int
    creation_time_ns: int
    group_snapshot_id: str = ""


@dataclass
class GroupSnapshot:
    """Snapshots of several volumes taken together (GroupController)."""

    group_snapshot_id: str
    name: str
    snapshot_ids: list[str]
    creation_time_ns: int


@dataclass
class State:
    """All volumes and snapshots, in creation order (the order ListVolumes and ListSnapshots
    page through)."""

    root: str
    volumes: dict[str, Volume] = field(default_factory=dict)
    snapshots: dict[str, Snapshot] = field(default_factory=dict)
    groups: dict[str, GroupSnapshot] = field(default_factory=dict)

    @classmethod
    def load(cls, root: str) -> State:
        """The state saved in ``root`` (created, with its directories, when missing)."""
        os.makedirs(root, mode=0o750, exist_ok=True)
        for name in (VOLUMES, SNAPSHOTS):
            make_directory_beneath(root, [name], 0o750)
        state = cls(root)
        try:
            with open(os.path.join(root, STATE_FILE), encoding="utf-8") as file:
                data: dict[str, Any] = json.load(file)
        except FileNotFoundError:
            return state
        for item in data.get("volumes", []):
            state.volumes[item["volume_id"]] = Volume(**item)
        for item in data.get("snapshots", []):
            state.snapshots[item["snapshot_id"]] = Snapshot(**item)
        for item in data.get("groups", []):
            state.groups[item["group_snapshot_id"]] = GroupSnapshot(**item)
        return state

    def save(self) -> None:
        """Write the state atomically (a crash leaves the old file or the new one)."""
        data = {
            "volumes": [dataclasses.asdict(v) for v in self.volumes.values()],
            "snapshots": [dataclasses.asdict(s) for s in self.snapshots.values()],
            "groups": [dataclasses.asdict(g) for g in self.groups.values()],
        }
        path = os.path.join(self.root, STATE_FILE)
        temporary = path + ".tmp"
        with open(temporary, "w", encoding="utf-8") as file:
            json.dump(data, file, indent=1, sort_keys=True)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)

    # -- data directories ----------------------------------------------------------------------

    def volume_path(self, volume_id: str) -> str:
        """The directory of a volume."""
        return os.path.join(self.root, VOLUMES, validate_component(volume_id, "volume id"))

    def snapshot_path(self, snapshot_id: str) -> str:
        """The directory of a snapshot."""
        return os.path.join(self.root, SNAPSHOTS, validate_component(snapshot_id, "snapshot id"))

    def make_volume_dir(self, volume_id: str) -> str:
        """Create a volume's directory (writable by the workloads that will use it)."""
        return make_directory_beneath(
            self.root, [VOLUMES, validate_component(volume_id, "volume id")], 0o777
        )

    def copy_into_volume(self, source: str, volume_id: str) -> None:
        """Fill a new volume's directory with a copy of ``source`` (a snapshot or volume
        directory of this driver); symbolic links are copied as links, never followed."""
        target = self.volume_path(volume_id)
        shutil.copytree(source, target, symlinks=True, dirs_exist_ok=True)

    def take_snapshot(self, volume_id: str, snapshot_id: str) -> None:
        """Copy a volume's directory into a new snapshot's."""
        shutil.copytree(self.volume_path(volume_id), self.snapshot_path(snapshot_id), symlinks=True)

    def remove_volume_dir(self, volume_id: str) -> None:
        """Remove a volume's directory and everything in it."""
        remove_beneath(self.root, [VOLUMES, validate_component(volume_id, "volume id")])

    def remove_snapshot_dir(self, snapshot_id: str) -> None:
        """Remove a snapshot's directory and everything in it."""
        remove_beneath(self.root, [SNAPSHOTS, validate_component(snapshot_id, "snapshot id")])

    def used_bytes(self, volume_id: str) -> int:
        """Bytes of the files in a volume's directory (not following links)."""
        total = 0
        for directory, _dirs, files in os.walk(self.volume_path(volume_id)):
            for name in files:
                try:
                    total += os.lstat(os.path.join(directory, name)).st_size
                except OSError:
                    continue
        return total

"""What a test node (:mod:`pyprovlib.testing._node`) leaves on the host, and how it goes.

The node's launcher writes a manifest (``node.json`` in its directory) before it starts
anything: what existed before (so only what the node made is removed) and every place the node
writes outside its own directory. :func:`clean` undoes all of it, in an order that works after
a clean stop and after a killed test run alike (the reaper calls it then):

1. every process in the node's cgroups (pod containers) and every containerd shim of the
   node's containerd is killed;
2. every mount under the node's roots (the kubelet's pod volumes and CSI staging paths,
   containerd's overlay snapshots, the network namespaces' nsfs files) is unmounted, deepest
   first;
3. the network namespaces, the CNI bridge, the loopback address, the cgroups and the system
   directories the node created go.

``python -m pyprovlib.testing._node_cleanup DIR`` runs it by hand.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

__all__ = ["NodeManifest", "clean", "leftovers", "mounts_under"]

MANIFEST = "node.json"
CGROUP_ROOT = Path("/sys/fs/cgroup")
NETNS_DIR = Path("/run/netns")


@dataclass
class NodeManifest:
    """Where a node writes on the host, and what was there before it started."""

    directory: str
    kubelet_root: str
    cgroup_root: str
    containerd_address: str
    bridge: str
    loopback_address: str = ""
    """The address the node added to ``lo`` (empty: it used one that was there)."""
    netns_before: list[str] = field(default_factory=list)
    created_paths: list[str] = field(default_factory=list)
    """System paths that did not exist before the node started (removed whole)."""
    shim_sockets_before: list[str] = field(default_factory=list)

    def save(self) -> None:
        path = Path(self.directory) / MANIFEST
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        tmp.replace(path)

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> NodeManifest | None:
        try:
            data = json.loads((Path(directory) / MANIFEST).read_text())
        except (OSError, ValueError):
            return None
        return cls(**data)

    @property
    def roots(self) -> list[str]:
        """The trees whose mounts belong to the node."""
        return [self.kubelet_root, self.directory]


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: S603 - argv list of system tools
        list(argv), check=False, capture_output=True, text=True
    )


def _cgroup_dirs(cgroup_root: str) -> list[Path]:
    """The node's cgroup in each hierarchy (v1 controllers and the unified one)."""
    relative = cgroup_root.strip("/")
    if not relative:
        return []
    found = []
    with contextlib.suppress(OSError):
        for hierarchy in CGROUP_ROOT.iterdir():
            candidate = hierarchy / relative
            if candidate.is_dir():
                found.append(candidate)
    return found


def cgroup_pids(cgroup_root: str) -> set[int]:
    """Every process in the node's cgroup trees."""
    pids: set[int] = set()
    for top in _cgroup_dirs(cgroup_root):
        for dirpath, _dirs, files in os.walk(top):
            if "cgroup.procs" in files:
                with contextlib.suppress(OSError):
                    text = (Path(dirpath) / "cgroup.procs").read_text()
                    pids.update(int(p) for p in text.split())
    return pids


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def _all_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def shim_pids(containerd_address: str) -> set[int]:
    """The containerd shims serving the node's containerd (their ``-address`` names its
    socket)."""
    found = set()
    for pid in _all_pids():
        argv = _cmdline(pid)
        if argv and "containerd-shim" in argv[0] and containerd_address in argv:
            found.add(pid)
    return found


def node_processes(manifest: NodeManifest) -> set[int]:
    """The node's pod processes and shims that are still alive."""
    return cgroup_pids(manifest.cgroup_root) | shim_pids(manifest.containerd_address)


def _kill(pids: Iterable[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _unescape(field_text: str) -> str:
    # /proc/self/mountinfo escapes space, tab, newline and backslash as octal.
    return (
        field_text.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
    )


def _mount_points() -> list[str]:
    with open("/proc/self/mountinfo") as mountinfo:
        return [_unescape(line.split()[4]) for line in mountinfo if line.strip()]


def _under(path: str, roots: Iterable[str]) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def mounts_under(roots: Iterable[str]) -> list[str]:
    """The mount points at or below any of ``roots``, deepest (latest) first."""
    roots = [r for r in roots if r]
    return [m for m in reversed(_mount_points()) if _under(m, roots)]


def _netns_entries() -> list[str]:
    with contextlib.suppress(OSError):
        return sorted(os.listdir(NETNS_DIR))
    return []


def new_netns(manifest: NodeManifest) -> list[str]:
    """Network namespaces made since the node started (containerd's ``cni-…``)."""
    before = set(manifest.netns_before)
    return [n for n in _netns_entries() if n.startswith("cni-") and n not in before]


def _unmount_all(roots: list[str]) -> list[str]:
    """Unmount everything under ``roots``; returns what could not be unmounted."""
    for _ in range(3):
        remaining = mounts_under(roots)
        if not remaining:
            return []
        for point in remaining:
            if _run("umount", point).returncode != 0:
                _run("umount", "--lazy", point)
    return mounts_under(roots)


def _link_exists(name: str) -> bool:
    return bool(name) and Path(f"/sys/class/net/{name}").exists()


def _remove_cgroups(cgroup_root: str) -> None:
    for top in _cgroup_dirs(cgroup_root):
        for dirpath, _dirs, _files in sorted(os.walk(top), key=lambda w: -len(w[0])):
            with contextlib.suppress(OSError):
                os.rmdir(dirpath)


def leftovers(manifest: NodeManifest) -> list[str]:
    """What of the node is still on the host (empty after :func:`clean`)."""
    found = [f"process {pid}: {' '.join(_cmdline(pid))[:120]}" for pid in node_processes(manifest)]
    found += [
        f"mount {m}"
        for m in mounts_under([*manifest.roots, str(NETNS_DIR)])
        if not m.startswith(str(NETNS_DIR)) or Path(m).name in new_netns(manifest)
    ]
    found += [f"network namespace {n}" for n in new_netns(manifest)]
    if _link_exists(manifest.bridge):
        found.append(f"network link {manifest.bridge}")
    found += [f"cgroup {c}" for c in _cgroup_dirs(manifest.cgroup_root)]
    found += [f"path {p}" for p in manifest.created_paths if os.path.lexists(p)]
    if (
        manifest.loopback_address
        and manifest.loopback_address in _run("ip", "-o", "addr", "show", "dev", "lo").stdout
    ):
        found.append(f"address {manifest.loopback_address} on lo")
    return found


def clean(manifest: NodeManifest) -> list[str]:
    """Undo everything the node did to the host; returns what is still left (ideally
    nothing)."""
    for _ in range(20):
        pids = node_processes(manifest)
        if not pids:
            break
        _kill(pids)
        time.sleep(0.1)
    netns = new_netns(manifest)
    _unmount_all([*manifest.roots, *(str(NETNS_DIR / n) for n in netns)])
    for name in netns:
        with contextlib.suppress(OSError):
            (NETNS_DIR / name).unlink()
    if _link_exists(manifest.bridge):
        _run("ip", "link", "delete", manifest.bridge)
    if manifest.loopback_address:
        _run("ip", "addr", "del", f"{manifest.loopback_address}/32", "dev", "lo")
    _remove_cgroups(manifest.cgroup_root)
    for path in manifest.created_paths:
        if _under(path, mounts_under([path])) and mounts_under([path]):
            continue  # never delete through a mount we could not remove
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(path)
    return leftovers(manifest)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m pyprovlib.testing._node_cleanup NODE_DIRECTORY", file=sys.stderr)
        return 2
    manifest = NodeManifest.load(args[0])
    if manifest is None:
        print(f"{args[0]}: no {MANIFEST} (not a test node's directory)", file=sys.stderr)
        return 2
    left = clean(manifest)
    for item in left:
        print(f"left: {item}", file=sys.stderr)
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())

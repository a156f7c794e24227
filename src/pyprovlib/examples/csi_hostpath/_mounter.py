"""How the hostpath driver's node service makes a volume appear at the paths the CO names.

- :class:`RecordingMounter` (``--mount=record``, the default): nothing is mounted; the node
  service only creates and records the directories. The driver then runs unprivileged, as a
  CSI peer for sidecars and csi-sanity.
- :class:`BindMounter` (``--mount=bind``): a real node plugin. Staging bind-mounts the volume's
  directory at the staging path; publishing bind-mounts the staging path (or the volume's
  directory) at the target path, read-only when asked. Needs root (``CAP_SYS_ADMIN``) and the
  mount namespace of the kubelet.

Both are idempotent: mounting what is already mounted there, or unmounting what is not
mounted, succeeds. Mounts are made with ``mount``/``umount`` (argv lists, no shell), as
Kubernetes' mount-utils does.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from pyprovlib.csi._server import CSIError, Status

__all__ = ["BindMounter", "Mounter", "RecordingMounter", "is_mount_point", "mounter_for"]

MOUNT_MODES = ("record", "bind")


def _unescape(text: str) -> str:
    # /proc/self/mountinfo writes space, tab, newline and backslash as octal escapes.
    for escaped, plain in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        text = text.replace(escaped, plain)
    return text


def _mountinfo() -> list[tuple[str, str]]:
    """(mount point, mount options) of every mount in this process's namespace."""
    with open("/proc/self/mountinfo") as mountinfo:
        rows = [line.split() for line in mountinfo if line.strip()]
    return [(_unescape(row[4]), row[5]) for row in rows]


def is_mount_point(path: str) -> bool:
    """True when something is mounted at ``path`` (bind mounts of the same file system
    included, which :func:`os.path.ismount` cannot tell)."""
    return any(point == path for point, _ in _mountinfo())


def _read_only(path: str) -> bool:
    options = [opts for point, opts in _mountinfo() if point == path]
    return bool(options) and "ro" in options[-1].split(",")


class Mounter(Protocol):
    """Makes a directory appear at a path, and undoes it."""

    async def bind(self, source: str, target: str, *, read_only: bool) -> None:
        """Make ``source`` (a directory) appear at ``target`` (an existing directory)."""
        ...

    async def unmount(self, target: str) -> None:
        """Undo :meth:`bind` at ``target``; nothing mounted there is success."""
        ...


class RecordingMounter:
    """Mounts nothing (the node service records the paths)."""

    async def bind(self, source: str, target: str, *, read_only: bool) -> None:
        return None

    async def unmount(self, target: str) -> None:
        return None


async def _run(*argv: str) -> None:
    process = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await process.communicate()
    if process.returncode != 0:
        message = out.decode(errors="replace").strip() or f"exit status {process.returncode}"
        raise CSIError(Status.INTERNAL, f"{argv[0]} failed: {message}")


class BindMounter:
    """Bind mounts with ``mount --bind`` (and a read-only remount)."""

    async def bind(self, source: str, target: str, *, read_only: bool) -> None:
        if await asyncio.to_thread(is_mount_point, target):
            if read_only and not await asyncio.to_thread(_read_only, target):
                raise CSIError(
                    Status.ALREADY_EXISTS,
                    "the target path is already mounted read-write; it cannot be published "
                    "read-only as well",
                )
            return
        await _run("mount", "--bind", source, target)
        if read_only:
            try:
                await _run("mount", "-o", "remount,bind,ro", target)
            except CSIError:
                await _run("umount", target)
                raise

    async def unmount(self, target: str) -> None:
        # A path mounted twice (a retried publish that raced) is unmounted until bare.
        while await asyncio.to_thread(is_mount_point, target):
            await _run("umount", target)


def mounter_for(mode: str) -> Mounter:
    """The mounter of ``--mount=MODE``."""
    if mode == "bind":
        return BindMounter()
    if mode == "record":
        return RecordingMounter()
    raise ValueError(f"unknown mount mode {mode!r} (use one of {', '.join(MOUNT_MODES)})")

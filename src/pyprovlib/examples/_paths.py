"""Safe paths for the example backends: validating user-controlled path strings and creating,
removing or renaming directories strictly beneath a root.

Class parameters, claim names, annotations and labels all end up in directory names. Every such
string goes through :func:`validate_base_path` or :func:`split_relative_path` before use, and the
filesystem work walks from the root one component at a time with ``O_NOFOLLOW`` directory file
descriptors, so neither ``..`` nor a symbolic link planted inside the root (by a workload writing
into its volume) can make an operation land outside it. The functions here are blocking; callers
run them with :func:`asyncio.to_thread`.
"""

from __future__ import annotations

import errno
import os
import posixpath
import shutil
import stat
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from pyprovlib._errors import PyprovlibError

__all__ = [
    "MAX_COMPONENT_BYTES",
    "MAX_PATH_BYTES",
    "UnsafePathError",
    "archive_beneath",
    "make_directory_beneath",
    "remove_beneath",
    "split_relative_path",
    "validate_base_path",
    "validate_component",
]

MAX_COMPONENT_BYTES = 255
"""Longest file name Linux filesystems accept (NAME_MAX)."""

MAX_PATH_BYTES = 4096
"""Longest path the kernel accepts (PATH_MAX)."""

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_NOFOLLOW_DIR_FLAGS = _DIR_FLAGS | os.O_NOFOLLOW


class UnsafePathError(PyprovlibError, ValueError):
    """A path string is malformed, or would resolve outside the root it must stay in."""


def _check_common(value: str, what: str) -> None:
    if "\x00" in value:
        raise UnsafePathError(f"{what} contains a NUL byte")
    if len(value.encode("utf-8", "surrogateescape")) > MAX_PATH_BYTES:
        raise UnsafePathError(f"{what} is longer than {MAX_PATH_BYTES} bytes")


def validate_component(name: str, what: str = "name") -> str:
    """Check that ``name`` is a single usable directory entry name and return it.

    Rejects empty names, ``.`` and ``..``, slashes, NUL bytes and names over 255 bytes.
    """
    _check_common(name, what)
    if name in ("", ".", ".."):
        raise UnsafePathError(f"{what} {name!r} is not a valid directory name")
    if "/" in name:
        raise UnsafePathError(f"{what} {name!r} must be a single path component (no '/')")
    if len(name.encode("utf-8", "surrogateescape")) > MAX_COMPONENT_BYTES:
        raise UnsafePathError(
            f"{what} has a component longer than {MAX_COMPONENT_BYTES} bytes: {name[:40]!r}..."
        )
    return name


def validate_base_path(value: str, what: str = "path") -> str:
    """Check that ``value`` is an absolute, normalized directory path other than ``/`` and
    return it. ``..``, ``.``, repeated or trailing slashes are refused rather than cleaned up,
    so what the user wrote is exactly what is used."""
    _check_common(value, what)
    if not value.startswith("/"):
        raise UnsafePathError(f"{what} {value!r} must be an absolute path")
    parts = value.split("/")[1:]
    if ".." in parts:
        raise UnsafePathError(f"{what} {value!r} must not contain '..'")
    if value == "/":
        raise UnsafePathError(f"{what} must not be the root directory '/'")
    if posixpath.normpath(value) != value or value.startswith("//"):
        raise UnsafePathError(
            f"{what} {value!r} is not normalized (write it as {posixpath.normpath(value)!r})"
        )
    for part in parts:
        validate_component(part, what)
    return value


def split_relative_path(value: str, what: str = "path") -> tuple[str, ...]:
    """Split a relative path into components, refusing anything that could leave its root.

    Empty and ``.`` components are dropped (``a//b/`` is ``a/b``, as Go's ``filepath.Join``
    would make it); an absolute path, a ``..`` component, a NUL byte or an over-long component
    or path raises :class:`UnsafePathError`. The result may be empty.
    """
    _check_common(value, what)
    if value.startswith("/"):
        raise UnsafePathError(f"{what} {value!r} must be relative, not an absolute path")
    parts: list[str] = []
    for part in value.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            raise UnsafePathError(f"{what} {value!r} must not contain '..'")
        parts.append(validate_component(part, what))
    return tuple(parts)


def _open_root(root: str) -> int:
    # The root itself is administrator-chosen and may legitimately be a symlink (a mount point
    # reached through /var -> /data, say); only what lies beneath it is held to O_NOFOLLOW.
    try:
        return os.open(root, _DIR_FLAGS)
    except FileNotFoundError as err:
        raise FileNotFoundError(
            errno.ENOENT, f"root directory {root} does not exist", root
        ) from err


def _open_child(parent_fd: int, name: str, shown: str) -> int:
    try:
        return os.open(name, _NOFOLLOW_DIR_FLAGS, dir_fd=parent_fd)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENOTDIR):
            try:
                st = os.lstat(name, dir_fd=parent_fd)
            except OSError:
                raise err from None
            if stat.S_ISLNK(st.st_mode):
                raise UnsafePathError(
                    f"{shown} is a symbolic link; refusing to follow it out of the root"
                ) from err
            raise UnsafePathError(f"{shown} exists and is not a directory") from err
        raise


@contextmanager
def _walk(root: str, parts: Sequence[str], *, create_mode: int | None) -> Iterator[int | None]:
    """Yield a directory fd for ``root/parts...``, opened component by component without
    following symlinks; create missing components when ``create_mode`` is given, else yield
    None when one is missing. A missing root is always an error."""
    fd = _open_root(root)
    try:
        shown = root
        for part in parts:
            shown = posixpath.join(shown, part)
            if create_mode is not None:
                try:
                    os.mkdir(part, 0o700, dir_fd=fd)
                    created = True
                except FileExistsError:
                    created = False
                child = _open_child(fd, part, shown)
                if created:
                    # chmod after mkdir so the process umask cannot narrow the mode.
                    os.fchmod(child, create_mode)
            else:
                try:
                    child = _open_child(fd, part, shown)
                except FileNotFoundError:
                    yield None
                    return
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def _checked(parts: Sequence[str]) -> tuple[str, ...]:
    if not parts:
        raise UnsafePathError("refusing to operate on the root directory itself")
    return tuple(validate_component(p) for p in parts)


def make_directory_beneath(root: str, parts: Sequence[str], mode: int) -> str:
    """Create ``root/parts...`` (like ``mkdir -p``) and set ``mode`` on the last directory,
    and on any intermediate directory this call created. Returns the path.

    Existing components must be real directories, not symlinks. ``root`` must exist.
    """
    parts = _checked(parts)
    with _walk(root, parts, create_mode=mode) as fd:
        if fd is None:  # not reached: creating never finds a component missing
            raise FileNotFoundError(errno.ENOENT, "directory vanished", root)
        os.fchmod(fd, mode)
    return posixpath.join(root, *parts)


def remove_beneath(root: str, parts: Sequence[str]) -> bool:
    """Remove ``root/parts...`` and everything in it (like ``rm -rf``). Returns False when it
    did not exist. A symlink in its place is unlinked, never followed."""
    parts = _checked(parts)
    with _walk(root, parts[:-1], create_mode=None) as parent:
        if parent is None:
            return False
        name = parts[-1]
        try:
            st = os.lstat(name, dir_fd=parent)
        except FileNotFoundError:
            return False
        if stat.S_ISDIR(st.st_mode):
            # rmtree with dir_fd uses the fd-based implementation, which does not follow
            # symlinks found inside the tree.
            shutil.rmtree(name, dir_fd=parent)
        else:
            os.unlink(name, dir_fd=parent)
        return True


def archive_beneath(root: str, parts: Sequence[str], new_name: str) -> str | None:
    """Rename ``root/parts...`` to ``new_name`` in the same parent directory. Returns the new
    path, or None when the source did not exist. Never replaces an existing entry."""
    parts = _checked(parts)
    validate_component(new_name, "archive name")
    with _walk(root, parts[:-1], create_mode=None) as parent:
        if parent is None:
            return None
        name = parts[-1]
        try:
            os.lstat(name, dir_fd=parent)
        except FileNotFoundError:
            return None
        try:
            os.lstat(new_name, dir_fd=parent)
        except FileNotFoundError:
            pass
        else:
            raise FileExistsError(
                errno.EEXIST,
                "archive destination already exists",
                posixpath.join(root, *parts[:-1], new_name),
            )
        os.rename(name, new_name, src_dir_fd=parent, dst_dir_fd=parent)
        return posixpath.join(root, *parts[:-1], new_name)

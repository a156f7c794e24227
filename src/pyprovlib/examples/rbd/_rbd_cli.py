"""The ``rbd`` command runner: builds argv lists, hands the cephx key over in a temporary
keyfile, bounds every command in time, parses ``--format=json`` output and classifies failures.

Every call runs ``rbd`` without a shell, in a fresh private temporary directory (its working
directory, so no stray ``./ceph.conf`` is read) with a generated minimal config (``-c``), the
monitors on the command line (``-m``), librados timeouts (``--client_mount_timeout``,
``--rados_mon_op_timeout``, ``--rados_osd_op_timeout``: a wrong key or a down cluster would
otherwise hang ``rbd`` for 300 s) and an outer deadline after which the process is killed. The
key is written to a 0600 file in that directory, passed as ``--keyfile``, and removed with the
directory afterwards: it never appears in argv (visible in ``ps``), logs, events or exceptions.

Every user-controlled string (pool, image, user id, monitors) is validated before it reaches
argv and always travels as its own argv element; nothing may start with ``-``, so nothing can
be mistaken for an option.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from pyprovlib._errors import PyprovlibError
from pyprovlib._logging import get_logger
from pyprovlib._redaction import REDACTED, scrub_text

__all__ = [
    "DEFAULT_BINARY",
    "DEFAULT_TIMEOUT",
    "MIB",
    "CephCredentials",
    "ImageInfo",
    "InvalidValueError",
    "RbdBinaryNotFoundError",
    "RbdBusyError",
    "RbdError",
    "RbdExistsError",
    "RbdNotFoundError",
    "RbdPermissionError",
    "RbdRunner",
    "RbdTimeoutError",
    "Watcher",
    "redact_text",
    "validate_key",
    "validate_monitors",
    "validate_name",
]

DEFAULT_BINARY: Final = "rbd"
"""The ``rbd`` program, looked up in PATH."""

DEFAULT_TIMEOUT: Final = 10.0
"""Seconds librados waits to reach the monitors and for one monitor or OSD operation."""

MIB: Final = 1024 * 1024
"""One mebibyte: ``rbd --size N`` counts in MiB, and so does the PV capacity."""

_MAX_NAME: Final = 255
_MAX_MONITORS: Final = 32
# Pool, image and cephx user names: no separators rbd would interpret ('/' pool/namespace,
# '@' snapshot), no whitespace, no leading '-' (option injection) or '.'.
_NAME: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
# A monitor: an optional msgr prefix, then a host name, IPv4 address or bracketed IPv6
# address, then an optional port.
_MONITOR: Final = re.compile(
    r"(?:v[12]:)?(?:[A-Za-z0-9][A-Za-z0-9.-]*|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?"
)
_KEY: Final = re.compile(r"[A-Za-z0-9+/]+={0,2}")
# cephx secrets as ceph-authtool prints them: base64 of a 28-byte blob, always "AQ..."
_CEPHX_KEY: Final = re.compile(r"AQ[A-Za-z0-9+/]{36,}={0,2}")
# Ceph's log lines: timestamp, thread id, level, message. Level -1 lines are errors and often
# say why (e.g. "librbd: Format 1 image creation unsupported."); the rest is noise, as are the
# messenger's protocol-negotiation errors.
_LOG_LINE: Final = re.compile(r"\d{4}-\d\d-\d\dT\S+ [0-9a-f]+ +(-?\d+) (.*)")
_NOISE: Final = ("_handle_peer_banner", " --2- ", " --1- ")
_MAX_LINES: Final = 4
_MAX_DETAIL: Final = 600

log = get_logger("pyprovlib.examples.rbd")


class InvalidValueError(PyprovlibError, ValueError):
    """A pool, image, user id, monitor or key that cannot be passed to ``rbd`` safely."""


def validate_name(value: str, what: str) -> str:
    """``value`` if it is a safe pool, image or cephx user name, else
    :class:`InvalidValueError` naming ``what``."""
    if not value:
        raise InvalidValueError(f"{what} must not be empty")
    if len(value) > _MAX_NAME:
        raise InvalidValueError(f"{what} is longer than {_MAX_NAME} characters")
    if not _NAME.fullmatch(value):
        raise InvalidValueError(
            f"{what} {value!r} is invalid: use letters, digits, '_', '.' and '-', starting "
            "with a letter, digit or '_'"
        )
    return value


def validate_monitors(value: str) -> tuple[str, ...]:
    """The monitors of a comma-separated ``host[:port]`` list (``10.0.0.1:6789``,
    ``mon.example:6789``, ``[fd00::1]:6789``), else :class:`InvalidValueError`."""
    monitors = tuple(m.strip() for m in value.split(",") if m.strip())
    if not monitors:
        raise InvalidValueError("monitors must list at least one monitor (host:port)")
    if len(monitors) > _MAX_MONITORS:
        raise InvalidValueError(f"monitors lists more than {_MAX_MONITORS} monitors")
    for mon in monitors:
        if len(mon) > _MAX_NAME or not _MONITOR.fullmatch(mon):
            raise InvalidValueError(
                f"monitor {mon[:80]!r} is invalid: use host:port, ip:port or [ipv6]:port"
            )
        port = mon.rsplit(":", 1)[1] if re.search(r":[0-9]+$", mon) else None
        if port is not None and not 0 < int(port) < 65536:
            raise InvalidValueError(f"monitor {mon!r} has an invalid port")
    return monitors


def validate_key(value: str, what: str) -> str:
    """A cephx key (base64), stripped; :class:`InvalidValueError` names ``what`` but never
    shows the value."""
    key = value.strip()
    if not key:
        raise InvalidValueError(f"{what} is empty")
    if len(key) > 1024 or not _KEY.fullmatch(key):
        raise InvalidValueError(f"{what} is not a cephx key (expected base64 text)")
    return key


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with the given secrets, anything shaped like a cephx key and the secrets
    :func:`pyprovlib.runtime._logging.scrub_text` recognises masked."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, REDACTED)
    text = _CEPHX_KEY.sub(REDACTED, text)
    return scrub_text(text)


@dataclass(frozen=True)
class CephCredentials:
    """A cephx user and its key; the key is kept out of ``repr``."""

    id: str
    """The user name without the ``client.`` prefix (``admin``, ``kube``)."""

    key: str = field(repr=False)
    """The secret, as in a keyring's ``key =`` line."""

    def __post_init__(self) -> None:
        validate_name(self.id, "Ceph user id")
        validate_key(self.key, f"key of Ceph user {self.id!r}")


@dataclass(frozen=True)
class ImageInfo:
    """What ``rbd info --format=json`` reports about an image."""

    name: str
    size: int
    """Bytes."""
    format: int
    features: tuple[str, ...]

    @property
    def size_mib(self) -> int:
        """The size in MiB, rounded up."""
        return -(-self.size // MIB)


@dataclass(frozen=True)
class Watcher:
    """A client watching an image (it has the image open or mapped)."""

    address: str
    client: str


@dataclass(eq=False, repr=False)
class RbdError(PyprovlibError):
    """An ``rbd`` command failed. ``detail`` is rbd's stderr, redacted and trimmed."""

    op: str
    target: str
    detail: str
    returncode: int | None = None

    def __post_init__(self) -> None:
        code = f" (exit {self.returncode})" if self.returncode is not None else ""
        super().__init__(f"rbd {self.op} {self.target} failed{code}: {self.detail}")


class RbdNotFoundError(RbdError):
    """The image or pool does not exist (ENOENT)."""


class RbdExistsError(RbdError):
    """The image already exists (EEXIST)."""


class RbdBusyError(RbdError):
    """The image is in use: it has watchers (EBUSY, or watchers seen by ``rbd status``)."""


class RbdTimeoutError(RbdError):
    """The cluster did not answer in time (ETIMEDOUT, or the command's deadline passed)."""


class RbdPermissionError(RbdError):
    """The cluster refused the user or its key (EPERM / EACCES)."""


class RbdBinaryNotFoundError(PyprovlibError):
    """The ``rbd`` program is not installed or not executable."""

    def __init__(self, binary: str, reason: str = "not found in PATH") -> None:
        self.binary = binary
        super().__init__(
            f"the rbd program {binary!r} is {reason}; install ceph-common (Debian/Ubuntu: "
            "apt-get install ceph-common) or pass --rbd-binary"
        )


_BY_ERRNO: Final[dict[int, type[RbdError]]] = {
    errno.ENOENT: RbdNotFoundError,
    errno.EEXIST: RbdExistsError,
    errno.EBUSY: RbdBusyError,
    errno.ETIMEDOUT: RbdTimeoutError,
    errno.EPERM: RbdPermissionError,
    errno.EACCES: RbdPermissionError,
}

_CONFIG: Final = """\
# Generated by pyprovlib for one rbd command: nothing from /etc/ceph or ./ceph.conf.
[global]
admin socket =
log file =
log to stderr = false
err to stderr = true
"""


def _summarize(stderr: str, secrets: Sequence[str]) -> str:
    """The lines of rbd's stderr that explain a failure, redacted, deduplicated, trimmed:
    ``rbd: ...`` lines and error-level library lines (without their timestamps)."""
    text = redact_text(stderr, secrets)
    # Threads write to stderr unsynchronised: split log records glued onto other lines.
    text = re.sub(r"(?<!^)(?<!\n)(\d{4}-\d\d-\d\dT\d\d:)", r"\n\1", text)
    picked: list[str] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        match = _LOG_LINE.fullmatch(line)
        if match is not None:
            if match.group(1) != "-1" or any(n in line for n in _NOISE):
                continue
            line = match.group(2).strip()
        elif not line.startswith("rbd:"):
            continue
        if line not in picked:
            picked.append(line)
    if not picked:
        picked = [line.strip() for line in text.splitlines() if line.strip()][-2:]
    detail = "; ".join(picked[-_MAX_LINES:]) or "(no output)"
    if len(detail) > _MAX_DETAIL:
        detail = "..." + detail[-(_MAX_DETAIL - 3) :]
    return detail


class RbdRunner:
    """Runs ``rbd`` commands against one cluster per call (monitors and user given per call).

    ``timeout`` bounds librados' waits (mount, monitor and OSD operations); each command is
    killed after ``command_timeout`` (default ``3 * timeout + 5`` seconds).
    """

    def __init__(
        self,
        binary: str = DEFAULT_BINARY,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        command_timeout: float | None = None,
    ) -> None:
        if timeout <= 0:
            raise ValueError("rbd timeout must be positive")
        self.binary = binary
        self.timeout = timeout
        self.command_timeout = command_timeout if command_timeout is not None else timeout * 3 + 5

    def resolve_binary(self) -> str:
        """The absolute path of the ``rbd`` program; :class:`RbdBinaryNotFoundError` when it
        is missing. Called at start-up so a missing binary is one clear error."""
        path = shutil.which(self.binary)
        if path is None:
            raise RbdBinaryNotFoundError(self.binary)
        return path

    async def version(self) -> str:
        """``rbd --version`` (also proves the program runs)."""
        path = self.resolve_binary()
        try:
            proc = await asyncio.create_subprocess_exec(
                path,
                "--version",
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=_environment(),
            )
        except OSError as err:
            raise RbdBinaryNotFoundError(self.binary, f"not executable ({err.strerror})") from err
        out, err_out = await _communicate(proc, self.command_timeout)
        if proc.returncode != 0:
            raise RbdBinaryNotFoundError(
                self.binary, f"not working (--version: {_summarize(err_out.decode(), ())})"
            )
        return out.decode(errors="replace").strip()

    def _timeouts(self) -> list[str]:
        seconds = f"{self.timeout:g}"
        return [
            "--client_mount_timeout",
            seconds,
            "--rados_mon_op_timeout",
            seconds,
            "--rados_osd_op_timeout",
            seconds,
        ]

    async def run(
        self,
        op: str,
        target: str,
        monitors: Sequence[str],
        credentials: CephCredentials,
        args: Sequence[str],
    ) -> str:
        """Run ``rbd <args>`` as ``credentials`` against ``monitors``; stdout on success,
        an :class:`RbdError` subclass otherwise. ``op`` and ``target`` name the operation in
        errors. ``args`` must already be validated argv elements."""
        mons = ",".join(monitors)
        validate_monitors(mons)
        path = self.resolve_binary()
        with _private_dir() as workdir:
            config = os.path.join(workdir, "ceph.conf")
            keyfile = os.path.join(workdir, "keyfile")
            _write_private(config, _CONFIG)
            _write_private(keyfile, credentials.key)
            argv = [
                path,
                "-c",
                config,
                "-m",
                mons,
                "--id",
                credentials.id,
                "--keyfile",
                keyfile,
                *self._timeouts(),
                *args,
            ]
            log.debug("running rbd", op=op, target=target, monitors=mons, user=credentials.id)
            try:
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                    cwd=workdir,
                    env=_environment(),
                )
            except FileNotFoundError as err:
                raise RbdBinaryNotFoundError(self.binary) from err
            try:
                out, err_out = await _communicate(proc, self.command_timeout)
            except TimeoutError:
                raise RbdTimeoutError(
                    op,
                    target,
                    f"no answer from the Ceph cluster at {mons} within {self.command_timeout:g}s",
                ) from None
        stderr = err_out.decode(errors="replace")
        code = proc.returncode
        if code == 0:
            return out.decode(errors="replace")
        detail = _summarize(stderr, (credentials.key,))
        assert code is not None
        if code < 0:
            raise RbdError(op, target, f"killed by signal {-code}; {detail}", code)
        if code == errno.ETIMEDOUT:
            detail += (
                f" (no answer within {self.timeout:g}s: check that the monitors {mons} are "
                f"reachable and that the key of client.{credentials.id} is right)"
            )
        raise _BY_ERRNO.get(code, RbdError)(op, target, detail, code)

    async def _image_json(
        self,
        op: str,
        monitors: Sequence[str],
        credentials: CephCredentials,
        pool: str,
        image: str,
    ) -> dict[str, Any] | None:
        """``rbd <op> --format=json`` on an image, decoded; None when the image does not
        exist."""
        args = [op, "--pool", pool, "--image", image, "--format=json"]
        out = await self._on_image(op, monitors, credentials, pool, image, args=args)
        return None if out is None else _parse_json(op, _target(pool, image), out)

    async def _on_image(
        self,
        op: str,
        monitors: Sequence[str],
        credentials: CephCredentials,
        pool: str,
        image: str,
        *,
        args: list[str],
    ) -> str | None:
        """:meth:`run` an rbd command on an image; None when the image does not exist."""
        try:
            return await self.run(op, _target(pool, image), monitors, credentials, args)
        except RbdNotFoundError:
            return None

    async def info(
        self, monitors: Sequence[str], credentials: CephCredentials, pool: str, image: str
    ) -> ImageInfo | None:
        """``rbd info --format=json``; None when the image does not exist."""
        target = _target(pool, image)
        data = await self._image_json("info", monitors, credentials, pool, image)
        if data is None:
            return None
        try:
            return ImageInfo(
                name=str(data["name"]),
                size=int(data["size"]),
                format=int(data.get("format", 2)),
                features=tuple(str(f) for f in data.get("features", ())),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise RbdError("info", target, f"unexpected output: {err!r}") from err

    async def create(
        self,
        monitors: Sequence[str],
        credentials: CephCredentials,
        pool: str,
        image: str,
        *,
        size_mib: int,
        image_format: int,
        features: Sequence[str],
    ) -> None:
        """``rbd create``; features only for format 2 (an empty list disables them all, as
        with the in-tree provisioner)."""
        target = _target(pool, image)
        if size_mib <= 0:
            raise ValueError("image size must be at least 1 MiB")
        args = ["create", "--pool", pool, "--image", image, "--size", str(size_mib)]
        args += ["--image-format", str(image_format)]
        if image_format == 2:
            args += ["--image-feature", ",".join(features)]
        await self.run("create", target, monitors, credentials, args)

    async def status(
        self, monitors: Sequence[str], credentials: CephCredentials, pool: str, image: str
    ) -> list[Watcher] | None:
        """The image's watchers (``rbd status --format=json``); None when the image does not
        exist."""
        target = _target(pool, image)
        data = await self._image_json("status", monitors, credentials, pool, image)
        if data is None:
            return None
        watchers = data.get("watchers") or []
        if not isinstance(watchers, list):
            raise RbdError("status", target, "unexpected output: watchers is not a list")
        return [
            Watcher(address=str(w.get("address", "?")), client=str(w.get("client", "?")))
            for w in watchers
            if isinstance(w, dict)
        ]

    async def remove(
        self, monitors: Sequence[str], credentials: CephCredentials, pool: str, image: str
    ) -> bool:
        """``rbd rm``; False when the image was already gone. :class:`RbdBusyError` while it
        has watchers."""
        args = ["rm", "--no-progress", "--pool", pool, "--image", image]
        out = await self._on_image("rm", monitors, credentials, pool, image, args=args)
        return out is not None

    async def resize(
        self,
        monitors: Sequence[str],
        credentials: CephCredentials,
        pool: str,
        image: str,
        size_mib: int,
    ) -> None:
        """``rbd resize`` to ``size_mib`` (growing only: rbd refuses to shrink without
        ``--allow-shrink``, which is never passed)."""
        await self.run(
            "resize",
            _target(pool, image),
            monitors,
            credentials,
            ["resize", "--no-progress", "--pool", pool, "--image", image, "--size", str(size_mib)],
        )


def _target(pool: str, image: str) -> str:
    validate_name(pool, "pool")
    validate_name(image, "image")
    return f"{pool}/{image}"


def _parse_json(op: str, target: str, out: str) -> dict[str, Any]:
    try:
        data = json.loads(out)
    except json.JSONDecodeError as err:
        raise RbdError(op, target, f"output is not JSON: {err}") from err
    if not isinstance(data, dict):
        raise RbdError(op, target, "output is not a JSON object")
    return data


def _environment() -> dict[str, str]:
    # Nothing from the provisioner's environment (CEPH_ARGS, CEPH_CONF, ...) reaches rbd.
    return {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), "LC_ALL": "C"}


@contextlib.contextmanager
def _private_dir() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="pyprovlib-rbd-")  # mode 0700
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _write_private(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


async def _communicate(
    proc: asyncio.subprocess.Process,
    timeout: float,  # noqa: ASYNC109 - the deadline kills the child, see below
) -> tuple[bytes, bytes]:
    """``proc.communicate()`` within ``timeout``; on timeout or cancellation the process is
    killed and reaped before the exception propagates."""
    try:
        async with asyncio.timeout(timeout):
            return await proc.communicate()
    except BaseException:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            # Reap it even when we are being cancelled: no zombie, no orphaned pipes.
            await asyncio.shield(proc.wait())
        raise

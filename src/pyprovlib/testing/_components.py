"""The processes of a :class:`~pyprovlib.testing.ControlPlane`: each component
a plain :class:`subprocess.Popen` child in a process group of its own, logged to a file, and
the parent's end of the reaper (:mod:`pyprovlib.testing._reaper`) that ends them all if the
test process dies."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol, TypeVar

from pyprovlib._errors import PyprovlibError

__all__ = ["ControlPlaneError"]

_TERMINATE_SECONDS = 10.0


class ControlPlaneError(PyprovlibError, RuntimeError):
    """A component did not start (the message names it and ends with its last log lines)."""


class _Launchable(Protocol):
    """What :func:`_launched` runs: a control plane or a node."""

    async def launch(self) -> None: ...
    async def stop(self) -> None: ...


LaunchableT = TypeVar("LaunchableT", bound=_Launchable)


@contextlib.asynccontextmanager
async def _launched(thing: LaunchableT) -> AsyncIterator[LaunchableT]:
    """``thing`` launched for the block and stopped after it, however the block ends (the
    ``start`` of :class:`~pyprovlib.testing.ControlPlane` and of
    :class:`~pyprovlib.testing.KubeletNode`)."""
    await thing.launch()
    try:
        yield thing
    finally:
        await thing.stop()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


class _Reaper:
    """The parent's end of the reaper's pipe (see :mod:`pyprovlib.testing._reaper`)."""

    def __init__(self, directory: Path) -> None:
        self.proc = subprocess.Popen(  # noqa: S603 - argv list, our own module
            [sys.executable, "-m", "pyprovlib.testing._reaper", str(directory)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            process_group=0,
            text=True,
        )

    def _send(self, line: str) -> None:
        stdin = self.proc.stdin
        if stdin is None or stdin.closed:
            return
        with contextlib.suppress(OSError):
            stdin.write(line + "\n")
            stdin.flush()

    def watch(self, pid: int) -> None:
        self._send(f"watch {pid}")

    def forget(self, pid: int) -> None:
        self._send(f"forget {pid}")

    def node(self) -> None:
        """Its directory is a test node's: undo the node's changes to the host too."""
        self._send("node")

    def close(self) -> None:
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@dataclass
class _Component:
    name: str
    argv: list[str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = field(default=None, repr=False)

    def start(self, reaper: _Reaper) -> None:
        self._log = self.log_path.open("ab")
        self.proc = subprocess.Popen(  # noqa: S603 - argv list of a binary the caller named
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            process_group=0,  # so the reaper ends it (and anything it forks) as a group
        )
        reaper.watch(self.proc.pid)

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def failure(self, what: str) -> ControlPlaneError:
        code = None if self.proc is None else self.proc.poll()
        status = f" (exit status {code})" if code is not None else ""
        return ControlPlaneError(
            f"{self.name} {what}{status}; last lines of {self.log_path}:\n{_tail(self.log_path)}"
        )

    def kill(self, reaper: _Reaper) -> None:
        """SIGKILL the process group at once (a crash, for fault-injection tests)."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        self.stop(reaper)

    def stop(self, reaper: _Reaper) -> None:
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=_TERMINATE_SECONDS)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        reaper.forget(proc.pid)
        self.proc = None
        if self._log is not None:
            self._log.close()
            self._log = None

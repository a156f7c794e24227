"""``python -m pyprovlib.testing`` as a real process, as the standalone-mode tests run it: started
with a kubeconfig to write and extra flags, ready once it printed the one line saying where it
listens (its only line on stdout), stopped after the block."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from pyprovlib import testing


@dataclass(frozen=True)
class Standalone:
    """The running process and where it listens."""

    child: testing.ChildProcess
    url: str

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])


async def first_line(child: testing.ChildProcess, timeout: float = 20) -> str:
    """The first line ``child`` prints on stdout; fails with its log when there is none."""
    assert child.proc.stdout is not None
    line = await asyncio.wait_for(child.proc.stdout.readline(), timeout)
    assert line, f"exited {child.proc.returncode} without a word on stdout:\n{child.tail()}"
    return line.decode()


@contextlib.asynccontextmanager
async def standalone(kubeconfig: Path, *args: str) -> AsyncIterator[Standalone]:
    """``python -m pyprovlib.testing --kubeconfig <kubeconfig> args...``, once it listens;
    SIGTERM (then SIGKILL after 10 s) when the block leaves it running."""
    async with testing.child_process(
        "-m",
        "pyprovlib.testing",
        "--kubeconfig",
        str(kubeconfig),
        *args,
        stdout=asyncio.subprocess.PIPE,
        terminate_timeout=10,
    ) as child:
        line = await first_line(child)
        assert "listening on" in line, line
        yield Standalone(child, line.split("listening on ", 1)[1].split()[0])

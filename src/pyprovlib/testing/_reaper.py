"""The reaper of :class:`~pyprovlib.testing.ControlPlane`: a tiny process that
outlives its parent to end the parent's processes and remove its temporary directory.

``python -m pyprovlib.testing._reaper DIR`` reads commands from stdin, one per line:
``watch PID`` (a process group to end: the launcher starts each component as the leader of a
group of its own), ``forget PID`` (it ended cleanly) and ``node`` (DIR is a test node's: undo
what the node did to the host, :mod:`pyprovlib.testing._node_cleanup`, before removing it). At
end of input — the parent closed the
pipe, or died, SIGKILL included, since the kernel closes a dead process's descriptors — it sends
SIGTERM to every group still watched, SIGKILL to those alive after the grace period, removes
DIR, and exits. A clean stop forgets every process and removes DIR itself first, so the reaper
then has nothing to do.

It ignores SIGINT and SIGHUP: a terminal's Ctrl-C or hang-up ends the test run, and the reaper
must still be there to clean up after it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import time

__all__ = ["main"]

GRACE_SECONDS = 5.0


def _alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # reused by someone else's group: not ours any more
        return False
    return True


def _signal(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def reap(
    pgids: set[int], directory: str | None, grace: float = GRACE_SECONDS, node: bool = False
) -> None:
    """End the process groups ``pgids`` (TERM, then KILL after ``grace`` s), undo a test
    node's changes to the host when ``node``, and remove ``directory``."""
    for pgid in pgids:
        _signal(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    remaining = {p for p in pgids if _alive(p)}
    while remaining and time.monotonic() < deadline:
        time.sleep(0.05)
        remaining = {p for p in remaining if _alive(p)}
    for pgid in remaining:
        _signal(pgid, signal.SIGKILL)
    deadline = time.monotonic() + grace
    while remaining and time.monotonic() < deadline:
        time.sleep(0.05)
        remaining = {p for p in remaining if _alive(p)}
    if directory and node:
        from pyprovlib.testing._node_cleanup import NodeManifest, clean

        manifest = NodeManifest.load(directory)
        if manifest is not None:
            clean(manifest)
    if directory:
        shutil.rmtree(directory, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    directory = args[0] if args else None
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    pgids: set[int] = set()
    node = False
    for line in sys.stdin:
        command, _, value = line.strip().partition(" ")
        if command == "node":
            node = True
            continue
        if not value.isdigit():
            continue
        if command == "watch":
            pgids.add(int(value))
        elif command == "forget":
            pgids.discard(int(value))
    reap(pgids, directory, node=node)
    return 0


if __name__ == "__main__":
    sys.exit(main())

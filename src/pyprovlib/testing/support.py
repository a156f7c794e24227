"""Waiting on controllers in tests: the deterministic point for a negative assertion.

"The controller did not do X" can only be asserted once the controller has seen the write that
would cause X and has finished whatever that write queued; a sleep before the assertion passes
whenever the controller is merely slow. :func:`wait_idle` waits for exactly that point.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any, Protocol

__all__ = ["IdleObservable", "wait_idle"]


class IdleObservable(Protocol):
    """What :func:`wait_idle` needs of a controller (every pyprovlib controller has it)."""

    def idle(self, *, count_delayed: bool = False) -> bool: ...

    def caught_up(self, obj: Mapping[str, Any]) -> bool: ...


async def wait_idle(
    controller: IdleObservable,
    *written: Mapping[str, Any],
    timeout: float = 30.0,  # noqa: ASYNC109
    count_delayed: bool = False,
) -> None:
    """Wait until ``controller``'s caches show every object of ``written`` (each as a write or
    read of the API server returned it, with its ``apiVersion``, ``kind`` and
    ``resourceVersion``) and it has no work queued or in progress; keys waiting out a retry
    delay count as work only with ``count_delayed``.

    Raises ``AssertionError`` naming what was not reached after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    interval = 0.005
    while True:
        behind = [obj for obj in written if not controller.caught_up(obj)]
        if not behind and controller.idle(count_delayed=count_delayed):
            return
        if time.monotonic() >= deadline:
            names = [
                f"{obj.get('kind')} {(obj.get('metadata') or {}).get('name')}@"
                f"{(obj.get('metadata') or {}).get('resourceVersion')}"
                for obj in behind
            ]
            what = f"caches to show {', '.join(names)}" if names else "work queues to drain"
            raise AssertionError(f"timed out after {timeout}s waiting for the controller's {what}")
        await asyncio.sleep(interval)
        interval = min(interval * 2, 0.1)

"""The faults the Python CSI test drivers (tests/csi, tests/attach, tests/resize) inject: what
the next calls of a method do instead of (or before) answering.

Here, at the root of ``tests/``, because the three drivers live in three test directories and
pytest puts ``tests/`` (the directory of the root conftest) on ``sys.path``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from grpclib.const import Status

from pyprovlib.csi._server import CSIError


@dataclass
class Fault:
    """What the next ``times`` calls do: wait ``delay`` seconds and until ``gate`` is set,
    then raise ``exception`` or fail with ``status`` (or, with neither, go on and complete the
    call). A gate holds a call for as long as the test needs to observe what happens meanwhile
    (a delay is a window the test may miss on a loaded machine)."""

    status: Status | None = None
    message: str = "injected failure"
    delay: float = 0.0
    times: int = 1
    exception: Exception | None = None
    """An unexpected exception to raise (the kit answers INTERNAL)."""
    gate: asyncio.Event | None = None


async def play(queue: list[Fault] | None) -> None:
    """Play the first fault of ``queue``, if any, using up one of its ``times``."""
    if not queue:
        return
    fault = queue[0]
    fault.times -= 1
    if fault.times <= 0:
        queue.pop(0)
    if fault.delay:
        await asyncio.sleep(fault.delay)
    if fault.gate is not None:
        await fault.gate.wait()
    if fault.exception is not None:
        raise fault.exception
    if fault.status is not None:
        raise CSIError(fault.status, fault.message)

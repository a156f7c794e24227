"""Shared informers run for a test as their owner runs them: the informers of a
:class:`~pyprovlib.kube._informer.SharedInformerFactory` that controllers were handed (and so do
not start themselves), for the length of a block. Here at the root of ``tests/``, which pytest
puts on ``sys.path``, because the capacity, CSI and integration tests all do this."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from pyprovlib.kube._informer import SharedInformerFactory


async def _run(factory: SharedInformerFactory) -> None:
    async with asyncio.TaskGroup() as group:
        factory.start(group)
        await asyncio.Event().wait()  # until cancelled


@contextlib.asynccontextmanager
async def informers_running(factory: SharedInformerFactory | None) -> AsyncIterator[None]:
    """Run ``factory``'s informers (nothing for ``None``) for the block, then cancel them and
    wait until they have stopped; an informer that failed fails the block's exit."""
    if factory is None:
        yield
        return
    task = asyncio.create_task(_run(factory))
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

"""Work a test runs in the background for the length of a block: a coroutine (a watcher, a loop
injecting faults), or the informers of a :class:`~pyprovlib.kube._informer.SharedInformerFactory`
that controllers were handed (and so do not start themselves), run as their owner runs them.
Here at the root of ``tests/``, which pytest puts on ``sys.path``, because the capacity, CSI,
integration and reliability tests all do this."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine
from typing import Any

from pyprovlib.kube._informer import SharedInformerFactory


@contextlib.asynccontextmanager
async def background(coro: Coroutine[Any, Any, None]) -> AsyncIterator[None]:
    """Run ``coro`` for the duration of the block; it is cancelled and awaited afterwards (an
    error it ended with fails the block's exit)."""
    task = asyncio.create_task(coro)
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _run(factory: SharedInformerFactory) -> None:
    async with asyncio.TaskGroup() as group:
        factory.start(group)
        await asyncio.Event().wait()  # until cancelled


def informers_running(
    factory: SharedInformerFactory | None,
) -> contextlib.AbstractAsyncContextManager[None]:
    """Run ``factory``'s informers (nothing for ``None``) for the block, then stop them."""
    return contextlib.nullcontext() if factory is None else background(_run(factory))

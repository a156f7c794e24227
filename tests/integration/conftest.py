"""Fixtures shared by the integration tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest


@pytest.fixture
async def task_group() -> AsyncIterator[asyncio.TaskGroup]:
    """A task group cancelled at teardown, like a controller's main() shutting down."""
    stop = asyncio.Event()
    holder: list[asyncio.TaskGroup] = []
    ready = asyncio.Event()

    async def owner() -> None:
        async with asyncio.TaskGroup() as tg:
            holder.append(tg)
            ready.set()
            await stop.wait()
            raise asyncio.CancelledError  # cancel the group's tasks

    task = asyncio.create_task(owner())
    await ready.wait()
    yield holder[0]
    stop.set()
    with pytest.raises(asyncio.CancelledError):
        await task

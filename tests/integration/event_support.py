"""What the EventRecorder's integration tests share: the recorder running against the test's API
server, and its count of dropped events."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from kubernetes_asyncio.client import ApiClient
from prometheus_client import CollectorRegistry

from pyprovlib.kube._config import request_json
from pyprovlib.kube._errors import ApiException, is_already_exists
from pyprovlib.kube._events import EventRecorder


@asynccontextmanager
async def recorder_running(
    api: ApiClient, rec: EventRecorder, *namespaces: str
) -> AsyncIterator[asyncio.Task[None]]:
    """``rec`` writing (its :meth:`~EventRecorder.run` task, cancelled after the block) into
    ``namespaces``, created first unless they exist."""
    for namespace in namespaces:
        try:
            await request_json(
                api, "POST", "/api/v1/namespaces", body={"metadata": {"name": namespace}}
            )
        except ApiException as err:
            if not is_already_exists(err):
                raise
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(rec.run())
        try:
            yield task
        finally:
            task.cancel()


def dropped(registry: CollectorRegistry, reason: str) -> float:
    """The events ``registry``'s recorder dropped for ``reason``."""
    return registry.get_sample_value("pyprovlib_events_dropped_total", {"reason": reason}) or 0.0

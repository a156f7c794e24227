"""What the tests of events share: the EventRecorder running against the test's API server, one
held back by a ``busy`` flag the test turns on and off, its count of dropped events, and whether
a controller's event writers yield to its work queues (EventRecorder's ``busy``). Here at the
root of ``tests/``, which pytest puts on ``sys.path``, because the recorder's tests
(tests/integration) and the resize controller's (tests/resize) use it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from kubernetes_asyncio.client import ApiClient
from prometheus_client import CollectorRegistry

from pyprovlib.kube._config import request_json
from pyprovlib.kube._errors import ApiException, is_already_exists
from pyprovlib.kube._events import EventRecorder
from pyprovlib.kube._workqueue import WorkQueue

R = TypeVar("R", bound=EventRecorder)


class Flag:
    """A ``busy`` predicate the test turns on and off."""

    def __init__(self, value: bool) -> None:
        self.value = value
        self.calls = 0

    def __call__(self) -> bool:
        self.calls += 1
        return self.value


def held_recorder(api: ApiClient, kind: type[R], **options: Any) -> tuple[Flag, R]:
    """A recorder of ``kind`` for component ``test`` (``options`` added: a registry of its own
    and no writer writing while busy, unless they say otherwise) held back while the returned
    flag is on, as it starts."""
    busy = Flag(True)
    options.setdefault("registry", CollectorRegistry())
    options.setdefault("busy_writers", 0)
    return busy, kind(api, "test", busy=busy, **options)


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


async def busy_while_queued(
    recorder: EventRecorder, queue: WorkQueue[Any], item: Any, *, taken: bool
) -> list[bool]:
    """``recorder.busy()`` before ``item`` is added to ``queue``, once it is, and once a worker
    has taken it (``taken``) or the queue has shut down (what is left after a stop does not
    hold events back)."""
    busy = recorder.busy
    assert busy is not None, "the recorder does not yield to the controller's queues"
    seen = [busy()]
    queue.add(item)
    seen.append(busy())
    if taken:
        await queue.get()
    else:
        queue.shut_down()
    seen.append(busy())
    return seen

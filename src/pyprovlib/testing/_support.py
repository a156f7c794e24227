"""Waiting on controllers in tests: run one for a block, wait for a state, and the deterministic
point for a negative assertion.

Tests wait for states, never for an order or a sleep. :func:`eventually` polls a predicate until
it holds; :func:`wait_bound` and :func:`wait_event` are the two states almost every storage test
waits for; :func:`running` runs a controller for the duration of a block and stops it gracefully,
surfacing the controller's own failure.

"The controller did not do X" can only be asserted once the controller has seen the write that
would cause X and has finished whatever that write queued; a sleep before the assertion passes
whenever the controller is merely slow. :func:`wait_idle` waits for exactly that point.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Protocol, TypeVar, cast, overload, runtime_checkable

from kubernetes_asyncio.client import ApiClient

from pyprovlib.kube._errors import is_not_found
from pyprovlib.kube._objects import Obj
from pyprovlib.kube._resources import (
    EVENTS,
    PERSISTENT_VOLUME_CLAIMS,
    PERSISTENT_VOLUMES,
    Resource,
)
from pyprovlib.kube._rest import ResourceClient

__all__ = [
    "ChildProcess",
    "ClusterLike",
    "IdleObservable",
    "Runnable",
    "child_env",
    "child_process",
    "events_of",
    "eventually",
    "running",
    "wait_bound",
    "wait_deleted",
    "wait_event",
    "wait_idle",
]

T = TypeVar("T")


class IdleObservable(Protocol):
    """What :func:`wait_idle` needs of a controller (every pyprovlib controller has it)."""

    def idle(self, *, count_delayed: bool = False) -> bool: ...

    def caught_up(self, obj: Mapping[str, Any]) -> bool: ...


@runtime_checkable
class _Flushable(Protocol):
    """A controller's event recorder (``controller.recorder``), when it has one."""

    async def flush(self, timeout: float) -> bool: ...  # noqa: ASYNC109


class Runnable(Protocol):
    """What :func:`running` needs of a controller: ``run()`` until ``stop()``."""

    async def run(self) -> None: ...

    def stop(self) -> None: ...


class ClusterLike(Protocol):
    """Where :func:`wait_bound` and :func:`wait_event` look: a client and a default namespace
    (a :class:`~pyprovlib.testing.TestCluster` has both)."""

    @property
    def api_client(self) -> ApiClient: ...

    @property
    def namespace(self) -> str: ...


R = TypeVar("R", bound=Runnable)


# Two overloads, because with the union alone mypy cannot solve T for an async predicate (both
# members match it) and rejects the call, typing its result as Never.
@overload
async def eventually(
    predicate: Callable[[], Awaitable[T | None]],
    *,
    timeout: float = ...,  # noqa: ASYNC109
    message: str = ...,
    interval: float = ...,
) -> T: ...


@overload
async def eventually(
    predicate: Callable[[], T | None],
    *,
    timeout: float = ...,  # noqa: ASYNC109
    message: str = ...,
    interval: float = ...,
) -> T: ...


async def eventually(
    predicate: Callable[[], Awaitable[T | None]] | Callable[[], T | None],
    *,
    timeout: float = 30.0,  # noqa: ASYNC109
    message: str = "condition",
    interval: float = 0.01,
) -> T:
    """Poll ``predicate`` (plain or async) until it returns something truthy and return that.

    Raises ``AssertionError`` naming ``message`` and the last value seen after ``timeout``
    seconds. The poll interval grows from ``interval`` to a quarter of a second.
    """
    deadline = time.monotonic() + timeout
    while True:
        last = predicate()
        if inspect.isawaitable(last):
            last = await last
        if last:
            return cast("T", last)
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}: {last!r}")
        await asyncio.sleep(min(interval, max(0.0, deadline - time.monotonic())))
        interval = min(interval * 1.5, 0.25)


@contextlib.asynccontextmanager
async def running(
    controller: R,
    *,
    ready: bool = False,
    stop_timeout: float = 15.0,
) -> AsyncIterator[R]:
    """Run ``controller.run()`` for the duration of the block, then ``stop()`` it and wait for
    ``run()`` to return.

    With ``ready``, the block starts once ``controller.ready()`` is true. A controller that
    fails (before it is ready, during the block or on the way out) raises its own exception
    here, and one that returns before the block ends fails it; one that does not stop within
    ``stop_timeout`` seconds is cancelled and the block fails with ``TimeoutError``.
    """
    task = asyncio.create_task(controller.run())
    try:
        if ready:
            is_ready: Callable[[], bool] = controller.ready  # type: ignore[attr-defined]

            def started() -> bool:
                if task.done():
                    task.result()  # surface the failure
                    raise AssertionError(f"{controller!r} stopped before it was ready")
                return is_ready()

            await eventually(started, message=f"{type(controller).__name__} ready")
        yield controller
        if task.done():
            task.result()  # surface the failure
            # The block may stop the controller itself (a leader stepping down, say).
            if not getattr(controller, "stop_requested", False):
                raise AssertionError(f"{controller!r} stopped on its own, before stop()")
    finally:
        controller.stop()
        try:
            async with asyncio.timeout(stop_timeout):
                await asyncio.shield(task)
        except TimeoutError:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            raise


async def _get(client: ResourceClient, name: str, namespace: str | None = None) -> Obj | None:
    try:
        return await client.get(name, namespace)
    except Exception as err:
        if is_not_found(err):
            return None
        raise


async def wait_bound(
    cluster: ClusterLike,
    name: str,
    *,
    namespace: str | None = None,
    timeout: float = 30.0,  # noqa: ASYNC109
) -> Obj:
    """Wait until the claim ``name`` (in ``namespace``, by default the cluster's) is ``Bound``
    and return it as JSON.

    The ``AssertionError`` on timeout carries the last claim seen and the PV it names (or
    ``pvc-<uid>``, the name a provisioner gives it), which is usually what says why.
    """
    namespace = namespace or cluster.namespace
    claims = ResourceClient(cluster.api_client, PERSISTENT_VOLUME_CLAIMS)
    last: list[Obj | None] = [None]

    async def bound() -> Obj | None:
        claim = last[0] = await _get(claims, name, namespace)
        if claim is not None and (claim.get("status") or {}).get("phase") == "Bound":
            return claim
        return None

    try:
        return await eventually(bound, timeout=timeout, message=f"claim {namespace}/{name} Bound")
    except AssertionError as err:
        claim = last[0]
        volume = None
        if claim is not None:
            pv_name = (claim.get("spec") or {}).get("volumeName") or (
                f"pvc-{claim['metadata'].get('uid')}"
            )
            volume = await _get(ResourceClient(cluster.api_client, PERSISTENT_VOLUMES), pv_name)
        raise AssertionError(f"{err}; last claim: {claim}; its PV: {volume}") from None


async def wait_deleted(
    cluster: ClusterLike,
    resource: Resource,
    name: str,
    *,
    namespace: str | None = None,
    timeout: float = 30.0,  # noqa: ASYNC109
) -> None:
    """Wait until the object ``name`` of ``resource`` (in ``namespace``, by default the
    cluster's, when the resource is namespaced) is gone from the API server."""
    client = ResourceClient(cluster.api_client, resource)
    where = (namespace or cluster.namespace) if resource.namespaced else None

    async def gone() -> bool:
        return await _get(client, name, where) is None

    deleted: bool = await eventually(
        gone, timeout=timeout, message=f"{resource.plural} {name} deleted"
    )
    assert deleted


async def events_of(cluster: ClusterLike, name: str, *, namespace: str | None = None) -> list[Obj]:
    """The events (as JSON) whose involved object is named ``name``, in ``namespace``."""
    listed = await ResourceClient(cluster.api_client, EVENTS).list(namespace or cluster.namespace)
    return [e for e in listed["items"] if (e.get("involvedObject") or {}).get("name") == name]


async def wait_event(
    cluster: ClusterLike,
    name: str,
    reason: str,
    contains: str = "",
    *,
    namespace: str | None = None,
    timeout: float = 30.0,  # noqa: ASYNC109
) -> Obj:
    """Wait for an event with ``reason`` on the object ``name`` whose message contains
    ``contains``, and return it as JSON."""

    async def found() -> Obj | None:
        for event in await events_of(cluster, name, namespace=namespace):
            if event.get("reason") == reason and contains in (event.get("message") or ""):
                return event
        return None

    return await eventually(
        found, timeout=timeout, message=f"{reason} event on {name} ({contains!r})"
    )


async def wait_idle(
    controller: IdleObservable,
    *written: Mapping[str, Any],
    timeout: float = 30.0,  # noqa: ASYNC109
    count_delayed: bool = False,
) -> None:
    """Wait until ``controller``'s caches show every object of ``written`` (each as a write or
    read of the API server returned it, with its ``apiVersion``, ``kind`` and
    ``resourceVersion``) and it has no work queued or in progress; keys waiting out a retry
    delay count as work only with ``count_delayed``. A controller with an event ``recorder``
    has also written (or given up) every event it decided on, so "no event" can be asserted.

    Raises ``AssertionError`` naming what was not reached after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    interval = 0.005
    while True:
        behind = [obj for obj in written if not controller.caught_up(obj)]
        if not behind and controller.idle(count_delayed=count_delayed):
            recorder: _Flushable | None = getattr(controller, "recorder", None)
            left = max(0.0, deadline - time.monotonic())
            if recorder is None or not isinstance(recorder, _Flushable):
                return
            # The events it decided on are part of what it did: written, or given up.
            if await recorder.flush(left) and controller.idle(count_delayed=count_delayed):
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


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment for a child under test: without ``PYPROVLIB_*``,
    ``KUBECONFIG`` and ``POD_NAMESPACE`` (so only its flags configure it), unbuffered, plus
    ``extra``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("PYPROVLIB_") and k not in ("KUBECONFIG", "POD_NAMESPACE")
    }
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


class ChildProcess:
    """A child process under test (a ``python -m`` entry point) whose stderr is collected:
    every line in :attr:`raw`, those that are JSON log records in :attr:`lines`."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.lines: list[dict[str, Any]] = []
        self.raw: list[str] = []
        self._changed = asyncio.Condition()
        self._eof = False

    async def _read(self) -> None:
        if self.proc.stderr is not None:
            async for raw in self.proc.stderr:
                text = raw.decode(errors="replace").rstrip("\n")
                self.raw.append(text)
                with contextlib.suppress(json.JSONDecodeError):
                    record = json.loads(text)
                    if isinstance(record, dict):
                        self.lines.append(record)
                async with self._changed:
                    self._changed.notify_all()
        async with self._changed:
            self._eof = True
            self._changed.notify_all()

    def tail(self, count: int = 40) -> str:
        """The last ``count`` lines of stderr, for an assertion message."""
        return "\n".join(self.raw[-count:])

    def events(self) -> list[str]:
        """The ``event`` of every JSON log record so far."""
        return [str(line.get("event")) for line in self.lines]

    def count(self, event: str) -> int:
        return sum(1 for line in self.lines if line.get("event") == event)

    def find(self, event: str) -> dict[str, Any] | None:
        """The first log record with this ``event``, if any."""
        return next((line for line in self.lines if line.get("event") == event), None)

    async def wait_for(
        self,
        event: str,
        times: int = 1,
        timeout: float = 30.0,  # noqa: ASYNC109
    ) -> dict[str, Any]:
        """Wait until ``event`` was logged ``times`` times; return its last record. Fails
        naming the log's tail when the process's stderr ends first or after ``timeout``."""

        async def found() -> dict[str, Any]:
            async with self._changed:
                while self.count(event) < times:
                    if self._eof:
                        raise AssertionError(f"exited before {event!r}:\n{self.tail()}")
                    await self._changed.wait()
                return [line for line in self.lines if line.get("event") == event][-1]

        try:
            async with asyncio.timeout(timeout):
                return await found()
        except TimeoutError:
            raise AssertionError(f"no {event!r} within {timeout}s:\n{self.tail()}") from None

    async def exit_code(self, timeout: float = 30.0) -> int:  # noqa: ASYNC109
        """Wait for the process to exit; fails naming the log's tail after ``timeout``."""
        try:
            async with asyncio.timeout(timeout):
                return await self.proc.wait()
        except TimeoutError:
            raise AssertionError(f"still running after {timeout}s:\n{self.tail()}") from None


@contextlib.asynccontextmanager
async def child_process(
    *argv: str,
    env: Mapping[str, str] | None = None,
    stdout: int = asyncio.subprocess.DEVNULL,
    terminate_timeout: float | None = None,
) -> AsyncIterator[ChildProcess]:
    """Run ``sys.executable argv...`` (an argv list, no shell) for the block, its stderr
    collected; ``env`` defaults to :func:`child_env`. Afterwards a process still running is
    killed, or with ``terminate_timeout`` sent SIGTERM first and killed only when it does not
    exit within that many seconds."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=stdout,
        stderr=asyncio.subprocess.PIPE,
        env=dict(env) if env is not None else child_env(),
    )
    child = ChildProcess(proc)
    reader = asyncio.create_task(child._read())
    try:
        yield child
    finally:
        if proc.returncode is None:
            if terminate_timeout is not None:
                proc.terminate()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(terminate_timeout):
                        await proc.wait()
            if proc.returncode is None:
                proc.kill()
        await proc.wait()
        await reader

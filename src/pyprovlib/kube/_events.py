"""Record core/v1 Events about objects the way client-go's ``tools/record`` does: a
non-blocking recorder, a bounded buffer, the correlator of
:mod:`pyprovlib.kube._event_correlator` (counting repeats, aggregating similar events,
filtering spam), and a writer that retries and never fails its caller.

:class:`CorrelatorOptions`, :class:`EventCorrelator`, :class:`CorrelateResult` and
:func:`object_reference` are re-exported here, where they always were."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, ParamSpec

import aiohttp
from kubernetes_asyncio.client import ApiClient
from prometheus_client import REGISTRY, CollectorRegistry, Counter

from pyprovlib._logging import get_logger
from pyprovlib.kube import _errors as errors
from pyprovlib.kube._clock import Clock, RealClock, run_within
from pyprovlib.kube._config import describe_transport_error, request_json
from pyprovlib.kube._event_correlator import (
    CorrelateResult,
    CorrelatorOptions,
    EventCorrelator,
    EventNameFactory,
    event_time,
    involved_object,
)
from pyprovlib.kube._objects import Obj
from pyprovlib.kube._reference import object_reference
from pyprovlib.kube._resources import EVENTS

__all__ = [
    "CONTROLLER_HOLD_LIMIT",
    "CONTROLLER_MAX_BUFFER",
    "CONTROLLER_WRITERS",
    "EVENT_TYPE_NORMAL",
    "EVENT_TYPE_WARNING",
    "MAX_MESSAGE_BYTES",
    "CorrelateResult",
    "CorrelatorOptions",
    "EventCorrelator",
    "EventRecorder",
    "object_reference",
    "truncate_message",
]

log = get_logger(__name__)

EVENT_TYPE_NORMAL = "Normal"
"""The type of an event about something going as expected."""
EVENT_TYPE_WARNING = "Warning"
"""The type of an event about something that needs attention."""

MAX_MESSAGE_BYTES = 1024
"""The API server's ``NoteLengthLimit``: it rejects longer events.k8s.io notes. client-go's
core/v1 recorder does not truncate, but kube-scheduler does (``truncateMessage``), and a
storage error message can be arbitrarily long, so messages are cut to this many bytes."""

CONTROLLER_MAX_BUFFER = 3000
"""The event buffer of pyprovlib's controllers, whose writers yield to their work queues:
the 2,000 events of a 1,000-claim burst (the recorder's default buffer; written at once they
reached a high-water mark of 1,200-1,350 on a loaded machine) plus :data:`CONTROLLER_HOLD_LIMIT`
(see :class:`EventRecorder`, "Yielding to the controller")."""
CONTROLLER_HOLD_LIMIT = 1000
"""The most events pyprovlib's controllers hold back while claims or volumes wait for a
worker; beyond it every writer writes."""
CONTROLLER_WRITERS = 4
"""The event writers of pyprovlib's controllers. Their writes wait for the work queues to run
dry (``busy``), so after a burst they catch up rather than keep pace, and each writer writing
holds an HTTP/1.1 connection of its own: with TLS, asyncio's 256 KiB read buffer and the
connection's state, about 0.3 MB of peak RSS. bench/library_real.py measured 4 writers
against 16 on a 1,000-claim burst (issue 31): peak RSS 76.4-76.5 MB against 79.9-80.0, CPU
and claim→PV p99 within the run-to-run spread, no event dropped."""

_TRUNCATION_SUFFIX = " ..."
_DROP_LOG_INTERVAL = 60.0
_P = ParamSpec("_P")


def truncate_message(message: str, limit: int = MAX_MESSAGE_BYTES) -> str:
    """Cut ``message`` to at most ``limit`` UTF-8 bytes, ending with `` ...`` when cut
    (kube-scheduler's ``truncateMessage``), never splitting a character."""
    raw = message.encode("utf-8")
    if len(raw) <= limit:
        return message
    head = raw[: limit - len(_TRUNCATION_SUFFIX)].decode("utf-8", "ignore")
    return head + _TRUNCATION_SUFFIX


class _Recorded:
    """An event waiting in the recorder's buffer: what :meth:`EventRecorder.event` was given,
    its name and timestamp (fixed when it was recorded, as client-go's ``makeEvent`` does).
    The core/v1 Event dict is built only when a writer takes it (:meth:`as_event`): during a
    burst a thousand events wait, and a dict with its metadata and source dicts costs about
    four times this."""

    __slots__ = ("annotations", "message", "name", "reason", "recorder", "ref", "time", "type")

    def __init__(
        self,
        recorder: EventRecorder,
        ref: Obj,
        *,
        type_: str,
        reason: str,
        message: str,
        annotations: Mapping[str, str] | None,
        name: str,
        time: str,
    ) -> None:
        self.recorder = recorder
        self.ref = ref
        self.type = type_
        self.reason = reason
        self.message = truncate_message(str(message))
        self.annotations = dict(annotations) if annotations else None
        self.name = name
        self.time = time

    def as_event(self) -> Obj:
        """The core/v1 Event to correlate and write."""
        recorder = self.recorder
        metadata: Obj = {
            "name": self.name,
            # Cluster-scoped objects' events go to "default", like client-go's makeEvent.
            "namespace": self.ref.get("namespace") or "default",
        }
        if self.annotations:
            metadata["annotations"] = dict(self.annotations)
        source: Obj = {"component": recorder.component}
        if recorder.host:
            source["host"] = recorder.host
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": metadata,
            "involvedObject": self.ref,
            "reason": self.reason,
            "message": self.message,
            "type": self.type,
            "source": source,
            "reportingComponent": recorder.component,
            "reportingInstance": recorder.host,
            "count": 1,
            "firstTimestamp": self.time,
            "lastTimestamp": self.time,
        }


def _dropped_counter(registry: CollectorRegistry) -> Counter:
    counter = _COUNTERS.get(registry)
    if counter is None:
        counter = Counter(
            "pyprovlib_events_dropped_total",
            "Events not written to the API server, by reason: buffer_full (the recorder's "
            "buffer was full), spam (the per source+object spam filter), retries (the API "
            "kept failing), rejected (the API refused the event), invalid (bad input), "
            "shutdown (still buffered when the recorder stopped), error (a bug in the writer).",
            ["reason"],
            registry=registry,
        )
        _COUNTERS[registry] = counter
    return counter


_COUNTERS: weakref.WeakKeyDictionary[CollectorRegistry, Counter] = weakref.WeakKeyDictionary()

_TRANSPORT_ERRORS = (aiohttp.ClientError, OSError, asyncio.TimeoutError)


class EventRecorder:
    """Records core/v1 Events about objects on behalf of ``component`` (client-go's
    broadcaster, recorder and sink in one).

    :meth:`event` never blocks and never raises: it puts the event in a bounded buffer
    (``max_buffer``, see below) or drops it. :meth:`run` writes the
    buffer until cancelled: correlation, then create or patch, retrying transport errors,
    429 and 5xx up to ``max_tries`` times ``retry_sleep`` seconds apart (client-go: 12 and
    10 s; unlike client-go, 5xx answers are retried because kubernetes-asyncio has no retry
    layer of its own). Drops are counted in ``pyprovlib_events_dropped_total{reason}`` and
    logged at most once a minute.

    client-go writes from one goroutine, fast enough for its buffer; here every write awaits a
    round trip, and one writer fell behind a controller provisioning ~200 volumes a second
    until the full buffer dropped a third of the events. So ``writers`` writers drain the
    buffer together; the events of one object are written one at a time, in the order they
    were recorded (their correlation — counts, aggregation, spam — depends on that order).
    A writer only ever takes an event whose object has no write in flight, so one object's
    backlog never holds a writer idle while other objects' events wait.

    ``max_buffer`` bounds the events waiting to be written (not those being written).
    client-go's bound is 1,000 (``maxQueuedEvents``: its broadcaster moves events from the
    incoming channel to each watcher's 1,000-event channel without waiting and drops for a
    full one), drained by a sink that writes over HTTP/2 in its own goroutine. Here writes
    share the controller's event loop: during a 1,000-claim burst a provisioner records two
    events per claim faster than 16 writers get them written (the buffer's high-water mark
    reached 500-920 in bench/provision.py and bench/csi_provision.py, and 8 writers with
    1,000 slots dropped 10-50 %). So the default holds a whole burst's 2,000 events — a few
    MB at most — and lets the writers catch up after it, rather than losing them.

    **Yielding to the controller** (``busy``): the writers share the event loop with the
    controller they report for, and during a burst their round trips compete with the
    provisioning itself (about a fifth of a CSI sidecar's CPU). Given ``busy``, a predicate
    that is true while the owning controller has work waiting for a worker, the writers hold
    back while it holds: at most ``busy_writers`` of them take a new event (default one, so a
    controller that never runs out of work still gets its events written, one round trip at a
    time; 0 holds them all back), and all of them write at full speed once it turns false.
    Nothing is dropped for it:

    - once more than ``hold_limit`` events wait (default a third of ``max_buffer``), every
      writer writes again, busy or not. Holding back the first ``hold_limit`` events of a
      burst raises the buffer's high-water mark by less than ``hold_limit`` (the writers then
      catch up from there instead of from zero), so a buffer with ``hold_limit`` slots more
      than the burst needs without ``busy`` never fills because of it. The controllers that
      pass ``busy`` size theirs so (:data:`CONTROLLER_MAX_BUFFER`, :data:`CONTROLLER_HOLD_LIMIT`);
    - :meth:`flush` (a graceful stop's, a test's) writes regardless of ``busy`` while it waits;
    - cancelling :meth:`run` accounts for what is still buffered exactly as without ``busy``.

    The recorder re-evaluates ``busy`` whenever something happens to it (an event recorded, a
    write finished, a flush begun) and when told to with :meth:`wake`. It does not poll, so the
    owner must call :meth:`wake` whenever ``busy`` may have turned false without an event being
    recorded — typically after each work item, which :meth:`waking` wraps a worker's
    ``process`` function to do. Events are still correlated in the order they were recorded,
    one object at a time: holding back changes when they are written, not in what order.
    """

    def __init__(
        self,
        api_client: ApiClient,
        component: str,
        *,
        host: str = "",
        clock: Clock | None = None,
        max_buffer: int = 2000,
        registry: CollectorRegistry | None = None,
        max_tries: int = 12,
        retry_sleep: float = 10.0,
        correlator_options: CorrelatorOptions | None = None,
        rng: random.Random | None = None,
        writers: int = 16,
        busy: Callable[[], bool] | None = None,
        busy_writers: int = 1,
        hold_limit: int | None = None,
    ) -> None:
        if not component:
            raise ValueError("an EventRecorder needs a component name")
        if max_buffer < 1 or max_tries < 1 or writers < 1:
            raise ValueError("max_buffer, max_tries and writers must be at least 1")
        if busy_writers < 0:
            raise ValueError(f"busy_writers must not be negative, got {busy_writers}")
        if hold_limit is None:
            hold_limit = max_buffer // 3
        if not 0 <= hold_limit < max_buffer:
            raise ValueError(
                f"hold_limit must be at least 0 and below max_buffer ({max_buffer}), got "
                f"{hold_limit}: events held back past the buffer's end would be dropped"
            )
        self.writers = writers
        self.max_buffer = max_buffer
        self.busy = busy
        """The owner's "work is waiting" predicate (see the class docstring), or None."""
        self.busy_writers = busy_writers
        """How many writers may take new events while :attr:`busy` holds."""
        self.hold_limit = hold_limit
        """Above this many waiting events, writers write even while :attr:`busy` holds."""
        # Waiting events per involved object, in the order they were recorded. An object is
        # in _ready (once) when it has waiting events and no write in flight: writers take
        # objects from there, so one object's events never overlap and never block a writer
        # behind another object's write (sharding objects over per-writer locks did: writers
        # parked on a busy shard while the buffer filled, ~3 of 8 writing on average).
        self._waiting: dict[tuple[str, ...], deque[_Recorded]] = {}
        self._ready: deque[tuple[str, ...]] = deque()
        self._in_flight: set[tuple[str, ...]] = set()
        # Writers parked until an object is ready and writing is allowed (see _allowed);
        # _waking of them were woken and have not run yet.
        self._parked: deque[asyncio.Future[None]] = deque()
        self._waking = 0
        self._writing = 0  # writers with an event in hand
        self._flushing = 0  # flush() calls waiting: write regardless of busy
        self._busy_failed = False
        self._buffered = 0
        self._unfinished = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self.high_water = 0
        """The most events ever waiting at once: how close bursts came to ``max_buffer``."""
        self._api = api_client
        self.component = component
        self.host = host
        self._clock = clock or RealClock()
        self._names = EventNameFactory(self._clock)
        self.correlator = EventCorrelator(
            clock=self._clock, options=correlator_options, name_factory=self._names
        )
        self._dropped = _dropped_counter(registry if registry is not None else REGISTRY)
        self.max_tries = max_tries
        self.retry_sleep = retry_sleep
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not security
        self._last_drop_log: float | None = None
        self._drops_since_log: dict[str, int] = {}

    def event(
        self,
        obj: object,
        type_: str,
        reason: str,
        message: str,
        *,
        annotations: Mapping[str, str] | None = None,
    ) -> None:
        """Queue an event about ``obj`` (a JSON dict, a kubernetes-asyncio model or an
        ObjectReference dict). ``type_`` is ``Normal`` or ``Warning``. Never blocks, never
        raises: bad input and a full buffer are logged and counted."""
        try:
            if type_ not in (EVENT_TYPE_NORMAL, EVENT_TYPE_WARNING):
                raise ValueError(f"unsupported event type {type_!r}")
            ref = object_reference(obj, self._api)
            event = _Recorded(
                self,
                ref,
                type_=type_,
                reason=reason,
                message=message,
                annotations=annotations,
                name=self._names(str(ref["name"])),
                time=event_time(self._clock.now()),
            )
        except Exception as err:  # a recorder must never fail its caller
            self._drop("invalid", reason=reason, error=str(err))
            return
        if self._buffered >= self.max_buffer:
            self._drop("buffer_full", reason=reason, object=_describe(ref))
            return
        key = _object_key(ref)
        waiting = self._waiting.get(key)
        if waiting is None:
            self._waiting[key] = deque((event,))
            if key not in self._in_flight:
                self._ready.append(key)
        else:
            waiting.append(event)
        self._buffered += 1
        self.high_water = max(self.high_water, self._buffered)
        self._unfinished += 1
        self._idle.clear()
        self._release()

    @property
    def pending(self) -> int:
        """Events buffered and not yet written (or dropped), those being written excluded."""
        return self._buffered

    @property
    def parked_writers(self) -> int:
        """Writers waiting for an event to take: none is ready, or :attr:`busy` holds them
        back. All of them, with events :attr:`pending`, means the recorder is holding back."""
        return sum(not waiter.done() for waiter in self._parked)

    def wake(self) -> None:
        """Re-evaluate :attr:`busy` now and let parked writers go if writing is allowed. The
        owner calls it whenever its work may have run out without an event being recorded
        (after each work item: :meth:`waking`). Cheap, never blocks, never raises."""
        self._release()

    def waking(self, process: Callable[_P, Awaitable[None]]) -> Callable[_P, Awaitable[None]]:
        """``process`` (a worker's per-item coroutine function) calling :meth:`wake` when it
        returns or raises, so held-back events go out as soon as the work queue runs dry."""

        @functools.wraps(process)
        async def process_then_wake(*args: _P.args, **kwargs: _P.kwargs) -> None:
            try:
                await process(*args, **kwargs)
            finally:
                self._release()

        return process_then_wake

    def _allowed(self) -> int:
        """How many writers may take a new event now (the yield-to-``busy`` rule): every
        ready object's worth unless ``busy`` holds, else what ``busy_writers`` and the
        events above ``hold_limit`` allow."""
        ready = len(self._ready)
        if not ready:
            return 0
        over = self._buffered - self.hold_limit
        if self.busy is None or self._flushing or over >= ready or not self._is_busy():
            return ready
        return min(ready, max(self.busy_writers - self._writing, over, 0))

    def _is_busy(self) -> bool:
        assert self.busy is not None
        try:
            return self.busy()
        except Exception:  # a broken predicate must not hold events back forever
            if not self._busy_failed:
                self._busy_failed = True
                log.exception(
                    "the busy predicate failed; writing events regardless",
                    component=self.component,
                )
            return False

    def _release(self) -> None:
        """Wake as many parked writers as may take an event now (not more: those woken
        would only park again, a wake-up each for nothing)."""
        if not self._parked:
            return
        n = self._allowed() - self._waking
        while n > 0 and self._parked:
            waiter = self._parked.popleft()
            if not waiter.done():
                waiter.set_result(None)
                self._waking += 1
                n -= 1

    async def _take(self) -> tuple[str, ...]:
        """Wait until an object is ready and writing is allowed; hand out that object."""
        while not self._allowed():
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._parked.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._waking -= 1
                    self._release()  # pass on a wake-up this writer will not use
                else:
                    with contextlib.suppress(ValueError):
                        self._parked.remove(waiter)
                raise
            self._waking -= 1
        return self._ready.popleft()

    async def run(self) -> None:
        """Write buffered events until cancelled. Events still buffered when cancelled are
        counted as dropped (``shutdown``); call :meth:`flush` first to avoid that."""
        try:
            async with asyncio.TaskGroup() as tg:
                for i in range(self.writers):
                    tg.create_task(self._writer(), name=f"event-writer-{i}")
        finally:
            left = self._buffered
            self._waiting.clear()
            self._ready.clear()
            self._parked.clear()
            self._waking = 0
            self._buffered = 0
            self._unfinished -= left
            if self._unfinished <= 0:
                self._unfinished = 0
                self._idle.set()
            if left:
                self._dropped.labels("shutdown").inc(left)
                log.warning("events dropped at shutdown", count=left, component=self.component)

    async def _writer(self) -> None:
        while True:
            key = await self._take()
            waiting = self._waiting[key]
            event = waiting.popleft()
            if not waiting:
                del self._waiting[key]
            self._buffered -= 1
            self._in_flight.add(key)
            self._writing += 1
            try:
                await self._record(event.as_event())
            except asyncio.CancelledError:
                # Interrupted mid-write or mid-retry: it may not have been written.
                self._dropped.labels("shutdown").inc()
                raise
            except Exception:  # the writer outlives any one bad event
                log.exception("event writer failed on one event", component=self.component)
                self._dropped.labels("error").inc()
            finally:
                self._writing -= 1
                self._in_flight.discard(key)
                if key in self._waiting:
                    self._ready.append(key)
                self._unfinished -= 1
                if self._unfinished == 0:
                    self._idle.set()
                # No _release here: this writer goes back to _take and re-evaluates itself.

    async def flush(self, timeout: float) -> bool:  # noqa: ASYNC109 - clock-driven timeout
        """Wait until every buffered event is written or dropped, at most ``timeout``
        seconds of the recorder's clock; True when the buffer drained in time. Needs
        :meth:`run` to be running. While it waits, the writers write at full speed even if
        :attr:`busy` holds."""
        self._flushing += 1
        try:
            self._release()
            return await _wait_with_timeout(self._idle.wait(), timeout, self._clock)
        finally:
            self._flushing -= 1

    async def _record(self, event: Obj) -> None:
        try:
            result = self.correlator.correlate(event)
        except Exception as err:  # a malformed event must not stop the writer
            self._drop("invalid", reason=event.get("reason"), error=type(err).__name__)
            return
        what = _describe(involved_object(event))
        if result.skip or result.event is None:
            self._drop("spam", reason=event.get("reason"), object=what)
            return
        tries = 0
        while True:
            outcome = await self._write(result.event, result.patch)
            if outcome == "ok":
                return
            if outcome == "rejected":
                self._drop("rejected", reason=event.get("reason"), object=what)
                return
            tries += 1
            if tries >= self.max_tries:
                self._drop("retries", reason=event.get("reason"), object=what)
                return
            delay = self.retry_sleep
            if tries == 1:
                # Spread the first retry so recorders do not stampede a recovering server.
                delay *= self._rng.random()
            await self._clock.sleep(delay)

    async def _write(self, event: Obj, patch: Obj | None) -> str:
        meta = event["metadata"]
        namespace, name = str(meta["namespace"]), str(meta["name"])
        try:
            written: Obj | None = None
            if patch is not None and int(event.get("count") or 1) > 1:
                try:
                    written = await request_json(
                        self._api,
                        "PATCH",
                        EVENTS.path(namespace, name),
                        body=patch,
                        content_type="application/strategic-merge-patch+json",
                    )
                except Exception as err:
                    if not errors.is_not_found(err):
                        raise
            if written is None:
                body = dict(event)
                body["metadata"] = {k: v for k, v in meta.items() if k != "resourceVersion"}
                written = await request_json(self._api, "POST", EVENTS.path(namespace), body=body)
        except errors.ApiException as err:
            if errors.is_retryable(err):
                log.debug("event write failed; will retry", status=err.status, event_name=name)
                return "retry"
            if errors.is_already_exists(err):
                log.debug("event already exists; not retrying", event_name=name)
            else:
                log.debug("event rejected by the API server", status=err.status, event_name=name)
            return "rejected"
        except _TRANSPORT_ERRORS as err:
            log.debug(
                "event write failed; will retry",
                error=describe_transport_error(err),
                event_name=name,
            )
            return "retry"
        self.correlator.update_state(written)
        return "ok"

    def _drop(self, why: str, **context: Any) -> None:
        self._dropped.labels(why).inc()
        self._drops_since_log[why] = self._drops_since_log.get(why, 0) + 1
        now = self._clock.monotonic()
        if self._last_drop_log is None or now - self._last_drop_log >= _DROP_LOG_INTERVAL:
            log.warning(
                "events dropped",
                component=self.component,
                dropped=dict(self._drops_since_log),
                last_drop=why,
                **{k: v for k, v in context.items() if v is not None},
            )
            self._last_drop_log = now
            self._drops_since_log.clear()


def _object_key(ref: Mapping[str, Any]) -> tuple[str, ...]:
    """Which object an event is about, for keeping one object's events in order."""
    return (
        str(ref.get("kind", "")),
        str(ref.get("namespace", "")),
        str(ref.get("name", "")),
        str(ref.get("uid", "")),
    )


def _describe(ref: Mapping[str, Any]) -> str:
    ns, name = ref.get("namespace"), ref.get("name")
    return f"{ref.get('kind', '')} {ns}/{name}" if ns else f"{ref.get('kind', '')} {name}"


async def _wait_with_timeout(aw: Awaitable[object], seconds: float, clock: Clock) -> bool:
    """Await ``aw`` for at most ``seconds`` of ``clock``; False on timeout or failure."""
    work = await run_within(aw, seconds, clock)
    return not work.cancelled() and work.exception() is None

"""Record core/v1 Events about objects the way client-go's ``tools/record`` does: a
non-blocking recorder, a bounded buffer, a correlator that counts repeats, aggregates
similar events and filters spam, and a writer that retries and never fails its caller."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import re
import weakref
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Generic, ParamSpec, TypeVar

import aiohttp
from kubernetes_asyncio.client import ApiClient
from prometheus_client import REGISTRY, CollectorRegistry, Counter

from pyprovlib._logging import get_logger
from pyprovlib.kube import errors
from pyprovlib.kube.clock import Clock, RealClock, run_within
from pyprovlib.kube.config import describe_transport_error, request_json
from pyprovlib.kube.objects import Obj
from pyprovlib.kube.ratelimit import TokenBucket
from pyprovlib.kube.resources import EVENTS, RESOURCES

__all__ = [
    "CONTROLLER_HOLD_LIMIT",
    "CONTROLLER_MAX_BUFFER",
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

_TRUNCATION_SUFFIX = " ..."
_DROP_LOG_INTERVAL = 60.0


@dataclass(frozen=True)
class CorrelatorOptions:
    """client-go's ``CorrelatorOptions`` with its defaults (``events_cache.go``).

    ``cache_size`` bounds each of the three LRU caches; ``spam_burst``/``spam_qps`` are the
    per source+object token bucket (25 events, then one every 5 minutes);
    ``aggregate_max_events`` similar events (same source, object, type and reason, different
    messages) within ``aggregate_interval`` seconds are combined into one.
    """

    cache_size: int = 4096
    spam_burst: int = 25
    spam_qps: float = 1.0 / 300.0
    aggregate_max_events: int = 10
    aggregate_interval: float = 600.0

    def __post_init__(self) -> None:
        for name in ("cache_size", "spam_burst", "aggregate_max_events"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.spam_qps <= 0 or self.aggregate_interval <= 0:
            raise ValueError("spam_qps and aggregate_interval must be positive")


_K = TypeVar("_K")
_V = TypeVar("_V")
_P = ParamSpec("_P")


class _LRU(Generic[_K, _V]):
    """A bounded mapping evicting the least recently used entry, so memory stays flat.

    An OrderedDict, not a plain dict re-inserting what it touches: the correlator gets and
    puts two or three entries per event, and a plain dict's table grows with every
    re-insertion until it is resized (measured: ~1 MB more at a 1,000-claim burst's peak)."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._data: OrderedDict[_K, _V] = OrderedDict()

    def get(self, key: _K) -> _V | None:
        value = self._data.get(key)
        if value is not None:
            self._data.move_to_end(key)
        return value

    def put(self, key: _K, value: _V) -> None:
        self._data[key] = value
        self._data.move_to_end(key)
        while len(self._data) > self._size:
            self._data.popitem(last=False)

    def __len__(self) -> int:
        return len(self._data)


_last_time: tuple[int, str] = (0, "")


def _time(dt: datetime) -> str:
    # metav1.Time serializes as RFC 3339 with whole seconds; events come in bursts within
    # one second, so the last formatting is kept.
    global _last_time  # noqa: PLW0603 - a one-entry cache
    seconds = int(dt.timestamp())
    if _last_time[0] == seconds:
        return _last_time[1]
    text = dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    _last_time = (seconds, text)
    return text


def truncate_message(message: str, limit: int = MAX_MESSAGE_BYTES) -> str:
    """Cut ``message`` to at most ``limit`` UTF-8 bytes, ending with `` ...`` when cut
    (kube-scheduler's ``truncateMessage``), never splitting a character."""
    raw = message.encode("utf-8")
    if len(raw) <= limit:
        return message
    head = raw[: limit - len(_TRUNCATION_SUFFIX)].decode("utf-8", "ignore")
    return head + _TRUNCATION_SUFFIX


def _ref(event: Mapping[str, Any]) -> Mapping[str, Any]:
    r = event.get("involvedObject")
    return r if (type(r) is dict or isinstance(r, Mapping)) else {}


def _source(event: Mapping[str, Any]) -> Mapping[str, Any]:
    s = event.get("source")
    return s if (type(s) is dict or isinstance(s, Mapping)) else {}


def _spam_key(event: Mapping[str, Any]) -> tuple[str, ...]:
    ref, src = _ref(event), _source(event)
    return (
        str(src.get("component", "")),
        str(src.get("host", "")),
        str(ref.get("kind", "")),
        str(ref.get("namespace", "")),
        str(ref.get("name", "")),
        str(ref.get("uid", "")),
        str(ref.get("apiVersion", "")),
    )


def _event_key(
    event: Mapping[str, Any], spam_key: tuple[str, ...] | None = None
) -> tuple[str, ...]:
    ref = _ref(event)
    return (
        *(_spam_key(event) if spam_key is None else spam_key),
        str(ref.get("fieldPath", "")),
        str(event.get("type", "")),
        str(event.get("reason", "")),
        str(event.get("message", "")),
    )


def _aggregate_key(
    event: Mapping[str, Any], spam_key: tuple[str, ...] | None = None
) -> tuple[str, ...]:
    return (
        *(_spam_key(event) if spam_key is None else spam_key),
        str(event.get("type", "")),
        str(event.get("reason", "")),
        str(event.get("reportingComponent", "")),
        str(event.get("reportingInstance", "")),
    )


@dataclass(slots=True)
class _AggregateRecord:
    # client-go's set of distinct messages, at most aggregate_max_events of them: a list is
    # a third of a set's size for the one or two a record usually holds.
    local_keys: list[str]
    last: datetime


@dataclass(slots=True)
class _EventLog:
    count: int
    first_timestamp: str
    name: str
    resource_version: str


@dataclass(frozen=True)
class CorrelateResult:
    """What to do with an event after correlation.

    ``skip``: drop it (spam). Otherwise write ``event``: PATCH it with ``patch`` (a
    strategic merge patch of count, lastTimestamp and message) when ``patch`` is set, else
    create it.
    """

    event: Obj | None
    patch: Obj | None
    skip: bool


class EventCorrelator:
    """client-go's ``EventCorrelator``: aggregate similar events, count identical ones,
    then apply the per source+object spam filter, in that order.

    Pure bookkeeping over JSON dicts; nothing here talks to the API.
    """

    def __init__(
        self,
        *,
        clock: Clock | None = None,
        options: CorrelatorOptions | None = None,
        name_factory: Callable[[str], str] | None = None,
    ) -> None:
        self._clock = clock or RealClock()
        self.options = options or CorrelatorOptions()
        self._name_factory = name_factory or _NameFactory(self._clock)
        size = self.options.cache_size
        self._spam: _LRU[tuple[str, ...], TokenBucket] = _LRU(size)
        self._aggregates: _LRU[tuple[str, ...], _AggregateRecord] = _LRU(size)
        self._logs: _LRU[tuple[str, ...], _EventLog] = _LRU(size)

    def correlate(self, event: Obj) -> CorrelateResult:
        """Run ``event`` (a core/v1 Event dict, count 1) through aggregation, counting and
        the spam filter."""
        # A combined event keeps the source and object: one spam key serves all three steps.
        spam_key = _spam_key(event)
        aggregated, key = self._aggregate(event, spam_key)
        observed, patch = self._observe(aggregated, key)
        if self._filter(spam_key):
            return CorrelateResult(None, None, True)
        return CorrelateResult(observed, patch, False)

    def update_state(self, event: Mapping[str, Any]) -> None:
        """Remember the server's view of a written event (its name, count and
        resourceVersion), so the next identical event patches it."""
        meta = event.get("metadata") or {}
        self._logs.put(
            _event_key(event),
            _EventLog(
                count=int(event.get("count") or 1),
                first_timestamp=str(event.get("firstTimestamp") or ""),
                name=str(meta.get("name", "")),
                resource_version=str(meta.get("resourceVersion", "")),
            ),
        )

    def _aggregate(self, event: Obj, spam_key: tuple[str, ...]) -> tuple[Obj, tuple[str, ...]]:
        now = self._clock.now()
        agg_key = _aggregate_key(event, spam_key)
        record = self._aggregates.get(agg_key)
        interval = self.options.aggregate_interval
        if record is None or (now - record.last).total_seconds() > interval:
            record = _AggregateRecord([], now)
        message = str(event.get("message", ""))
        if message not in record.local_keys:
            record.local_keys.append(message)
        record.last = now
        self._aggregates.put(agg_key, record)
        if len(record.local_keys) < self.options.aggregate_max_events:
            return event, _event_key(event, spam_key)
        # Keep the set bounded at the threshold, like client-go's PopAny.
        record.local_keys.pop()
        ref = dict(_ref(event))
        ts = _time(now)
        combined: Obj = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": self._name_factory(str(ref.get("name", ""))),
                "namespace": event.get("metadata", {}).get("namespace", ""),
            },
            "involvedObject": ref,
            "reason": event.get("reason", ""),
            "message": "(combined from similar events): " + str(event.get("message", "")),
            "type": event.get("type", ""),
            "source": dict(_source(event)),
            "count": 1,
            "firstTimestamp": ts,
            "lastTimestamp": ts,
        }
        return combined, agg_key

    def _observe(self, event: Obj, key: tuple[str, ...]) -> tuple[Obj, Obj | None]:
        observed = dict(event)
        observed["metadata"] = dict(event.get("metadata") or {})
        patch: Obj | None = None
        last = self._logs.get(key)
        if last is not None and last.count > 0:
            observed["metadata"]["name"] = last.name
            if last.resource_version:
                observed["metadata"]["resourceVersion"] = last.resource_version
            observed["firstTimestamp"] = last.first_timestamp
            observed["count"] = last.count + 1
            # client-go diffs against a copy with count 0, lastTimestamp 0 and no message.
            patch = {"count": observed["count"], "lastTimestamp": observed["lastTimestamp"]}
            if observed.get("message"):
                patch["message"] = observed["message"]
        self._logs.put(
            key,
            _EventLog(
                count=int(observed.get("count") or 1),
                first_timestamp=str(observed.get("firstTimestamp") or ""),
                name=str(observed["metadata"].get("name", "")),
                resource_version=str(observed["metadata"].get("resourceVersion", "")),
            ),
        )
        return observed, patch

    def _filter(self, key: tuple[str, ...]) -> bool:
        bucket = self._spam.get(key)
        if bucket is None:
            bucket = TokenBucket(self.options.spam_qps, self.options.spam_burst, clock=self._clock)
        self._spam.put(key, bucket)
        if bucket.tokens() >= 1.0:
            bucket.reserve()
            return False
        return True


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


class _NameFactory:
    """``<object name>.<hex of UnixNano>`` like client-go, made unique per process: with a
    fake clock (or a coarse one) two events about one object could otherwise collide."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._last = 0

    def __call__(self, object_name: str) -> str:
        now = self._clock.now()
        nanos = int(now.timestamp()) * 10**9 + now.microsecond * 1000
        nanos = max(nanos, self._last + 1)
        self._last = nanos
        return f"{object_name}.{nanos:x}"


_KIND_FROM_CLASS = re.compile(r"^V\d+(?:(?:alpha|beta)\d+)?(?P<kind>[A-Z]\w*)$")


def _kind_from_model(model: object) -> tuple[str, str]:
    match = _KIND_FROM_CLASS.match(type(model).__name__)
    if not match:
        return "", ""
    kind = match.group("kind")
    candidates = [r for r in RESOURCES if r.kind == kind and r is not EVENTS]
    if kind == "Event":
        candidates = [EVENTS]
    return (kind, candidates[0].api_version) if len(candidates) == 1 else (kind, "")


def _sanitize(value: Any) -> Any:
    # ApiClient.sanitize_for_serialization without needing a client (which needs a loop).
    if isinstance(value, list | tuple):
        return [_sanitize(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Mapping):
        return {k: _sanitize(v) for k, v in value.items()}
    if hasattr(value, "openapi_types") and hasattr(value, "attribute_map"):
        return {
            value.attribute_map[attr]: _sanitize(getattr(value, attr))
            for attr in value.openapi_types
            if getattr(value, attr) is not None
        }
    return value


def object_reference(obj: object, api_client: ApiClient | None = None) -> Obj:
    """An ``ObjectReference`` (kind, namespace, name, uid, apiVersion, resourceVersion) to
    ``obj``: a JSON dict, a kubernetes-asyncio model, or a reference dict itself.

    Models often lack kind/apiVersion (list items do); they are derived from the model's
    class, like client-go's ``GetReference`` consults the scheme. Raises ``ValueError`` when
    the object cannot be referenced.
    """
    data: Mapping[str, Any]
    derived_kind, derived_version = "", ""
    if isinstance(obj, Mapping):
        data = obj
    elif hasattr(obj, "openapi_types"):
        serialized = (
            api_client.sanitize_for_serialization(obj) if api_client is not None else _sanitize(obj)
        )
        if not isinstance(serialized, Mapping):
            raise ValueError(f"cannot reference a {type(obj).__name__}")
        data = serialized
        derived_kind, derived_version = _kind_from_model(obj)
    else:
        raise ValueError(f"cannot reference a {type(obj).__name__}: not a dict or a model")

    if "metadata" not in data and "name" in data:
        source: Mapping[str, Any] = data
        kind, api_version = data.get("kind"), data.get("apiVersion")
    else:
        meta = data.get("metadata")
        source = meta if isinstance(meta, Mapping) else {}
        kind, api_version = data.get("kind"), data.get("apiVersion")
    kind = kind or derived_kind
    api_version = api_version or derived_version
    if not kind:
        raise ValueError("object has no kind; cannot reference it")
    if not api_version:
        matches = [r for r in RESOURCES if r.kind == kind]
        if len(matches) != 1:
            raise ValueError(f"object of kind {kind!r} has no apiVersion; cannot reference it")
        api_version = matches[0].api_version
    name = source.get("name")
    if not name:
        raise ValueError(f"{kind} has no name; cannot reference it")
    ref: Obj = {"kind": kind, "apiVersion": api_version, "name": name}
    for field in ("namespace", "uid", "resourceVersion", "fieldPath"):
        value = source.get(field)
        if value:
            ref[field] = value
    return ref


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
        self._names = _NameFactory(self._clock)
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
                time=_time(self._clock.now()),
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
        if result.skip or result.event is None:
            self._drop("spam", reason=event.get("reason"), object=_describe(_ref(event)))
            return
        tries = 0
        while True:
            outcome = await self._write(result.event, result.patch)
            if outcome == "ok":
                return
            if outcome == "rejected":
                self._drop("rejected", reason=event.get("reason"), object=_describe(_ref(event)))
                return
            tries += 1
            if tries >= self.max_tries:
                self._drop("retries", reason=event.get("reason"), object=_describe(_ref(event)))
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

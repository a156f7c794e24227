"""client-go's event correlator (``tools/record/events_cache.go``): aggregate similar
events, count identical ones and filter spam per source and object, before the recorder in
:mod:`pyprovlib.kube._events` writes them. Pure bookkeeping over Event dicts; nothing here
talks to the API."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

from pyprovlib.kube._clock import Clock, RealClock
from pyprovlib.kube._objects import Obj, mapping_field
from pyprovlib.kube._ratelimit import TokenBucket

__all__ = [
    "CorrelateResult",
    "CorrelatorOptions",
    "EventCorrelator",
    "EventNameFactory",
    "event_time",
    "involved_object",
]


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


class LRUCache(Generic[_K, _V]):
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


def event_time(dt: datetime) -> str:
    """``dt`` as an Event's ``metav1.Time``: RFC 3339, whole seconds, UTC."""
    # metav1.Time serializes as RFC 3339 with whole seconds; events come in bursts within
    # one second, so the last formatting is kept.
    global _last_time  # noqa: PLW0603 - a one-entry cache
    seconds = int(dt.timestamp())
    if _last_time[0] == seconds:
        return _last_time[1]
    text = dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    _last_time = (seconds, text)
    return text


def involved_object(event: Mapping[str, Any]) -> Mapping[str, Any]:
    """The event's ``involvedObject`` reference; empty when it has none."""
    return mapping_field(event, "involvedObject")


def _source(event: Mapping[str, Any]) -> Mapping[str, Any]:
    return mapping_field(event, "source")


def _spam_key(event: Mapping[str, Any]) -> tuple[str, ...]:
    ref, src = involved_object(event), _source(event)
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
    ref = involved_object(event)
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
        self._name_factory = name_factory or EventNameFactory(self._clock)
        size = self.options.cache_size
        self._spam: LRUCache[tuple[str, ...], TokenBucket] = LRUCache(size)
        self._aggregates: LRUCache[tuple[str, ...], _AggregateRecord] = LRUCache(size)
        self._logs: LRUCache[tuple[str, ...], _EventLog] = LRUCache(size)

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
        ref = dict(involved_object(event))
        ts = event_time(now)
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


class EventNameFactory:
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

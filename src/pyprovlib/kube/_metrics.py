"""Prometheus metrics for the work queues, under the names client-go exports through
k8s.io/component-base (``workqueue_depth``, ``workqueue_adds_total``, ... labelled ``{name}``).

Only named queues are instrumented, as in client-go. One collector per registry serves every
queue; queues sharing a name share their series, so counts add up across them.

The queues keep their figures in plain numbers and the collector turns them into metric
families at scrape time. This costs a queue operation a few additions instead of
prometheus_client's locked metric updates, which (measured with bench/workqueue.py) made an
add/get/done cycle more than twice as expensive as on an unnamed queue. It also lets
``workqueue_unfinished_work_seconds`` and ``workqueue_longest_running_processor_seconds`` be
computed when scraped, where client-go refreshes them from a 500 ms ticker goroutine per
queue: the collector walks the live queues (held through weak references, so a dropped queue
neither leaks nor keeps reporting in-flight work) and reads each one's start times against
that queue's clock. No background task is needed, a scrape never sees a stale value, and tests
on a fake clock see exact values. Counters belong to the name, not to a queue, so they survive
the queues that counted them.

Collection is meant to run on the event loop's thread (the runtime's aiohttp ``/metrics``). It
copies the containers it iterates, so a scrape from another thread does not crash, though its
figures may be a moment apart from one another.
"""

from __future__ import annotations

import bisect
import weakref
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Final

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from pyprovlib.kube._clock import Clock

__all__ = [
    "ADDS_KEY",
    "DEPTH_KEY",
    "LONGEST_RUNNING_PROCESSOR_KEY",
    "QUEUE_LATENCY_KEY",
    "RETRIES_KEY",
    "UNFINISHED_WORK_KEY",
    "WORKQUEUE_BUCKETS",
    "WORKQUEUE_SUBSYSTEM",
    "WORK_DURATION_KEY",
    "QueueMetrics",
    "WorkqueueMetrics",
    "workqueue_metrics",
]

WORKQUEUE_SUBSYSTEM: Final = "workqueue"
"""The metric subsystem: every name below is prefixed ``workqueue_``."""
DEPTH_KEY: Final = "depth"
"""Gauge: items waiting to be handed out (client-go counts dirty items, see QueueMetrics.add)."""
ADDS_KEY: Final = "adds_total"
"""Counter: adds that made an item dirty (duplicates of a queued item are not counted)."""
QUEUE_LATENCY_KEY: Final = "queue_duration_seconds"
"""Histogram: time from the first add to the get that handed the item out."""
WORK_DURATION_KEY: Final = "work_duration_seconds"
"""Histogram: time from get to done."""
UNFINISHED_WORK_KEY: Final = "unfinished_work_seconds"
"""Gauge: summed age of every item currently being processed."""
LONGEST_RUNNING_PROCESSOR_KEY: Final = "longest_running_processor_seconds"
"""Gauge: age of the oldest item currently being processed."""
RETRIES_KEY: Final = "retries_total"
"""Counter: delayed adds (``add_after`` and ``add_rate_limited``)."""


def _exponential_buckets(start: float, factor: float, count: int) -> tuple[float, ...]:
    # Multiplied step by step like Go's ExponentialBuckets, so the bounds (and their ``le``
    # labels, e.g. 9.999999999999999e-06) are the very floats client-go exports.
    bounds = []
    for _ in range(count):
        bounds.append(start)
        start *= factor
    return tuple(bounds)


WORKQUEUE_BUCKETS: Final = _exponential_buckets(10e-9, 10, 10)
"""component-base's ``ExponentialBuckets(10e-9, 10, 10)``: 1e-8 s up to 10 s."""

# The same spelling prometheus_client's own Histogram gives its ``le`` labels.
_float_to_go: Callable[[float], str] = floatToGoString
_LE: Final = (*(_float_to_go(b) for b in WORKQUEUE_BUCKETS), "+Inf")
_LABELS: Final = ("name",)

_DEPTH_HELP: Final = "Current depth of workqueue"
_ADDS_HELP: Final = "Total number of adds handled by workqueue"
_LATENCY_HELP: Final = "How long in seconds an item stays in workqueue before being requested."
_WORK_HELP: Final = "How long in seconds processing an item from workqueue takes."
_UNFINISHED_HELP: Final = (
    "How many seconds of work has done that is in progress and hasn't been observed by "
    "work_duration. Large values indicate stuck threads. One can deduce the number of stuck "
    "threads by observing the rate at which this increases."
)
_LONGEST_HELP: Final = (
    "How many seconds has the longest running processor for workqueue been running."
)
_RETRIES_HELP: Final = "Total number of retries handled by workqueue"


def _full(key: str) -> str:
    return f"{WORKQUEUE_SUBSYSTEM}_{key}"


class _Histogram:
    """Bucket counts (non-cumulative; the last slot is +Inf only) and the sum of observations."""

    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(WORKQUEUE_BUCKETS) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        # The first bound >= value is the lowest bucket ``le`` that counts it.
        self.counts[bisect.bisect_left(WORKQUEUE_BUCKETS, value)] += 1
        self.total += value

    def cumulative(self) -> list[tuple[str, float]]:
        counts = list(self.counts)
        running = 0
        buckets = []
        for le, count in zip(_LE, counts, strict=True):
            running += count
            buckets.append((le, float(running)))
        return buckets


class _Series:
    """Everything counted under one queue name in one registry."""

    __slots__ = ("adds", "depth", "latency", "retries", "work")

    def __init__(self) -> None:
        self.adds = 0
        self.depth = 0
        self.retries = 0
        self.latency = _Histogram()
        self.work = _Histogram()


class WorkqueueMetrics(Collector):
    """The workqueue collector of one registry; get it with :func:`workqueue_metrics`."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._series: dict[str, _Series] = {}
        # Plain weak references in a plain set rather than a WeakSet: list() copies a set in
        # one step under the GIL, where iterating a WeakSet breaks if a queue is created
        # meanwhile on another thread.
        self._queues: set[weakref.ref[QueueMetrics]] = set()
        registry.register(self)

    def for_queue(self, name: str, clock: Clock) -> QueueMetrics:
        """Instruments for one queue called ``name`` whose durations are read off ``clock``."""
        series = self._series.get(name)
        if series is None:
            series = self._series[name] = _Series()
        queue = QueueMetrics(name, series, clock)
        self._queues.add(weakref.ref(queue, self._queues.discard))
        return queue

    def describe(self) -> Iterable[Metric]:
        """The metric families, without samples (lets the registry check names up front)."""
        return _Families().all()

    def collect(self) -> Iterable[Metric]:
        """The current samples of every named queue."""
        families = _Families()
        for name, series in sorted(self._series.items()):
            families.depth.add_metric([name], series.depth)
            families.adds.add_metric([name], series.adds)
            families.retries.add_metric([name], series.retries)
            families.latency.add_metric([name], series.latency.cumulative(), series.latency.total)
            families.work.add_metric([name], series.work.cumulative(), series.work.total)
        in_flight: dict[str, tuple[float, float]] = {}
        for ref in list(self._queues):
            queue = ref()
            if queue is None:
                continue
            total, oldest = queue.in_flight()
            known_total, known_oldest = in_flight.get(queue.name, (0.0, 0.0))
            in_flight[queue.name] = (known_total + total, max(known_oldest, oldest))
        for name, (total, oldest) in sorted(in_flight.items()):
            families.unfinished.add_metric([name], total)
            families.longest.add_metric([name], oldest)
        return families.all()


def _gauge(key: str, help_text: str) -> GaugeMetricFamily:
    return GaugeMetricFamily(_full(key), help_text, labels=_LABELS)


def _counter(key: str, help_text: str) -> CounterMetricFamily:
    # prometheus_client appends ``_total`` to counter families itself.
    return CounterMetricFamily(_full(key).removesuffix("_total"), help_text, labels=_LABELS)


def _histogram(key: str, help_text: str) -> HistogramMetricFamily:
    return HistogramMetricFamily(_full(key), help_text, labels=_LABELS)


@dataclass
class _Families:
    """One scrape's metric families, in client-go's registration order."""

    depth: GaugeMetricFamily = field(default_factory=lambda: _gauge(DEPTH_KEY, _DEPTH_HELP))
    adds: CounterMetricFamily = field(default_factory=lambda: _counter(ADDS_KEY, _ADDS_HELP))
    latency: HistogramMetricFamily = field(
        default_factory=lambda: _histogram(QUEUE_LATENCY_KEY, _LATENCY_HELP)
    )
    work: HistogramMetricFamily = field(
        default_factory=lambda: _histogram(WORK_DURATION_KEY, _WORK_HELP)
    )
    unfinished: GaugeMetricFamily = field(
        default_factory=lambda: _gauge(UNFINISHED_WORK_KEY, _UNFINISHED_HELP)
    )
    longest: GaugeMetricFamily = field(
        default_factory=lambda: _gauge(LONGEST_RUNNING_PROCESSOR_KEY, _LONGEST_HELP)
    )
    retries: CounterMetricFamily = field(
        default_factory=lambda: _counter(RETRIES_KEY, _RETRIES_HELP)
    )

    def all(self) -> list[Metric]:
        return [
            self.depth,
            self.adds,
            self.latency,
            self.work,
            self.unfinished,
            self.longest,
            self.retries,
        ]


# Keyed weakly so a registry a test throws away takes its collector with it.
_BY_REGISTRY: weakref.WeakKeyDictionary[CollectorRegistry, WorkqueueMetrics] = (
    weakref.WeakKeyDictionary()
)


def workqueue_metrics(registry: CollectorRegistry | None = None) -> WorkqueueMetrics:
    """The workqueue collector of ``registry`` (default: prometheus_client's global
    ``REGISTRY``), registered on first use; later calls return the same object."""
    target = REGISTRY if registry is None else registry
    metrics = _BY_REGISTRY.get(target)
    if metrics is None:
        metrics = WorkqueueMetrics(target)
        _BY_REGISTRY[target] = metrics
    return metrics


class QueueMetrics:
    """The metrics hooks of one named queue, mirroring client-go's ``defaultQueueMetrics``.

    The queue calls :meth:`add` when an item becomes dirty, :meth:`get` when it hands an item
    out, :meth:`done` when the worker finishes and :meth:`retry` for each delayed add.
    """

    __slots__ = ("__weakref__", "_add_times", "_clock", "_processing_starts", "_series", "name")

    def __init__(self, name: str, series: _Series, clock: Clock) -> None:
        self.name = name
        self._series = series
        self._clock = clock
        self._add_times: dict[Hashable, float] = {}
        self._processing_starts: dict[Hashable, float] = {}

    def add(self, item: Hashable) -> None:
        """An item became dirty.

        Like client-go, depth rises here even when the item is being processed and so only
        enters the FIFO at done(); it falls when the item is handed out.
        """
        series = self._series
        series.adds += 1
        series.depth += 1
        # The first add starts the queue-latency clock; later ones do not reset it.
        if item not in self._add_times:
            self._add_times[item] = self._clock.monotonic()

    def get(self, item: Hashable) -> None:
        """An item was handed to a worker."""
        now = self._clock.monotonic()
        self._series.depth -= 1
        self._processing_starts[item] = now
        added = self._add_times.pop(item, None)
        if added is not None:
            self._series.latency.observe(max(0.0, now - added))

    def done(self, item: Hashable) -> None:
        """A worker finished an item."""
        started = self._processing_starts.pop(item, None)
        if started is not None:
            self._series.work.observe(max(0.0, self._clock.monotonic() - started))

    def retry(self) -> None:
        """A delayed add was requested."""
        self._series.retries += 1

    def in_flight(self) -> tuple[float, float]:
        """(summed age, oldest age) in seconds of the items being processed now."""
        now = self._clock.monotonic()
        total = 0.0
        oldest = 0.0
        for started in list(self._processing_starts.values()):
            age = max(0.0, now - started)
            total += age
            oldest = max(oldest, age)
        return total, oldest

"""Topology segments for storage capacity: which segments exist, from the nodes where the
driver runs (external-provisioner's ``pkg/capacity/topology``).

A segment is the driver's topology keys with one node's values for them, sorted by key, e.g.
``(("topology.hostpath.csi/node", "node-1"),)``; the empty segment ``()`` is that of a driver
without topology keys and stands for every node. :class:`NodeTopology` derives the set of
segments from CSINodes (which keys the driver reports on each node) and Nodes (their values,
as labels), and tells its callbacks which segments appeared and which went away.

Invariants:

- Event handlers only enqueue the one key ``""``: every change of a Node's labels or of a
  CSINode's keys for the driver means "recompute"; the worker recomputes from the caches, so
  a burst of events settles into one recomputation (upstream: "let the input data settle").
- Callbacks run on the worker, after :attr:`NodeTopology.segments` changed, with the segments
  added and removed since the previous recomputation (never both empty).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from pyprovlib._logging import get_logger
from pyprovlib.kube._informer import SharedInformer
from pyprovlib.kube._objects import Obj, labels_of, name_of
from pyprovlib.kube._store import DeletedFinalStateUnknown
from pyprovlib.kube._workqueue import RateLimitingQueue, run_worker

__all__ = [
    "TOPOLOGY_QUEUE",
    "FixedTopology",
    "NodeTopology",
    "Segment",
    "SegmentCallback",
    "TopologyInformer",
    "driver_topology_keys",
    "segment_from_node_selector_term",
    "segment_from_selector",
    "segment_selector",
    "segment_text",
]

log = get_logger(__name__)

Segment = tuple[tuple[str, str], ...]
"""One topology segment: (key, value) pairs sorted by key; ``()`` matches every node."""

SegmentCallback = Callable[[list[Segment], list[Segment]], None]
"""``callback(added, removed)``: the segments that appeared and those that went away."""

TOPOLOGY_QUEUE: Final = "csitopology"
"""The work queue of :class:`NodeTopology` (upstream's name, in the ``workqueue_*`` metrics)."""


def segment_selector(segment: Segment) -> dict[str, Any]:
    """The ``nodeTopology`` label selector of a CSIStorageCapacity for ``segment``:
    ``{"matchLabels": {...}}``, or ``{}`` (every node) for the empty segment, as the API server
    stores upstream's ``GetLabelSelector``."""
    if not segment:
        return {}
    return {"matchLabels": dict(segment)}


def segment_from_selector(selector: object) -> Segment | None:
    """The segment a stored ``nodeTopology`` stands for, or None when it is no segment this
    controller would write (absent, or with ``matchExpressions``)."""
    if not isinstance(selector, Mapping):
        return None
    if selector.get("matchExpressions"):
        return None
    labels = selector.get("matchLabels") or {}
    if not isinstance(labels, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
    ):
        return None
    return tuple(sorted(labels.items()))


def segment_from_node_selector_term(term: Mapping[str, Any]) -> Segment:
    """The segment a PV's node selector term names (upstream's ``termToSegment``): only
    ``In`` expressions with exactly one value, no ``matchFields``; ``ValueError`` otherwise."""
    if term.get("matchFields"):
        raise ValueError(f"matchFields not empty: {term.get('matchFields')}")
    pairs: list[tuple[str, str]] = []
    for expression in term.get("matchExpressions") or []:
        operator = expression.get("operator")
        values = expression.get("values") or []
        if operator != "In":
            raise ValueError(f"unexpected operator: {operator}")
        if len(values) != 1:
            raise ValueError(f"need exactly one label value, got: {values}")
        pairs.append((str(expression.get("key", "")), str(values[0])))
    return tuple(sorted(pairs))


def segment_text(segment: Segment) -> str:
    """``key: value+ key: value`` for logs (upstream's ``SimpleString``); ``<all nodes>`` for
    the empty segment."""
    return "+ ".join(f"{k}: {v}" for k, v in segment) or "<all nodes>"


def driver_topology_keys(csinode: Mapping[str, Any], driver: str) -> list[str] | None:
    """The topology keys ``driver`` reports on this CSINode: None when the driver does not run
    on the node, else a (possibly empty) list."""
    for entry in (csinode.get("spec") or {}).get("drivers") or []:
        if isinstance(entry, Mapping) and entry.get("name") == driver:
            return list(entry.get("topologyKeys") or [])
    return None


class TopologyInformer:
    """What the capacity controller needs from a source of segments (upstream's
    ``topology.Informer``)."""

    def add_callback(self, callback: SegmentCallback) -> None:
        """Call ``callback(added, removed)`` on every change of the segments."""
        raise NotImplementedError

    @property
    def segments(self) -> list[Segment]:
        """Every known segment, in the order they were found."""
        raise NotImplementedError

    def has_synced(self) -> bool:
        """True once the segments are known."""
        raise NotImplementedError

    async def run(self, synced: asyncio.Event) -> None:
        """Find the segments, set ``synced``, keep them current until cancelled or the
        informer is shut down."""
        raise NotImplementedError

    def shut_down(self) -> None:
        """Stop :meth:`run`."""

    @property
    def work_queue(self) -> RateLimitingQueue[str] | None:
        """The queue of pending recomputations, if any (counted by the controller's
        ``idle``)."""
        return None


class FixedTopology(TopologyInformer):
    """One segment that never changes (upstream's ``NewFixedNodeTopology``): for an instance
    that serves one node only."""

    def __init__(self, segment: Segment) -> None:
        self._segments = [segment]
        self._stopped = asyncio.Event()

    def add_callback(self, callback: SegmentCallback) -> None:
        """Never called: the segment does not change."""

    @property
    def segments(self) -> list[Segment]:
        return list(self._segments)

    def has_synced(self) -> bool:
        return True

    async def run(self, synced: asyncio.Event) -> None:
        synced.set()
        await self._stopped.wait()

    def shut_down(self) -> None:
        self._stopped.set()


class NodeTopology(TopologyInformer):
    """The segments of the nodes where ``driver`` runs (upstream's ``NewNodeTopology``), from
    the ``nodes`` and ``csinodes`` informers.

    A node counts when its CSINode lists the driver and the Node exists with a label for every
    topology key the driver reports there (a label the kubelet has not set yet leaves the node
    out until it appears). Each segment is listed once however many nodes share it.
    """

    def __init__(
        self,
        driver: str,
        nodes: SharedInformer,
        csinodes: SharedInformer,
        queue: RateLimitingQueue[str],
    ) -> None:
        self.driver = driver
        self._nodes = nodes
        self._csinodes = csinodes
        self._queue = queue
        self._segments: list[Segment] = []
        self._callbacks: list[SegmentCallback] = []
        self._synced = False
        self._log = log.bind(driver=driver)
        nodes.add_event_handler(
            on_add=self._node_added,
            on_update=self._node_updated,
            on_delete=self._node_deleted,
        )
        csinodes.add_event_handler(
            on_add=self._csinode_added,
            on_update=self._csinode_updated,
            on_delete=self._csinode_deleted,
        )

    # -- event handlers: they only enqueue ---------------------------------------------------

    def _node_added(self, obj: Obj) -> None:
        self._queue.add("")

    def _node_updated(self, old: Obj, new: Obj) -> None:
        if labels_of(old) != labels_of(new):
            self._queue.add("")

    def _node_deleted(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        self._queue.add("")

    def _csinode_added(self, obj: Obj) -> None:
        self._queue.add("")

    def _csinode_updated(self, old: Obj, new: Obj) -> None:
        if driver_topology_keys(old, self.driver) != driver_topology_keys(new, self.driver):
            self._queue.add("")

    def _csinode_deleted(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        self._queue.add("")

    # -- TopologyInformer ----------------------------------------------------------------------

    def add_callback(self, callback: SegmentCallback) -> None:
        self._callbacks.append(callback)

    @property
    def segments(self) -> list[Segment]:
        return list(self._segments)

    def has_synced(self) -> bool:
        return self._synced

    async def run(self, synced: asyncio.Event) -> None:
        """Wait for the Node and CSINode caches, compute the segments (then ``synced`` is set),
        and recompute them whenever the handlers ask, until the queue is shut down."""
        await self._nodes.wait_for_sync()
        await self._csinodes.wait_for_sync()
        self.sync()
        self._synced = True
        synced.set()

        async def recompute(_key: str) -> None:
            self.sync()

        await run_worker(self._queue, recompute)

    def shut_down(self) -> None:
        self._queue.shut_down()

    @property
    def work_queue(self) -> RateLimitingQueue[str]:
        return self._queue

    # -- the recomputation ---------------------------------------------------------------------

    def compute(self) -> list[Segment]:
        """The segments the caches show now, each once, in CSINode order."""
        found: list[Segment] = []
        seen: set[Segment] = set()
        node_store = self._nodes.store
        for csinode in self._csinodes.store.list():
            keys = driver_topology_keys(csinode, self.driver)
            if keys is None:
                continue  # the driver does not run there
            node = node_store.get_by_key(name_of(csinode))
            if node is None:
                continue  # a CSINode outliving its Node
            labels = labels_of(node)
            if any(key not in labels for key in keys):
                continue  # the kubelet has not labelled the node yet: wait for its update
            segment: Segment = tuple(sorted((key, labels[key]) for key in set(keys)))
            if segment not in seen:
                seen.add(segment)
                found.append(segment)
        return found

    def sync(self) -> None:
        """Recompute the segments and tell the callbacks what changed."""
        current = self.compute()
        before = set(self._segments)
        now = set(current)
        # Keep the known segments' order; new ones go at the end.
        kept = [s for s in self._segments if s in now]
        added = [s for s in current if s not in before]
        removed = [s for s in self._segments if s not in now]
        self._segments = kept + added
        if not added and not removed:
            return
        self._log.debug(
            "topology changed",
            added=[segment_text(s) for s in added],
            removed=[segment_text(s) for s in removed],
        )
        for callback in list(self._callbacks):
            callback(added, removed)


def describe_segments(segments: Sequence[Segment]) -> list[str]:
    """The segments as text, for logs."""
    return [segment_text(s) for s in segments]

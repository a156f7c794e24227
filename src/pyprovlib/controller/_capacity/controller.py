"""The CapacityController (external-provisioner's ``pkg/capacity/capacity.go``): one
CSIStorageCapacity object per (StorageClass of the driver, topology segment), created,
refreshed and deleted as classes, segments and the driver's capacity change.

Data flow: informers on StorageClasses, Nodes and CSINodes (through
:class:`~pyprovlib.controller.NodeTopology`) decide the *goal*, the set of
:class:`WorkItem` keys; an informer on the CSIStorageCapacity objects of this instance (its
namespace, its driver and managed-by labels) shows what exists. The work queue carries keys
only: a :class:`WorkItem` (create or refresh that pair's object) or an :class:`Obsolete`
object key (delete it unless it is still the one object of a goal item). Workers read the
classes and objects from the caches when they process a key.

Invariants:

- Event handlers only change the goal and enqueue keys; every API write is a worker's.
- One object per goal item: when several match (two instances raced, or an object was taken
  over), the oldest is kept and the others are deleted, with a UID precondition.
- An object is only ever written by the worker holding its item's key (the queue never hands
  one key to two workers); deletes carry the object's UID, so a replacement is never deleted.
- ``_written`` (expectations) holds what this controller wrote that the cache may not show
  yet, so a refresh racing the cache neither creates a second object nor updates a stale one.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

from kubernetes_asyncio.client import ApiClient
from prometheus_client import REGISTRY

from pyprovlib._logging import get_logger
from pyprovlib.controller._capacity.metrics import CapacityCollector
from pyprovlib.controller._capacity.options import CapacityControllerOptions, managed_labels
from pyprovlib.controller._capacity.topology import (
    TOPOLOGY_QUEUE,
    NodeTopology,
    Segment,
    TopologyInformer,
    segment_from_node_selector_term,
    segment_from_selector,
    segment_selector,
    segment_text,
)
from pyprovlib.controller._lifecycle import ControllerLifecycle
from pyprovlib.kube._clock import Clock
from pyprovlib.kube._errors import ApiException, api_error_text, is_conflict, is_not_found
from pyprovlib.kube._informer import SharedInformer, SharedInformerFactory
from pyprovlib.kube._objects import Obj, labels_of, meta, meta_namespace_key, name_of, uid_of
from pyprovlib.kube._quantity import Format, Quantity, quantity_or_none
from pyprovlib.kube._resources import CSI_STORAGE_CAPACITIES, CSINODES, NODES, STORAGE_CLASSES
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.kube._store import DeletedFinalStateUnknown
from pyprovlib.kube._workqueue import ItemExponentialFailureRateLimiter, RateLimitingQueue

__all__ = [
    "CAPACITY_QUEUE",
    "GENERATE_NAME",
    "Capacity",
    "CapacityController",
    "CapacitySource",
    "Obsolete",
    "WorkItem",
]

log = get_logger("pyprovlib.controller._capacity")

CAPACITY_QUEUE: Final = "csistoragecapacity"
"""The work queue's name (upstream's, in the ``workqueue_*`` metrics)."""
GENERATE_NAME: Final = "csisc-"
"""The prefix of the objects' generated names, upstream's."""
_ITEM_INDEX: Final = "capacity-item"


@dataclass(frozen=True)
class Capacity:
    """What the storage reports for one class and segment (CSI's GetCapacityResponse):
    ``available`` bytes, and the largest volume it could create (None: not reported)."""

    available: int
    maximum_volume_size: int | None = None


class CapacitySource(Protocol):
    """Where capacity comes from: a CSI driver's GetCapacity for the CSI sidecar."""

    async def get_capacity(self, parameters: Mapping[str, str], segment: Segment) -> Capacity:
        """The capacity for volumes of a class with ``parameters`` in ``segment`` (``()``:
        no topology). Raise to have the item retried with backoff."""
        ...


@dataclass(frozen=True)
class WorkItem:
    """One object that should exist: the capacity of ``storage_class`` in ``segment``."""

    storage_class: str
    segment: Segment

    def __str__(self) -> str:
        return f"{self.storage_class} in {segment_text(self.segment)}"


@dataclass(frozen=True)
class Obsolete:
    """A CSIStorageCapacity object (``namespace/name``) that may have to go."""

    key: str

    def __str__(self) -> str:
        return self.key


Key = WorkItem | Obsolete


def _index_value(storage_class: str, segment: Segment) -> str:
    return json.dumps([storage_class, [list(pair) for pair in segment]])


def item_of(obj: Mapping[str, Any]) -> WorkItem | None:
    """The pair an object reports on, or None when it is no object this controller writes."""
    segment = segment_from_selector(obj.get("nodeTopology"))
    storage_class = obj.get("storageClassName")
    if segment is None or not isinstance(storage_class, str):
        return None
    return WorkItem(storage_class, segment)


def _by_item(obj: Obj) -> list[str]:
    item = item_of(obj)
    return [] if item is None else [_index_value(item.storage_class, item.segment)]


def _age_key(obj: Mapping[str, Any]) -> tuple[str, str]:
    return (str(meta(obj).get("creationTimestamp") or ""), name_of(obj))


def _rv_at_least(have: str, wanted: str) -> bool:
    if have.isdigit() and wanted.isdigit():
        return int(have) >= int(wanted)
    return have == wanted


def _bytes(value: object) -> int | None:
    quantity = quantity_or_none(value)
    return None if quantity is None else quantity.value()


def _quantity(value: int) -> str:
    # resource.NewQuantity(value, resource.BinarySI), as upstream writes it.
    return str(Quantity.from_int(value, Format.BINARY_SI))


class CapacityController(ControllerLifecycle):
    """Keeps one CSIStorageCapacity per (StorageClass of ``driver``, topology segment) in
    ``options.namespace``, with the capacity ``source`` reports (upstream's
    ``NewCentralCapacityController``).

    ``client`` makes the writes: give it a limiter of its own (the sidecar's is limited by
    ``--kube-api-capacity-qps``/``-burst``) to keep them off the provisioner's budget, as
    upstream does. Reads come from ``informer_factory`` (when given, the caller starts it, as
    with the provisioner's shared factory).
    ``topology`` defaults to the segments of the nodes where the driver runs
    (:class:`NodeTopology`).

    The provisioner tells it about volumes it created or deleted (:meth:`after_provision`,
    :meth:`after_delete`), so the objects of that topology or class are refreshed before the
    next poll.
    """

    def __init__(
        self,
        client: ApiClient,
        driver: str,
        source: CapacitySource,
        options: CapacityControllerOptions,
        *,
        informer_factory: SharedInformerFactory | None = None,
        topology: TopologyInformer | None = None,
        clock: Clock | None = None,
    ) -> None:
        if not driver:
            raise ValueError("driver must not be empty")
        self.driver = driver
        self.source = source
        self.options = options
        super().__init__(
            client,
            options,
            role="capacity controller",
            lease_name=f"external-provisioner-capacity-{driver.replace('/', '-')}",
            log=log.bind(driver=driver),
            informer_factory=informer_factory,
            clock=clock,
        )
        self.labels = managed_labels(driver, options.managed_by)
        self._writes = ResourceClient(client, CSI_STORAGE_CAPACITIES)
        limiter = ItemExponentialFailureRateLimiter(
            options.retry_interval_start, options.retry_interval_max
        )
        self.queue: RateLimitingQueue[Key] = RateLimitingQueue(
            CAPACITY_QUEUE, limiter, clock=self._clock, registry=options.registry
        )
        factory = self.informer_factory
        self.class_informer: SharedInformer = factory.informer_for(STORAGE_CLASSES)
        selector = ",".join(f"{k}={v}" for k, v in sorted(self.labels.items()))
        self.capacity_informer: SharedInformer = factory.informer_for(
            CSI_STORAGE_CAPACITIES,
            namespace=options.namespace,
            label_selector=selector,
            resync_period=options.resync_period,
        )
        self.capacity_informer.add_indexers({_ITEM_INDEX: _by_item})
        if topology is None:
            topology = NodeTopology(
                driver,
                factory.informer_for(NODES),
                factory.informer_for(CSINODES),
                RateLimitingQueue(
                    TOPOLOGY_QUEUE,
                    ItemExponentialFailureRateLimiter(
                        options.retry_interval_start, options.retry_interval_max
                    ),
                    clock=self._clock,
                    registry=options.registry,
                ),
            )
        self.topology = topology
        # The goal: every object that should exist (an ordered set).
        self._goal: dict[WorkItem, None] = {}
        # Expectations: the object this controller last wrote per item, until the cache shows it.
        self._written: dict[WorkItem, Obj] = {}
        self.class_informer.add_event_handler(
            on_add=self._class_changed,
            on_update=lambda _old, new: self._class_changed(new),
            on_delete=self._class_deleted,
        )
        topology.add_callback(self._topology_changed)

    # -- state, for tests and metrics ----------------------------------------------------------

    @property
    def goal(self) -> list[WorkItem]:
        """Every (class, segment) pair that should have an object."""
        return list(self._goal)

    def counts(self) -> tuple[int, int, int]:
        """(goal, current, obsolete): the objects that should exist, those of them that do,
        and those that exist and will be deleted (upstream's three gauges)."""
        store = self.capacity_informer.store
        # Copies first: a scrape served from another thread (prometheus_client's own HTTP
        # server) must not iterate what the event loop changes.
        goal = set(self._goal)
        current = sum(
            1
            for item in goal
            if store.index_keys(_ITEM_INDEX, _index_value(item.storage_class, item.segment))
        )
        obsolete = 0
        for obj in store.list():
            labels = labels_of(obj)
            if any(labels.get(k) != v for k, v in self.labels.items()):
                continue  # not managed here (the informer's selector keeps these out)
            item = item_of(obj)
            if item is None or item not in goal:
                obsolete += 1
        return len(goal), current, obsolete

    def _work_queues(self) -> tuple[RateLimitingQueue[Any], ...]:
        topology_queue = self.topology.work_queue
        return (self.queue,) if topology_queue is None else (self.queue, topology_queue)

    # -- the goal: event handlers only change it and enqueue -----------------------------------

    def _wants(self, storage_class: Mapping[str, Any]) -> bool:
        if storage_class.get("provisioner") != self.driver:
            return False
        # The scheduler only reads capacity for WaitForFirstConsumer claims.
        return (
            self.options.immediate_binding or storage_class.get("volumeBindingMode") != "Immediate"
        )

    def _add_item(self, item: WorkItem) -> None:
        self._goal.setdefault(item, None)
        self.queue.add(item)

    def _remove_item(self, item: WorkItem) -> None:
        if item not in self._goal:
            return
        del self._goal[item]
        self._written.pop(item, None)
        # What exists for it goes (an object the cache does not show yet is enqueued by the
        # capacity handler once it does).
        for key in self.capacity_informer.store.index_keys(
            _ITEM_INDEX, _index_value(item.storage_class, item.segment)
        ):
            self.queue.add(Obsolete(key))

    def _class_changed(self, storage_class: Obj) -> None:
        if not self._wants(storage_class):
            return
        name = name_of(storage_class)
        for segment in self.topology.segments:
            self._add_item(WorkItem(name, segment))

    def _class_deleted(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        storage_class = obj.obj if isinstance(obj, DeletedFinalStateUnknown) else obj
        if storage_class.get("provisioner") != self.driver:
            return
        name = name_of(storage_class)
        for item in [i for i in self._goal if i.storage_class == name]:
            self._remove_item(item)

    def _topology_changed(self, added: list[Segment], removed: list[Segment]) -> None:
        for storage_class in self.class_informer.store.list():
            if not self._wants(storage_class):
                continue
            name = name_of(storage_class)
            for segment in added:
                self._add_item(WorkItem(name, segment))
            for segment in removed:
                self._remove_item(WorkItem(name, segment))

    def _capacity_seen(self, obj: Obj) -> None:
        item = item_of(obj)
        if item is None or item not in self._goal:
            self.queue.add(Obsolete(meta_namespace_key(obj)))
            return
        siblings = self.capacity_informer.store.index_keys(
            _ITEM_INDEX, _index_value(item.storage_class, item.segment)
        )
        if len(siblings) > 1:
            self.queue.add(item)  # its worker keeps one and deletes the others

    def _capacity_gone(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        last = obj.obj if isinstance(obj, DeletedFinalStateUnknown) else obj
        item = item_of(last)
        if item is not None and item in self._goal:
            # Still needed: someone else removed it (or its labels); make it again.
            self.queue.add(item)

    # -- refreshes: the provisioner's hints, and the poll --------------------------------------

    def refresh_topology(self, node_affinity: Mapping[str, Any]) -> None:
        """Refresh the objects of the segments a PV's ``spec.nodeAffinity`` names (upstream's
        ``refreshTopology``): a volume was created or deleted there."""
        required = node_affinity.get("required") or {}
        terms = required.get("nodeSelectorTerms") if isinstance(required, Mapping) else None
        if not terms:
            self._log.warning("not refreshing: no node selector terms in the node affinity")
            return
        for term in terms:
            try:
                segment = segment_from_node_selector_term(term)
            except ValueError as err:
                self._log.warning("not refreshing: unexpected node selector term", error=str(err))
                continue
            for item in self._goal:
                if item.segment == segment:
                    self.queue.add(item)

    def refresh_class(self, storage_class: str) -> None:
        """Refresh every object of ``storage_class`` (upstream's ``refreshSC``)."""
        for item in self._goal:
            if item.storage_class == storage_class:
                self.queue.add(item)

    def after_provision(
        self, storage_class: str, volume: Mapping[str, Any] | None, *, changed: bool = True
    ) -> None:
        """What upstream's provision wrapper does after Provision: a volume created with a
        node affinity refreshes that topology, one without refreshes its class; a failed
        attempt that may have changed something (``changed``) refreshes the class, which
        helps the scheduler choose another node for the claim."""
        if volume is not None:
            affinity = (volume.get("spec") or {}).get("nodeAffinity")
            if isinstance(affinity, Mapping):
                self.refresh_topology(affinity)
            elif storage_class:
                self.refresh_class(storage_class)
        elif changed and storage_class:
            self.refresh_class(storage_class)

    def after_delete(self, volume: Mapping[str, Any]) -> None:
        """A volume was deleted: refresh the topology it had (the class may be gone)."""
        affinity = (volume.get("spec") or {}).get("nodeAffinity")
        if isinstance(affinity, Mapping):
            self.refresh_topology(affinity)

    async def _poll(self) -> None:
        while True:
            for item in list(self._goal):
                self.queue.add(item)
            await self._clock.sleep(self.options.poll_interval)

    # -- running -------------------------------------------------------------------------------

    async def run(self) -> None:
        """Run until stopped (or cancelled): informers (when the controller owns its factory),
        the topology, the poll and the workers."""
        registry = self.options.registry if self.options.registry is not None else REGISTRY
        collector = CapacityCollector(self.counts)
        registry.register(collector)
        try:
            with self._running():
                self._log.info(
                    "starting capacity controller",
                    namespace=self.options.namespace,
                    poll_interval=self.options.poll_interval,
                )
                await self._run_elected()
            self._log.info("capacity controller stopped")
        finally:
            registry.unregister(collector)

    async def _run_controller(self) -> None:
        async with asyncio.TaskGroup() as tg:
            informers = tg.create_task(self._run_informers(), name="capacity-informers")
            topology_synced = asyncio.Event()
            topology = tg.create_task(self.topology.run(topology_synced), name="csitopology")
            try:
                async with self.queue:
                    if await self._prepare(topology_synced):
                        self._synced = True
                        workers = self._start_workers(
                            tg, self.options.workers, self.queue, self._process, drain=False
                        )
                        poll = tg.create_task(self._poll(), name="capacity-poll")
                        self._log.info("started capacity controller", objects=len(self._goal))
                        await self._stop_requested.wait()
                        self._synced = False
                        poll.cancel()
                        self.queue.shut_down()
                        await asyncio.gather(*workers)
            finally:
                self.topology.shut_down()
                topology.cancel()
                informers.cancel()

    async def _prepare(self, topology_synced: asyncio.Event) -> bool:
        """Wait until the classes, the topology and the objects are known; then the goal is
        complete and every existing object is matched to it (upstream's ``prepare``)."""

        async def synced() -> None:
            await self.class_informer.wait_for_sync()
            await self.capacity_informer.wait_for_sync()
            await topology_synced.wait()

        if not await self._until_stopped(synced()):
            return False
        self._topology_changed(self.topology.segments, [])
        # A handler added to a synced informer is first given every cached object.
        self.capacity_informer.add_event_handler(
            on_add=self._capacity_seen,
            on_update=lambda _old, new: self._capacity_seen(new),
            on_delete=self._capacity_gone,
        )
        self._log.debug(
            "capacity goal known",
            segments=len(self.topology.segments),
            objects=len(self._goal),
            existing=len(self.capacity_informer.store),
        )
        return True

    # -- workers -------------------------------------------------------------------------------

    async def _process(self, key: Key) -> None:
        try:
            if isinstance(key, WorkItem):
                await self.sync_item(key)
            else:
                await self.sync_obsolete(key)
        except Exception as err:
            self._log.warning(
                "capacity sync failed; retrying",
                item=str(key),
                retries=self.queue.num_requeues(key),
                error=api_error_text(err),
            )
            self.queue.add_rate_limited(key)
            return
        self.queue.forget(key)

    def _objects_for(self, item: WorkItem) -> list[Obj]:
        """The objects of ``item``, oldest first, with what this controller wrote in place of
        a cached version the write is newer than."""
        cached = self.capacity_informer.store.by_index(
            _ITEM_INDEX, _index_value(item.storage_class, item.segment)
        )
        written = self._written.get(item)
        if written is not None and _rv_at_least(
            self.capacity_informer.last_sync_resource_version,
            str(meta(written).get("resourceVersion") or ""),
        ):
            # The cache has seen our write (and whatever came after it): trust the cache.
            del self._written[item]
            written = None
        if written is not None:
            cached = [o for o in cached if uid_of(o) != uid_of(written)] + [written]
        return sorted(cached, key=_age_key)

    def _owned(self, obj: Mapping[str, Any]) -> bool:
        owner = self.options.owner
        if owner is None:
            return True
        return any(
            isinstance(ref, Mapping)
            and ref.get("controller") is True
            and ref.get("uid") == owner["uid"]
            for ref in meta(obj).get("ownerReferences") or []
        )

    async def sync_item(self, item: WorkItem) -> None:
        """Create or refresh the object of ``item`` (upstream's ``syncCapacity``); delete any
        other object reporting on the same pair."""
        if item not in self._goal:
            return  # its class or segment went away meanwhile
        storage_class = self.class_informer.store.get_by_key(item.storage_class)
        if storage_class is None:
            return  # the class's delete event removes the item
        parameters = storage_class.get("parameters") or {}
        capacity = await self.source.get_capacity(dict(parameters), item.segment)
        if item not in self._goal:
            return  # became obsolete during the call: write nothing
        objects = self._objects_for(item)
        for extra in objects[1:]:
            self.queue.add(Obsolete(meta_namespace_key(extra)))
        current = objects[0] if objects else None
        logger = self._log.bind(**{"class": item.storage_class}, segment=segment_text(item.segment))
        if current is None:
            await self._create(item, capacity, logger)
            return
        same = (
            _bytes(current.get("capacity")) == capacity.available
            and _bytes(current.get("maximumVolumeSize")) == capacity.maximum_volume_size
            and self._owned(current)
        )
        if same:
            return
        updated = json.loads(json.dumps(current))  # never change the cache's object
        updated["capacity"] = _quantity(capacity.available)
        if capacity.maximum_volume_size is None:
            updated.pop("maximumVolumeSize", None)
        else:
            updated["maximumVolumeSize"] = _quantity(capacity.maximum_volume_size)
        owner = self.options.owner
        if owner is not None and not self._owned(current):
            # Adopted: this instance becomes its controller. An object may have one controller
            # reference only, so another's (an old deployment's) is replaced; upstream appends
            # its own and the update is refused for good.
            meta_out = updated.setdefault("metadata", {})
            kept = [
                ref
                for ref in meta_out.get("ownerReferences") or []
                if not (isinstance(ref, Mapping) and ref.get("controller") is True)
            ]
            meta_out["ownerReferences"] = [*kept, dict(owner)]
        written = await self._writes.replace(updated)
        self._written[item] = written
        logger.debug(
            "CSIStorageCapacity updated",
            name=name_of(written),
            capacity=updated["capacity"],
            maximum_volume_size=updated.get("maximumVolumeSize"),
        )

    async def _create(self, item: WorkItem, capacity: Capacity, logger: Any) -> None:
        metadata: Obj = {
            "generateName": GENERATE_NAME,
            "namespace": self.options.namespace,
            "labels": dict(self.labels),
        }
        if self.options.owner is not None:
            metadata["ownerReferences"] = [dict(self.options.owner)]
        body: Obj = {
            "apiVersion": CSI_STORAGE_CAPACITIES.api_version,
            "kind": CSI_STORAGE_CAPACITIES.kind,
            "metadata": metadata,
            "storageClassName": item.storage_class,
            "nodeTopology": segment_selector(item.segment),
            "capacity": _quantity(capacity.available),
        }
        if capacity.maximum_volume_size is not None:
            body["maximumVolumeSize"] = _quantity(capacity.maximum_volume_size)
        created = await self._writes.create(body, self.options.namespace)
        self._written[item] = created
        logger.debug("CSIStorageCapacity created", name=name_of(created), capacity=body["capacity"])

    async def sync_obsolete(self, key: Obsolete) -> None:
        """Delete the object ``key`` names unless it is (again) the one object of a goal item."""
        obj = self.capacity_informer.store.get_by_key(key.key)
        if obj is None:
            return
        item = item_of(obj)
        if item is not None and item in self._goal:
            objects = self._objects_for(item)
            if objects and uid_of(objects[0]) == uid_of(obj):
                return  # the object its item keeps
        namespace, _, name = key.key.partition("/")
        try:
            await self._writes.delete(name, namespace, preconditions={"uid": uid_of(obj)})
        except ApiException as err:
            if is_not_found(err) or is_conflict(err):
                return  # already gone, or replaced by another object (a new key of its own)
            raise
        self._log.debug(
            "CSIStorageCapacity deleted", name=name, storage_class=obj.get("storageClassName")
        )

"""What the capacity controller's tests share: a capacity source standing in for a driver's
GetCapacity (a table by class ``kind`` parameter and node), the Nodes, CSINodes and classes
of a cluster, and the CapacityController running over a shared informer factory against the
in-memory API server (or a real cluster: every object has a unique name)."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from claim_support import class_body
from kubernetes_asyncio.client import ApiClient
from prometheus_client import CollectorRegistry
from task_support import informers_running

from pyprovlib import testing
from pyprovlib.controller._capacity import (
    Capacity,
    CapacityController,
    CapacityControllerOptions,
    Segment,
)
from pyprovlib.kube._clock import Clock
from pyprovlib.kube._errors import is_not_found
from pyprovlib.kube._informer import SharedInformerFactory
from pyprovlib.kube._objects import Obj
from pyprovlib.kube._resources import (
    CONFIGMAPS,
    CSI_STORAGE_CAPACITIES,
    CSINODES,
    NAMESPACES,
    NODES,
    STORAGE_CLASSES,
)
from pyprovlib.kube._rest import ResourceClient

TOPOLOGY_KEY = "topology.capacity.test/node"
GI = 1 << 30


@dataclass
class FakeSource:
    """GetCapacity of a pretend driver: ``table[(kind, node)]`` (kind: the class's ``kind``
    parameter; node: the segment's value of :data:`TOPOLOGY_KEY`, '' without), else
    ``default``. Every call is recorded; ``fail`` makes calls raise."""

    table: dict[tuple[str, str], Capacity] = field(default_factory=dict)
    default: Capacity = field(default_factory=lambda: Capacity(100 * GI, 10 * GI))
    calls: list[tuple[dict[str, str], Segment]] = field(default_factory=list)
    fail: bool = False

    async def get_capacity(self, parameters: Mapping[str, str], segment: Segment) -> Capacity:
        self.calls.append((dict(parameters), segment))
        if self.fail:
            raise RuntimeError("injected GetCapacity failure")
        node = dict(segment).get(TOPOLOGY_KEY, "")
        return self.table.get((parameters.get("kind", ""), node), self.default)

    def calls_for(self, node: str) -> int:
        return sum(1 for _, segment in self.calls if dict(segment).get(TOPOLOGY_KEY) == node)


def shape(obj: Mapping[str, Any]) -> tuple[Any, ...]:
    """What an object says, without name, uid and timestamps: (class, topology, capacity,
    maximumVolumeSize, labels)."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return (
        obj.get("storageClassName"),
        tuple(sorted(((obj.get("nodeTopology") or {}).get("matchLabels") or {}).items())),
        obj.get("capacity"),
        obj.get("maximumVolumeSize"),
        tuple(sorted(labels.items())),
    )


@dataclass
class Cluster:
    """Objects of one test: a namespace for the capacity objects, a driver name, and helpers
    for Nodes, CSINodes and classes (cluster-scoped, with unique names)."""

    api: ApiClient
    namespace: str
    driver: str
    token: str = field(default_factory=lambda: secrets.token_hex(3))

    def name(self, base: str) -> str:
        return f"{base}-{self.token}"

    async def node(self, base: str, *, labelled: bool = True, value: str | None = None) -> str:
        """A Node labelled with its own name as the topology value (or ``value``)."""
        name = self.name(base)
        labels = {TOPOLOGY_KEY: value or name} if labelled else {}
        await ResourceClient(self.api, NODES).create(
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}
        )
        return name

    async def driver_node(self, base: str) -> str:
        """A Node (as :meth:`node`) that runs the driver: its CSINode reports the topology key."""
        name = await self.node(base)
        await self.csinode(name)
        return name

    async def csinode(self, node: str, keys: list[str] | None = None) -> Obj:
        return await ResourceClient(self.api, CSINODES).create(
            {
                "apiVersion": "storage.k8s.io/v1",
                "kind": "CSINode",
                "metadata": {"name": node},
                "spec": {
                    "drivers": [
                        {
                            "name": self.driver,
                            "nodeID": node,
                            "topologyKeys": [TOPOLOGY_KEY] if keys is None else keys,
                        }
                    ]
                },
            }
        )

    async def storage_class(
        self,
        base: str,
        kind: str = "",
        *,
        mode: str = "WaitForFirstConsumer",
        provisioner: str | None = None,
    ) -> str:
        name = self.name(base)
        await ResourceClient(self.api, STORAGE_CLASSES).create(
            class_body(
                name,
                provisioner or self.driver,
                volumeBindingMode=mode,
                parameters={"kind": kind} if kind else {},
            )
        )
        return name

    async def owner(self, name: str) -> Obj:
        """A controller reference to a ConfigMap ``name``, created in the namespace to stand in
        for the Deployment: an owner that exists (a real garbage collector deletes the
        dependents of one that does not)."""
        stand_in = await ResourceClient(self.api, CONFIGMAPS).create(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": self.namespace},
            }
        )
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "name": name,
            "uid": stand_in["metadata"]["uid"],
            "controller": True,
        }

    async def capacity_object(
        self,
        storage_class: str,
        node: str,
        *,
        name: str = "",
        labels: Mapping[str, str] | None = None,
        owner: Obj | None = None,
        **fields: Any,
    ) -> Obj:
        """A CSIStorageCapacity of 1Gi in the namespace for ``node``'s segment, as an earlier
        instance would have left it: labelled as ours unless ``labels`` says otherwise, named
        ``name`` (else generated), owned by ``owner``; ``fields`` added or replaced."""
        metadata: Obj = {"name": name} if name else {"generateName": "csisc-"}
        metadata.update(namespace=self.namespace, labels=dict(labels or self.labels()))
        if owner is not None:
            metadata["ownerReferences"] = [owner]
        return await ResourceClient(self.api, CSI_STORAGE_CAPACITIES).create(
            {
                "apiVersion": "storage.k8s.io/v1",
                "kind": "CSIStorageCapacity",
                "metadata": metadata,
                "storageClassName": storage_class,
                "nodeTopology": {"matchLabels": {TOPOLOGY_KEY: node}},
                "capacity": "1Gi",
                **fields,
            }
        )

    async def delete(self, resource: Any, name: str) -> None:
        with contextlib.suppress(Exception):
            await ResourceClient(self.api, resource).delete(name)

    async def objects(self) -> list[Obj]:
        listed = await ResourceClient(self.api, CSI_STORAGE_CAPACITIES).list(self.namespace)
        return list(listed.get("items") or [])

    async def shapes(self) -> list[tuple[Any, ...]]:
        return sorted(shape(o) for o in await self.objects())

    async def wait_shapes(self, expected: list[tuple[Any, ...]], message: str) -> list[Obj]:
        """Wait until the objects say exactly ``expected`` (as :func:`shape` gives them)."""
        want = sorted(expected)

        async def reached() -> tuple[list[Obj]] | None:
            objects = await self.objects()
            # A tuple: an empty list of objects is what some waits want, and is falsy.
            return (objects,) if sorted(shape(o) for o in objects) == want else None

        try:
            (found,) = await testing.eventually(reached, message=message, timeout=20)
            return found
        except AssertionError:
            raise AssertionError(f"{message}: want {want}, have {await self.shapes()}") from None

    def labels(self) -> tuple[tuple[str, str], ...]:
        return (
            ("csi.storage.k8s.io/drivername", self.driver),
            ("csi.storage.k8s.io/managed-by", "external-provisioner"),
        )

    def expect(
        self, storage_class: str, node: str | None, capacity: str, maximum: str | None = "10Gi"
    ) -> tuple[Any, ...]:
        topology = () if node is None else ((TOPOLOGY_KEY, node),)
        return (storage_class, topology, capacity, maximum, self.labels())


@contextlib.asynccontextmanager
async def cluster_for(api: ApiClient) -> AsyncIterator[Cluster]:
    """A fresh namespace and driver name; cluster-scoped objects left behind are removed."""
    token = secrets.token_hex(3)
    namespace = f"capacity-{token}"
    await ResourceClient(api, NAMESPACES).create(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
    )
    cluster = Cluster(api, namespace, f"capacity-{token}.csi.pyprovlib.io", token)
    try:
        yield cluster
    finally:
        for resource in (STORAGE_CLASSES, CSINODES, NODES):
            client = ResourceClient(api, resource)
            for item in (await client.list()).get("items") or []:
                name = item["metadata"]["name"]
                if name.endswith(token):
                    try:
                        await client.delete(name)
                    except Exception as err:
                        if not is_not_found(err):
                            raise
        with contextlib.suppress(Exception):
            await ResourceClient(api, NAMESPACES).delete(namespace)


@dataclass
class Running:
    controller: CapacityController
    source: FakeSource
    factory: SharedInformerFactory
    registry: CollectorRegistry


@contextlib.asynccontextmanager
async def capacity_controller(
    cluster: Cluster,
    source: FakeSource | None = None,
    *,
    clock: Clock | None = None,
    **options: Any,
) -> AsyncIterator[Running]:
    """A running CapacityController for ``cluster.driver`` (objects in ``cluster.namespace``),
    its informers from a factory the test runs, as the sidecar shares its own."""
    source = source or FakeSource()
    registry = CollectorRegistry()
    settings: dict[str, Any] = {
        "namespace": cluster.namespace,
        "retry_interval_start": 0.01,
        "retry_interval_max": 0.1,
        "registry": registry,
        **options,
    }
    factory = SharedInformerFactory(cluster.api)
    controller = CapacityController(
        cluster.api,
        cluster.driver,
        source,
        CapacityControllerOptions(**settings),
        informer_factory=factory,
        clock=clock,
    )
    async with informers_running(factory), testing.running(controller, ready=True):
        yield Running(controller, source, factory, registry)

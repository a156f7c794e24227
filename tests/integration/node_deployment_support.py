"""What the node-deployment tests share (``ProvisionControllerOptions(node_deployment=...)``):
Node objects labelled with their own topology segment, and one in-process ProvisionController per
node for one provisioner name, each with a provisioner that records which node's instance
provisioned and deleted what."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from kubernetes_asyncio.client import (
    V1HostPathVolumeSource,
    V1NodeSelector,
    V1NodeSelectorRequirement,
    V1NodeSelectorTerm,
    V1ObjectMeta,
    V1PersistentVolume,
    V1PersistentVolumeSpec,
    V1VolumeNodeAffinity,
)
from provision_support import fast_options

from pyprovlib._provisioner import Provisioner, ProvisionOptions
from pyprovlib.controller._options import NodeDeployment
from pyprovlib.controller._provision import ProvisionController
from pyprovlib.kube._objects import Obj, name_of
from pyprovlib.kube._resources import NODES, PERSISTENT_VOLUME_CLAIMS
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.testing import running
from pyprovlib.testing._cluster import TestCluster

ZONE = "topology.pyprovlib.io/node"


class Ledger:
    """What every instance did: (node, claim uid) per provision, (node, PV) per delete."""

    def __init__(self) -> None:
        self.provisioned: list[tuple[str, str]] = []
        self.deleted: list[tuple[str, str]] = []


class NodeLocalProvisioner(Provisioner):
    """A volume pinned to ``node`` by its ``ZONE`` label."""

    def __init__(self, node: str, ledger: Ledger) -> None:
        self.node = node
        self.ledger = ledger

    async def provision(self, options: ProvisionOptions) -> V1PersistentVolume:
        assert options.selected_node_name == self.node, "provisioned on the wrong node"
        self.ledger.provisioned.append((self.node, options.pvc.metadata.uid))
        await asyncio.sleep(0)
        return V1PersistentVolume(
            metadata=V1ObjectMeta(name=options.pv_name),
            spec=V1PersistentVolumeSpec(
                capacity={"storage": "1Gi"},
                access_modes=["ReadWriteOnce"],
                host_path=V1HostPathVolumeSource(path=f"/tmp/{self.node}/{options.pv_name}"),
                node_affinity=V1VolumeNodeAffinity(
                    required=V1NodeSelector(
                        node_selector_terms=[
                            V1NodeSelectorTerm(
                                match_expressions=[
                                    V1NodeSelectorRequirement(
                                        key=ZONE, operator="In", values=[self.node]
                                    )
                                ]
                            )
                        ]
                    )
                ),
            ),
        )

    async def delete(self, volume: V1PersistentVolume) -> None:
        self.ledger.deleted.append((self.node, volume.metadata.name))


async def create_nodes(c: TestCluster, count: int) -> list[str]:
    """``count`` Node objects labelled with their ``ZONE`` (on a launched control plane too: no
    kubelet needed, nothing runs on them)."""
    c.require_own_cluster("the test registers Node objects")
    nodes = ResourceClient(c.api_client, NODES)
    names = []
    for _ in range(count):
        name = c.unique_name("node")
        await nodes.create(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "labels": {ZONE: name}},
            }
        )
        c.track(NODES, name)
        names.append(name)
    return names


class Deployment:
    """One provisioner name with an instance per node of ``nodes``, and the ledger of what
    they did."""

    def __init__(self, cluster: TestCluster, nodes: list[str]) -> None:
        self.cluster = cluster
        self.provisioner = cluster.unique_name("pyprovlib.io/node-deployment")
        self.nodes = nodes
        self.ledger = Ledger()

    @classmethod
    async def on_new_nodes(cls, cluster: TestCluster, count: int) -> Deployment:
        """A deployment over ``count`` new nodes (:func:`create_nodes`)."""
        return cls(cluster, await create_nodes(cluster, count))

    @contextlib.asynccontextmanager
    async def instances(self, **deployment: Any) -> AsyncIterator[list[ProvisionController]]:
        """One ProvisionController per node (``deployment``: its NodeDeployment's options),
        all running for the block."""
        controllers = [
            ProvisionController(
                self.cluster.api_client,
                self.provisioner,
                NodeLocalProvisioner(node, self.ledger),
                fast_options(node_deployment=NodeDeployment(node, **deployment), workers=4),
            )
            for node in self.nodes
        ]
        async with contextlib.AsyncExitStack() as stack:
            for controller in controllers:
                await stack.enter_async_context(running(controller))
            yield controllers


async def all_bound(c: TestCluster, names: list[str]) -> dict[str, Obj]:
    claims = ResourceClient(c.api_client, PERSISTENT_VOLUME_CLAIMS)
    listed = await claims.list(namespace=c.namespace)
    by_name = {name_of(x): x for x in listed.get("items") or []}
    bound = {
        n: by_name[n] for n in names if (by_name[n].get("status") or {}).get("phase") == "Bound"
    }
    return bound if len(bound) == len(names) else {}

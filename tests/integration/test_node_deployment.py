"""Distributed provisioning (``ProvisionControllerOptions(node_deployment=...)``, issue 28):
three in-process ProvisionControllers, one per node, against the ``kube_cluster`` (in memory;
on a launched control plane with ``PYPROVLIB_KUBE_ASSETS``, where kube-controller-manager's PV
controller binds).

Each controller's provisioner records which node's instance provisioned and deleted what, so
"exactly once, by its node's instance" is asserted on the calls themselves, not only on the
PVs.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest
from claim_support import create_claim, delete_claim
from kubernetes_asyncio.client import (
    V1NodeSelector,
    V1NodeSelectorRequirement,
    V1NodeSelectorTerm,
    V1ObjectMeta,
    V1PersistentVolume,
    V1PersistentVolumeSpec,
    V1VolumeNodeAffinity,
)
from provision_support import create_class, fast_options

from pyprovlib._provisioner import Provisioner, ProvisionOptions
from pyprovlib.controller._options import NodeDeployment
from pyprovlib.controller._provision import ANN_SELECTED_NODE, ProvisionController
from pyprovlib.kube._objects import Obj, annotations_of, name_of
from pyprovlib.kube._resources import NODES, PERSISTENT_VOLUME_CLAIMS, PERSISTENT_VOLUMES
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.testing import eventually, running, wait_bound
from pyprovlib.testing._cluster import TestCluster

pytestmark = pytest.mark.e2e

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
                host_path={"path": f"/tmp/{self.node}/{options.pv_name}"},
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


@contextlib.asynccontextmanager
async def instances(
    c: TestCluster, provisioner: str, nodes: list[str], ledger: Ledger, **deployment: Any
) -> AsyncIterator[list[ProvisionController]]:
    """One ProvisionController per node, all running for the block."""
    controllers = [
        ProvisionController(
            c.api_client,
            provisioner,
            NodeLocalProvisioner(node, ledger),
            fast_options(node_deployment=NodeDeployment(node, **deployment), workers=4),
        )
        for node in nodes
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


async def test_each_claim_is_provisioned_by_its_nodes_instance(kube_cluster: TestCluster) -> None:
    c = kube_cluster
    provisioner = c.unique_name("pyprovlib.io/node-deployment")
    sc = await create_class(c, provisioner, volumeBindingMode="WaitForFirstConsumer")
    nodes = await create_nodes(c, 3)
    ledger = Ledger()
    names = [c.unique_name("claim") for _ in range(9)]
    placed = {name: nodes[i % 3] for i, name in enumerate(names)}
    async with instances(c, provisioner, nodes, ledger):
        for name in names:
            await create_claim(c, sc, name=name, annotations={ANN_SELECTED_NODE: placed[name]})
        claims = await eventually(lambda: all_bound(c, names), message="every claim Bound")
        uids = {n: claims[n]["metadata"]["uid"] for n in names}
        assert sorted(ledger.provisioned) == sorted((placed[n], uids[n]) for n in names)

        volumes = {n: claims[n]["spec"]["volumeName"] for n in names}
        for name in names:
            await delete_claim(c, name)
        pvs = ResourceClient(c.api_client, PERSISTENT_VOLUMES)

        async def volumes_gone() -> bool:
            listed = await pvs.list()
            left = {name_of(v) for v in listed.get("items") or []}
            return not left & set(volumes.values())

        await eventually(volumes_gone, message="every PV deleted")
    # Each PV's asset deleted once, by the instance of its node.
    assert sorted(ledger.deleted) == sorted((placed[n], volumes[n]) for n in names)


async def test_immediate_claims_are_taken_by_exactly_one_node(kube_cluster: TestCluster) -> None:
    c = kube_cluster
    provisioner = c.unique_name("pyprovlib.io/node-deployment")
    sc = await create_class(c, provisioner, volumeBindingMode="Immediate")
    nodes = await create_nodes(c, 3)
    ledger = Ledger()
    names = [c.unique_name("claim") for _ in range(12)]
    async with instances(c, provisioner, nodes, ledger, base_delay=0.05, max_delay=0.4):
        for name in names:
            await create_claim(c, sc, name=name)
        claims = await eventually(
            lambda: all_bound(c, names), timeout=60, message="every claim Bound"
        )
    owners = {
        claims[n]["metadata"]["uid"]: annotations_of(claims[n])[ANN_SELECTED_NODE] for n in names
    }
    assert Counter(uid for _, uid in ledger.provisioned) == Counter(owners.keys())  # each once
    assert sorted(ledger.provisioned) == sorted((node, uid) for uid, node in owners.items())


async def test_immediate_claims_go_only_to_allowed_topologies(kube_cluster: TestCluster) -> None:
    c = kube_cluster
    provisioner = c.unique_name("pyprovlib.io/node-deployment")
    nodes = await create_nodes(c, 3)
    allowed = nodes[1]
    sc = await create_class(
        c,
        provisioner,
        volumeBindingMode="Immediate",
        allowedTopologies=[{"matchLabelExpressions": [{"key": ZONE, "values": [allowed]}]}],
    )
    ledger = Ledger()
    names = [c.unique_name("claim") for _ in range(4)]
    async with instances(c, provisioner, nodes, ledger, base_delay=0.02, max_delay=0.1):
        for name in names:
            await create_claim(c, sc, name=name)
        claims = await eventually(lambda: all_bound(c, names), message="every claim Bound")
    assert {annotations_of(x)[ANN_SELECTED_NODE] for x in claims.values()} == {allowed}
    assert {node for node, _ in ledger.provisioned} == {allowed}


async def test_without_immediate_binding_immediate_claims_stay_pending(
    kube_cluster: TestCluster,
) -> None:
    c = kube_cluster
    provisioner = c.unique_name("pyprovlib.io/node-deployment")
    sc = await create_class(c, provisioner, volumeBindingMode="Immediate")
    nodes = await create_nodes(c, 2)
    ledger = Ledger()
    async with instances(
        c, provisioner, nodes, ledger, immediate_binding=False, base_delay=0.01, max_delay=0.01
    ) as controllers:
        claim = await create_claim(c, sc)
        # Both instances looked at the claim (their queues drained) and left it alone.
        await eventually(
            lambda: all(len(x.claim_queue) == 0 for x in controllers), message="queues drained"
        )
        # Selecting a node hands it to that node's instance.
        await ResourceClient(c.api_client, PERSISTENT_VOLUME_CLAIMS).patch(
            name_of(claim),
            {"metadata": {"annotations": {ANN_SELECTED_NODE: nodes[0]}}},
            namespace=c.namespace,
        )
        bound = await wait_bound(c, name_of(claim))
    assert annotations_of(bound)[ANN_SELECTED_NODE] == nodes[0]
    assert ledger.provisioned == [(nodes[0], claim["metadata"]["uid"])]

"""Distributed provisioning (``ProvisionControllerOptions(node_deployment=...)``, issue 28):
three in-process ProvisionControllers, one per node, against the ``kube_cluster`` (in memory;
on a launched control plane with ``PYPROVLIB_KUBE_ASSETS``, where kube-controller-manager's PV
controller binds).

Each controller's provisioner records which node's instance provisioned and deleted what, so
"exactly once, by its node's instance" is asserted on the calls themselves, not only on the
PVs.
"""

from __future__ import annotations

from collections import Counter

import pytest
from claim_support import create_claim, delete_claim
from node_deployment_support import ZONE, Deployment, all_bound
from provision_support import create_class

from pyprovlib.controller._provision import ANN_SELECTED_NODE
from pyprovlib.kube._objects import annotations_of, name_of
from pyprovlib.kube._resources import PERSISTENT_VOLUME_CLAIMS, PERSISTENT_VOLUMES
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.testing import eventually, wait_bound
from pyprovlib.testing._cluster import TestCluster

pytestmark = pytest.mark.e2e


async def test_each_claim_is_provisioned_by_its_nodes_instance(kube_cluster: TestCluster) -> None:
    c = kube_cluster
    d = await Deployment.on_new_nodes(c, 3)
    sc = await create_class(c, d.provisioner, volumeBindingMode="WaitForFirstConsumer")
    nodes, ledger = d.nodes, d.ledger
    names = [c.unique_name("claim") for _ in range(9)]
    placed = {name: nodes[i % 3] for i, name in enumerate(names)}
    async with d.instances():
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
    d = await Deployment.on_new_nodes(c, 3)
    sc = await create_class(c, d.provisioner, volumeBindingMode="Immediate")
    names = [c.unique_name("claim") for _ in range(12)]
    async with d.instances(base_delay=0.05, max_delay=0.4):
        for name in names:
            await create_claim(c, sc, name=name)
        claims = await eventually(
            lambda: all_bound(c, names), timeout=60, message="every claim Bound"
        )
    owners = {
        claims[n]["metadata"]["uid"]: annotations_of(claims[n])[ANN_SELECTED_NODE] for n in names
    }
    provisioned = d.ledger.provisioned
    assert Counter(uid for _, uid in provisioned) == Counter(owners.keys())  # each once
    assert sorted(provisioned) == sorted((node, uid) for uid, node in owners.items())


async def test_immediate_claims_go_only_to_allowed_topologies(kube_cluster: TestCluster) -> None:
    c = kube_cluster
    d = await Deployment.on_new_nodes(c, 3)
    allowed = d.nodes[1]
    sc = await create_class(
        c,
        d.provisioner,
        volumeBindingMode="Immediate",
        allowedTopologies=[{"matchLabelExpressions": [{"key": ZONE, "values": [allowed]}]}],
    )
    names = [c.unique_name("claim") for _ in range(4)]
    async with d.instances(base_delay=0.02, max_delay=0.1):
        for name in names:
            await create_claim(c, sc, name=name)
        claims = await eventually(lambda: all_bound(c, names), message="every claim Bound")
    assert {annotations_of(x)[ANN_SELECTED_NODE] for x in claims.values()} == {allowed}
    assert {node for node, _ in d.ledger.provisioned} == {allowed}


async def test_without_immediate_binding_immediate_claims_stay_pending(
    kube_cluster: TestCluster,
) -> None:
    c = kube_cluster
    d = await Deployment.on_new_nodes(c, 2)
    sc = await create_class(c, d.provisioner, volumeBindingMode="Immediate")
    nodes = d.nodes
    async with d.instances(immediate_binding=False, base_delay=0.01, max_delay=0.01) as controllers:
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
    assert d.ledger.provisioned == [(nodes[0], claim["metadata"]["uid"])]

"""The owner of the CSIStorageCapacity objects, found from the pod as upstream's
``owner.Lookup`` does: 0 the Pod, 1 its ReplicaSet, 2 the Deployment. In memory the test plays
the Deployment and ReplicaSet controllers; on a real cluster (``PYPROVLIB_KUBE_ASSETS`` or
``PYPROVLIB_E2E_KUBECONFIG``) kube-controller-manager makes the ReplicaSet and the Pod."""

from __future__ import annotations

from typing import Any

import pytest

from pyprovlib import testing
from pyprovlib.controller._capacity import OwnerLookupError, lookup_owner
from pyprovlib.kube._objects import Obj
from pyprovlib.kube._resources import DEPLOYMENTS, PODS, REPLICA_SETS
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.testing._cluster import TestCluster

pytestmark = pytest.mark.e2e

LABELS = {"app": "csi-provisioner"}
POD_SPEC = {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}


def _ref(obj: Obj) -> dict[str, Any]:
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


async def _deployment_chain(cluster: TestCluster) -> tuple[Obj, Obj, Obj]:
    """A Deployment, its ReplicaSet and its Pod."""
    api, ns = cluster.api_client, cluster.namespace
    deployment = await ResourceClient(api, DEPLOYMENTS).create(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "csi-provisioner", "namespace": ns},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": LABELS},
                "template": {"metadata": {"labels": LABELS}, "spec": POD_SPEC},
            },
        }
    )
    sets = ResourceClient(api, REPLICA_SETS)
    pods = ResourceClient(api, PODS)
    if cluster.server is not None:
        # In memory: what the Deployment and ReplicaSet controllers would make.
        await sets.create(
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "metadata": {
                    "name": "csi-provisioner-5d4f",
                    "namespace": ns,
                    "ownerReferences": [_ref(deployment)],
                },
                "spec": {
                    "replicas": 1,
                    "selector": {"matchLabels": LABELS},
                    "template": {"metadata": {"labels": LABELS}, "spec": POD_SPEC},
                },
            }
        )
        replica_set = (await sets.list(ns))["items"][0]
        replica_set.setdefault("apiVersion", "apps/v1")
        replica_set.setdefault("kind", "ReplicaSet")
        await pods.create(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": "csi-provisioner-5d4f-x2x9k",
                    "namespace": ns,
                    "labels": LABELS,
                    "ownerReferences": [_ref(replica_set)],
                },
                "spec": POD_SPEC,
            }
        )

    async def made() -> tuple[Obj, Obj] | None:
        sets_now = (await sets.list(ns))["items"]
        pods_now = (await pods.list(ns))["items"]
        return (sets_now[0], pods_now[0]) if sets_now and pods_now else None

    replica_set, pod = await testing.eventually(made, message="the ReplicaSet and its Pod")
    return deployment, replica_set, pod


async def test_the_owner_is_found_levels_up_from_the_pod(kube_cluster: TestCluster) -> None:
    api, ns = kube_cluster.api_client, kube_cluster.namespace
    deployment, replica_set, pod = await _deployment_chain(kube_cluster)
    pod_name = pod["metadata"]["name"]
    assert await lookup_owner(api, ns, pod_name, 0) == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": pod_name,
        "uid": pod["metadata"]["uid"],
        "controller": True,
    }
    assert await lookup_owner(api, ns, pod_name, 1) == {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "name": replica_set["metadata"]["name"],
        "uid": replica_set["metadata"]["uid"],
        "controller": True,
    }
    assert await lookup_owner(api, ns, pod_name, 2) == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "csi-provisioner",
        "uid": deployment["metadata"]["uid"],
        "controller": True,
    }
    with pytest.raises(OwnerLookupError, match="has no controlling owner"):
        await lookup_owner(api, ns, pod_name, 3)
    with pytest.raises(OwnerLookupError, match=f"Pod {ns}/nobody"):
        await lookup_owner(api, ns, "nobody", 1)


async def test_an_owner_of_a_kind_pyprovlib_does_not_know_is_found_by_discovery(
    kube_cluster: TestCluster,
) -> None:
    api, ns = kube_cluster.api_client, kube_cluster.namespace
    # A pod a StatefulSet would own: level 1 needs no GET of the StatefulSet.
    owner = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "name": "csi-hostpathplugin",
        "uid": "0f5e8e0e-5b1b-4a63-9a55-0b8d8a8c1a11",
        "controller": True,
    }
    pod = await ResourceClient(api, PODS).create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "csi-hostpathplugin-0",
                "namespace": ns,
                "ownerReferences": [owner],
            },
            "spec": POD_SPEC,
        }
    )
    assert await lookup_owner(api, ns, "csi-hostpathplugin-0", 1) == owner
    # Level 2 GETs the StatefulSet (through discovery): it does not exist.
    with pytest.raises(OwnerLookupError, match="StatefulSet"):
        await lookup_owner(api, ns, pod["metadata"]["name"], 2)

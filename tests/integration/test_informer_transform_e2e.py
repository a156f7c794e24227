"""The controllers cache objects without ``metadata.managedFields`` while the API server keeps
them, and writing back an object read from such a cache leaves the server's managedFields as
they were. Runs in memory by default and on a real control plane with
``PYPROVLIB_KUBE_ASSETS`` (where the API server writes managedFields itself)."""

from __future__ import annotations

import pytest
from provision_support import MemoryProvisioner, create_class, fast_options, provisioner_name
from task_support import informers_running

from pyprovlib.controller._provision import ProvisionController
from pyprovlib.kube._config import request_json
from pyprovlib.kube._informer import SharedInformerFactory, strip_managed_fields
from pyprovlib.kube._objects import Obj, meta_namespace_key, namespace_of
from pyprovlib.kube._resources import PERSISTENT_VOLUME_CLAIMS, PERSISTENT_VOLUMES, Resource
from pyprovlib.kube._rest import ApiException, ResourceClient
from pyprovlib.testing import eventually, running, wait_bound
from pyprovlib.testing._cluster import TestCluster

pytestmark = pytest.mark.e2e


TEST_MANAGER = "pyprovlib-transform-test"


def managers_of(obj: Obj) -> set[str]:
    return {entry.get("manager", "") for entry in obj["metadata"].get("managedFields") or []}


async def create_managed(cluster: TestCluster, resource: Resource, obj: Obj) -> Obj:
    """Create ``obj`` with :data:`TEST_MANAGER` as its field manager: the real API server
    records it from the ``fieldManager`` parameter, the in-memory server (which writes no
    managedFields of its own) keeps the entry sent in the body."""
    obj["metadata"]["managedFields"] = [managed_entry()]
    namespace = obj["metadata"].get("namespace")
    return await request_json(
        cluster.api_client,
        "POST",
        resource.path(namespace),
        body=obj,
        query=[("fieldManager", TEST_MANAGER)],
    )


async def create_managed_claim(cluster: TestCluster, class_name: str) -> Obj:
    """A 1Gi claim of ``class_name`` ("" for none) created by :func:`create_managed`."""
    return await create_managed(
        cluster,
        PERSISTENT_VOLUME_CLAIMS,
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {
                "name": cluster.unique_name("claim"),
                "namespace": cluster.namespace,
                "labels": {"test": "yes"},
            },
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": class_name,
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
    )


def managed_entry() -> dict[str, object]:
    """A valid managedFields entry of :data:`TEST_MANAGER`."""
    return {
        "manager": TEST_MANAGER,
        "operation": "Update",
        "apiVersion": "v1",
        "time": "2026-01-01T00:00:00Z",
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:metadata": {"f:labels": {"f:test": {}}}},
    }


async def test_a_controllers_caches_hold_no_managed_fields_while_the_server_has_them(
    kube_cluster: TestCluster,
) -> None:
    name = provisioner_name(kube_cluster)
    class_name = await create_class(kube_cluster, name)
    controller = ProvisionController(
        kube_cluster.api_client, name, MemoryProvisioner(), fast_options()
    )
    claims = ResourceClient(kube_cluster.api_client, PERSISTENT_VOLUME_CLAIMS)
    volumes = ResourceClient(kube_cluster.api_client, PERSISTENT_VOLUMES)
    async with running(controller):
        claim = await create_managed_claim(kube_cluster, class_name)
        claim_name = claim["metadata"]["name"]
        bound = await wait_bound(kube_cluster, claim_name)
        pv_name = bound["spec"]["volumeName"]
        pv = await volumes.get(pv_name)
        await eventually(lambda: controller.caught_up(bound), message="claim cached")
        await eventually(lambda: controller.caught_up(pv), message="PV cached")

        # The server's objects: managedFields (the real one writes them for every writer).
        served = await claims.get(claim_name, kube_cluster.namespace)
        assert TEST_MANAGER in managers_of(served), served["metadata"]
        if kube_cluster.is_real:
            assert pv["metadata"].get("managedFields"), pv["metadata"]

        # The controller's caches: none, in every informer it runs.
        informers = controller.informer_factory.informers
        assert informers
        for informer in informers:
            for obj in informer.store.list():
                assert "managedFields" not in obj["metadata"], (informer.name, obj["metadata"])
        cached_claim = controller.informer_factory.informer_for(
            PERSISTENT_VOLUME_CLAIMS
        ).store.get_by_key(f"{kube_cluster.namespace}/{claim_name}")
        assert cached_claim is not None
        cached_pv = controller.informer_factory.informer_for(PERSISTENT_VOLUMES).store.get_by_key(
            pv_name
        )
        assert cached_pv is not None


async def test_updating_an_object_read_from_a_stripping_cache_keeps_its_managed_fields(
    kube_cluster: TestCluster,
) -> None:
    volumes = ResourceClient(kube_cluster.api_client, PERSISTENT_VOLUMES)
    claims = ResourceClient(kube_cluster.api_client, PERSISTENT_VOLUME_CLAIMS)
    # Created with an entry of a manager of their own, which no later write of this test is:
    # it stays only if the server keeps managedFields an update does not send.
    pv = await create_managed(
        kube_cluster,
        PERSISTENT_VOLUMES,
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": kube_cluster.unique_name("pv"), "labels": {"test": "yes"}},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "hostPath": {"path": "/tmp/pyprovlib-transform-e2e"},
            },
        },
    )
    kube_cluster.track(PERSISTENT_VOLUMES, pv["metadata"]["name"])
    claim = await create_managed_claim(kube_cluster, "")
    for created in (pv, claim):
        assert TEST_MANAGER in managers_of(created), created["metadata"]

    factory = SharedInformerFactory(kube_cluster.api_client, transform=strip_managed_fields)
    informers = {
        "PersistentVolume": (factory.informer_for(PERSISTENT_VOLUMES), volumes),
        "PersistentVolumeClaim": (
            factory.informer_for(PERSISTENT_VOLUME_CLAIMS, namespace=kube_cluster.namespace),
            claims,
        ),
    }

    async with informers_running(factory):
        assert await factory.wait_for_cache_sync(timeout=30)
        for created in (pv, claim):
            informer, client = informers[created["kind"]]
            key = meta_namespace_key(created)
            # A full update (PUT) of the cached object, as the controllers write PVs and
            # claims: from the cache once it holds the server's version (kube-controller-manager
            # writes the PV's status meanwhile), again after a conflict.
            for _attempt in range(10):
                current = await client.get(
                    created["metadata"]["name"], namespace_of(created) or None
                )
                await eventually(
                    lambda: factory.caught_up(current),  # noqa: B023
                    message=f"{key} cached at the server's version",
                )
                cached = informer.store.get_by_key(key)
                assert cached is not None
                assert "managedFields" not in cached["metadata"]
                body = {
                    **cached,
                    "metadata": {**cached["metadata"], "annotations": {"pyprovlib.io/test": "put"}},
                }
                try:
                    await client.replace(body)
                except ApiException as err:
                    if err.status != 409:
                        raise
                    continue
                break
            else:
                pytest.fail(f"{key}: every update conflicted")
            fresh = await client.get(created["metadata"]["name"], namespace_of(created) or None)
            assert fresh["metadata"]["annotations"]["pyprovlib.io/test"] == "put"
            assert TEST_MANAGER in managers_of(fresh), fresh["metadata"].get("managedFields")

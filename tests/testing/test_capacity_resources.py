"""The in-memory API server serves storage.k8s.io/v1 CSIStorageCapacity and apps/v1
Deployments and ReplicaSets as kube-apiserver does (the same rows run against a real one in
tests/e2e/test_differential.py): quantities kept canonical, the class and topology immutable,
selectors validated, label-selected lists, and the tables ``kubectl get`` prints."""

from __future__ import annotations

from typing import Any

import pytest
from api_support import error_body
from kubernetes_asyncio.client import ApiClient
from server_support import get_json

from pyprovlib.kube._errors import ApiException
from pyprovlib.kube._resources import CSI_STORAGE_CAPACITIES, DEPLOYMENTS, REPLICA_SETS
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.testing._server import ApiServer

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"


def capacity(name: str, **fields: Any) -> dict[str, Any]:
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "CSIStorageCapacity",
        "metadata": {"name": name, "namespace": "default", "labels": {"driver": "d"}},
        "storageClassName": "fast",
        **fields,
    }


def causes(err: ApiException) -> list[tuple[str, str]]:
    body = error_body(err)
    return [(c["field"], c["message"]) for c in body["details"]["causes"]]


async def test_capacity_quantities_are_canonical_and_the_pair_is_immutable(
    kube_client: ApiClient,
) -> None:
    client = ResourceClient(kube_client, CSI_STORAGE_CAPACITIES)
    created = await client.create(
        capacity("c1", capacity="0.5Gi", maximumVolumeSize=1024, nodeTopology={})
    )
    assert created["capacity"] == "512Mi"
    # a number keeps the decimal format it was written in, as with kube-apiserver
    assert created["maximumVolumeSize"] == "1024"
    assert created["nodeTopology"] == {}
    updated = await client.patch(
        "c1", {"capacity": "1536Mi", "maximumVolumeSize": None}, namespace="default"
    )
    assert updated["capacity"] == "1536Mi"
    assert "maximumVolumeSize" not in updated
    with pytest.raises(ApiException) as refused:
        await client.patch(
            "c1",
            {"storageClassName": "slow", "nodeTopology": {"matchLabels": {"a": "b"}}},
            namespace="default",
        )
    assert refused.value.status == 422
    assert causes(refused.value) == [
        ("nodeTopology", 'Invalid value: {"matchLabels":{"a":"b"}}: field is immutable'),
        ("storageClassName", 'Invalid value: "slow": field is immutable'),
    ]
    listed = await client.list("default", label_selector="driver=d")
    assert [i["metadata"]["name"] for i in listed["items"]] == ["c1"]
    assert (await client.list("default", label_selector="driver=other"))["items"] == []


async def test_capacity_validation(kube_client: ApiClient) -> None:
    client = ResourceClient(kube_client, CSI_STORAGE_CAPACITIES)
    with pytest.raises(ApiException) as refused:
        await client.create(
            capacity(
                "c2",
                storageClassName="",
                capacity="-1",
                nodeTopology={
                    "matchLabels": {"bad key!": "x"},
                    "matchExpressions": [{"key": "k", "operator": "In"}],
                },
            )
        )
    fields = [field for field, _ in causes(refused.value)]
    assert fields == [
        "nodeTopology.matchLabels",
        "nodeTopology.matchExpressions[0].values",
        "storageClassName",
        "capacity",
    ]
    with pytest.raises(ApiException) as malformed:
        await client.create(capacity("c3", capacity=True))
    assert malformed.value.status == 400
    assert "quantities must match the regular expression" in error_body(malformed.value)["message"]


async def test_capacity_and_workload_tables(apiserver: ApiServer, kube_client: ApiClient) -> None:
    await ResourceClient(kube_client, CSI_STORAGE_CAPACITIES).create(capacity("c4"))
    table = await get_json(
        apiserver, "/apis/storage.k8s.io/v1/namespaces/default/csistoragecapacities", TABLE
    )
    assert [c["name"] for c in table["columnDefinitions"]] == ["Name", "Created At"]
    assert table["rows"][0]["cells"][0] == "c4"

    template = {
        "metadata": {"labels": {"app": "w"}},
        "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
    }
    for resource in (DEPLOYMENTS, REPLICA_SETS):
        created = await ResourceClient(kube_client, resource).create(
            {
                "apiVersion": "apps/v1",
                "kind": resource.kind,
                "metadata": {"name": "w", "namespace": "default"},
                "spec": {"selector": {"matchLabels": {"app": "w"}}, "template": template},
            }
        )
        assert created["spec"]["replicas"] == 1
        container = created["spec"]["template"]["spec"]["containers"][0]
        assert container["imagePullPolicy"] == "IfNotPresent"
        table = await get_json(
            apiserver, f"/apis/apps/v1/namespaces/default/{resource.plural}", TABLE
        )
        assert table["rows"][0]["cells"][-1] == "app=w"
    with pytest.raises(ApiException) as refused:
        await ResourceClient(kube_client, DEPLOYMENTS).create(
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "bad", "namespace": "default"},
                "spec": {"selector": {"matchLabels": {"app": "other"}}, "template": template},
            }
        )
    assert causes(refused.value) == [
        (
            "spec.template.metadata.labels",
            'Invalid value: {"app":"w"}: `selector` does not match template `labels`',
        )
    ]

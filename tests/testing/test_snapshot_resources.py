"""The snapshot.storage.k8s.io/v1 custom resources (VolumeSnapshot, VolumeSnapshotContent,
VolumeSnapshotClass) served by pyprovlib.testing.ApiServer as kube-apiserver serves
external-snapshotter's CRDs: CRUD, schema validation (422), the status subresource, watches,
discovery, and kubectl."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from api_support import error_body
from claim_support import claim_body
from kubectl_support import KUBECTL, Kubectl
from kubernetes_asyncio import watch
from kubernetes_asyncio.client import ApiClient, CoreV1Api, CustomObjectsApi
from kubernetes_asyncio.client.exceptions import ApiException
from server_support import get_json

from pyprovlib.kube._resources import (
    PERSISTENT_VOLUME_CLAIMS,
    RESOURCES,
    VOLUME_SNAPSHOT_CLASSES,
    VOLUME_SNAPSHOT_CONTENTS,
    VOLUME_SNAPSHOTS,
    resource_for,
)
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.testing._server import ApiServer

GROUP = "snapshot.storage.k8s.io"
VERSION = "v1"
NS = "default"
# CustomObjectsApi sends a dict as a JSON patch unless told otherwise.
MERGE: dict[str, Any] = {"_content_type": "application/merge-patch+json"}


def snapshot(name: str, **source: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "VolumeSnapshot",
        "metadata": {"name": name},
        "spec": {"source": source or {"persistentVolumeClaimName": "data"}},
    }


def content(name: str, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "driver": "csi.example.com",
        "deletionPolicy": "Retain",
        "source": {"snapshotHandle": "snap-1"},
        "volumeSnapshotRef": {"name": "snap", "namespace": NS},
    }
    body.update(spec)
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "VolumeSnapshotContent",
        "metadata": {"name": name},
        "spec": {k: v for k, v in body.items() if v is not None},
    }


def snapshot_class(name: str, **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "VolumeSnapshotClass",
        "metadata": {"name": name},
        "driver": "csi.example.com",
        "deletionPolicy": "Delete",
    }
    body.update(fields)
    return {k: v for k, v in body.items() if v is not None}


def causes(err: ApiException) -> list[tuple[str, str]]:
    body = error_body(err)
    assert body["reason"] == "Invalid", body
    return [(c["field"], c["message"]) for c in body["details"]["causes"]]


@pytest.fixture
def custom(kube_client: ApiClient) -> CustomObjectsApi:
    return CustomObjectsApi(kube_client)


def test_resources_are_in_the_shared_table() -> None:
    assert VOLUME_SNAPSHOTS in RESOURCES
    assert resource_for("snapshot.storage.k8s.io/v1", "VolumeSnapshot") is VOLUME_SNAPSHOTS
    assert resource_for("snapshot.storage.k8s.io/v1", "volumesnapshotcontents") is (
        VOLUME_SNAPSHOT_CONTENTS
    )
    assert VOLUME_SNAPSHOTS.path(NS, "a", "status") == (
        "/apis/snapshot.storage.k8s.io/v1/namespaces/default/volumesnapshots/a/status"
    )
    assert VOLUME_SNAPSHOT_CONTENTS.path(name="c") == (
        "/apis/snapshot.storage.k8s.io/v1/volumesnapshotcontents/c"
    )
    assert not VOLUME_SNAPSHOT_CLASSES.namespaced
    assert all(r.custom for r in (VOLUME_SNAPSHOTS, VOLUME_SNAPSHOT_CONTENTS))


async def test_crud_of_all_three(custom: CustomObjectsApi) -> None:
    cls = await custom.create_cluster_custom_object(
        GROUP, VERSION, "volumesnapshotclasses", snapshot_class("fast", parameters={"a": "b"})
    )
    assert cls["kind"] == "VolumeSnapshotClass"
    assert cls["parameters"] == {"a": "b"}
    created = await custom.create_namespaced_custom_object(
        GROUP, VERSION, NS, "volumesnapshots", snapshot("snap")
    )
    assert created["metadata"]["namespace"] == NS
    assert created["metadata"]["uid"]
    assert created["metadata"]["generation"] == 1
    vsc = await custom.create_cluster_custom_object(
        GROUP, VERSION, "volumesnapshotcontents", content("snapcontent")
    )
    assert "namespace" not in vsc["metadata"]

    got = await custom.get_namespaced_custom_object(GROUP, VERSION, NS, "volumesnapshots", "snap")
    assert got["spec"] == {"source": {"persistentVolumeClaimName": "data"}}
    listed = await custom.list_cluster_custom_object(GROUP, VERSION, "volumesnapshots")
    assert listed["kind"] == "VolumeSnapshotList"
    assert [i["metadata"]["name"] for i in listed["items"]] == ["snap"]
    listed = await custom.list_cluster_custom_object(GROUP, VERSION, "volumesnapshotcontents")
    assert [i["metadata"]["name"] for i in listed["items"]] == ["snapcontent"]

    # a merge patch of the spec bumps the generation
    patched = await custom.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        NS,
        "volumesnapshots",
        "snap",
        {"spec": {"volumeSnapshotClassName": "fast"}},
        **MERGE,
    )
    assert patched["metadata"]["generation"] == 2

    # custom resources answer DELETE with a Status, not the object
    gone = await custom.delete_namespaced_custom_object(
        GROUP, VERSION, NS, "volumesnapshots", "snap"
    )
    assert gone["kind"] == "Status"
    assert gone["details"]["name"] == "snap"
    with pytest.raises(ApiException) as err:
        await custom.get_namespaced_custom_object(GROUP, VERSION, NS, "volumesnapshots", "snap")
    assert err.value.status == 404
    await custom.delete_cluster_custom_object(
        GROUP, VERSION, "volumesnapshotcontents", "snapcontent"
    )
    await custom.delete_cluster_custom_object(GROUP, VERSION, "volumesnapshotclasses", "fast")


async def test_snapshot_validation(custom: CustomObjectsApi) -> None:
    async def refused(body: dict[str, Any]) -> list[tuple[str, str]]:
        with pytest.raises(ApiException) as err:
            await custom.create_namespaced_custom_object(
                GROUP, VERSION, NS, "volumesnapshots", body
            )
        assert err.value.status == 422
        return causes(err.value)

    both = await refused(
        snapshot("a", persistentVolumeClaimName="x", volumeSnapshotContentName="y")
    )
    assert both == [
        (
            "spec.source",
            'Invalid value: "object": exactly one of volumeSnapshotContentName and '
            "persistentVolumeClaimName must be set",
        )
    ]
    body = snapshot("b")
    body["spec"]["source"] = {}
    assert [f for f, _m in await refused(body)] == ["spec.source"]
    body = snapshot("c")
    del body["spec"]
    assert await refused(body) == [("spec", "Required value")]
    body = snapshot("d")
    body["spec"] = {}
    assert await refused(body) == [("spec.source", "Required value")]
    body = snapshot("e")
    body["spec"]["volumeSnapshotClassName"] = ""
    assert [f for f, _m in await refused(body)] == ["spec.volumeSnapshotClassName"]
    body = snapshot("f")
    body["spec"]["source"] = {"persistentVolumeClaimName": 7}
    assert await refused(body) == [
        (
            "spec.source.persistentVolumeClaimName",
            'Invalid value: "integer": spec.source.persistentVolumeClaimName in body must be '
            'of type string: "integer"',
        )
    ]

    # spec.source is immutable
    await custom.create_namespaced_custom_object(
        GROUP, VERSION, NS, "volumesnapshots", snapshot("ok")
    )
    with pytest.raises(ApiException) as err:
        await custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            NS,
            "volumesnapshots",
            "ok",
            {"spec": {"source": {"persistentVolumeClaimName": "other"}}},
            **MERGE,
        )
    assert err.value.status == 422
    assert causes(err.value) == [
        (
            "spec.source.persistentVolumeClaimName",
            'Invalid value: "string": persistentVolumeClaimName is immutable',
        )
    ]


async def test_content_and_class_validation(custom: CustomObjectsApi) -> None:
    async def refused(body: dict[str, Any], plural: str = "volumesnapshotcontents") -> list[str]:
        with pytest.raises(ApiException) as err:
            await custom.create_cluster_custom_object(GROUP, VERSION, plural, body)
        assert err.value.status == 422
        return [f"{f}: {m}" for f, m in causes(err.value)]

    missing = await refused(
        content("a", driver=None, deletionPolicy=None, source=None, volumeSnapshotRef=None)
    )
    assert sorted(missing) == [
        "spec.deletionPolicy: Required value",
        "spec.driver: Required value",
        "spec.source: Required value",
        "spec.volumeSnapshotRef: Required value",
    ]
    assert await refused(content("b", deletionPolicy="Keep")) == [
        'spec.deletionPolicy: Unsupported value: "Keep": supported values: "Delete", "Retain"'
    ]
    assert await refused(content("c", source={"volumeHandle": "v", "snapshotHandle": "s"})) == [
        'spec.source: Invalid value: "object": exactly one of volumeHandle and snapshotHandle '
        "must be set"
    ]
    assert await refused(content("d", source={})) == [
        'spec.source: Invalid value: "object": exactly one of volumeHandle and snapshotHandle '
        "must be set"
    ]
    assert await refused(content("e", volumeSnapshotRef={"name": "snap"})) == [
        'spec.volumeSnapshotRef: Invalid value: "object": both spec.volumeSnapshotRef.name and '
        "spec.volumeSnapshotRef.namespace must be set"
    ]
    assert await refused(content("f", driver=5)) == [
        'spec.driver: Invalid value: "integer": spec.driver in body must be of type string: '
        '"integer"'
    ]

    assert sorted(
        await refused(
            snapshot_class("g", driver=None, deletionPolicy=None), "volumesnapshotclasses"
        )
    ) == ["deletionPolicy: Required value", "driver: Required value"]
    assert await refused(snapshot_class("h", deletionPolicy="Never"), "volumesnapshotclasses") == [
        'deletionPolicy: Unsupported value: "Never": supported values: "Delete", "Retain"'
    ]

    # the content's source is immutable
    await custom.create_cluster_custom_object(
        GROUP, VERSION, "volumesnapshotcontents", content("ok")
    )
    with pytest.raises(ApiException) as err:
        await custom.patch_cluster_custom_object(
            GROUP,
            VERSION,
            "volumesnapshotcontents",
            "ok",
            {"spec": {"source": {"snapshotHandle": "snap-2"}}},
            **MERGE,
        )
    assert err.value.status == 422
    assert [f for f, _m in causes(err.value)] == ["spec.source.snapshotHandle"]


async def test_status_subresource(custom: CustomObjectsApi) -> None:
    body = snapshot("snap")
    body["status"] = {"readyToUse": True}
    created = await custom.create_namespaced_custom_object(
        GROUP, VERSION, NS, "volumesnapshots", body
    )
    assert "status" not in created  # a create ignores status

    created["status"] = {
        "boundVolumeSnapshotContentName": "snapcontent",
        "readyToUse": True,
        "restoreSize": "1Gi",
    }
    created["spec"]["volumeSnapshotClassName"] = "ignored-by-status"
    updated = await custom.replace_namespaced_custom_object_status(
        GROUP, VERSION, NS, "volumesnapshots", "snap", created
    )
    assert updated["status"]["readyToUse"] is True
    assert "volumeSnapshotClassName" not in updated["spec"]  # status writes keep the spec
    assert updated["metadata"]["generation"] == 1

    # the main resource ignores status changes
    updated["status"] = {"readyToUse": False}
    replaced = await custom.replace_namespaced_custom_object(
        GROUP, VERSION, NS, "volumesnapshots", "snap", updated
    )
    assert replaced["status"]["readyToUse"] is True

    patched = await custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, NS, "volumesnapshots", "snap", {"status": {"readyToUse": False}}, **MERGE
    )
    assert patched["status"]["readyToUse"] is False
    assert patched["status"]["restoreSize"] == "1Gi"

    # the status is checked against the schema
    for bad, field in (
        ({"readyToUse": "yes"}, "status.readyToUse"),
        ({"restoreSize": "lots"}, "status.restoreSize"),
    ):
        with pytest.raises(ApiException) as err:
            await custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, NS, "volumesnapshots", "snap", {"status": bad}, **MERGE
            )
        assert err.value.status == 422
        assert [f for f, _m in causes(err.value)] == [field]

    await custom.create_cluster_custom_object(
        GROUP, VERSION, "volumesnapshotcontents", content("snapcontent")
    )
    patched = await custom.patch_cluster_custom_object_status(
        GROUP,
        VERSION,
        "volumesnapshotcontents",
        "snapcontent",
        {"status": {"snapshotHandle": "snap-1", "restoreSize": 1024, "readyToUse": True}},
        **MERGE,
    )
    assert patched["status"]["restoreSize"] == 1024
    with pytest.raises(ApiException) as err:
        await custom.patch_cluster_custom_object_status(
            GROUP,
            VERSION,
            "volumesnapshotcontents",
            "snapcontent",
            {"status": {"restoreSize": -1}},
            **MERGE,
        )
    assert causes(err.value) == [
        (
            "status.restoreSize",
            "Invalid value: -1: status.restoreSize in body should be greater than or equal to 0",
        )
    ]


async def test_strategic_merge_patch_is_refused(
    apiserver: ApiServer, kube_client: ApiClient
) -> None:
    client = ResourceClient(kube_client, VOLUME_SNAPSHOTS)
    await client.create(snapshot("snap"), NS)
    with pytest.raises(ApiException) as err:
        await client.patch(
            "snap",
            {"metadata": {"labels": {"a": "b"}}},
            namespace=NS,
            patch_type="strategic",
        )
    assert err.value.status == 415
    json_patched = await client.patch(
        "snap",
        [{"op": "add", "path": "/metadata/labels", "value": {"a": "b"}}],
        namespace=NS,
        patch_type="json",
    )
    assert json_patched["metadata"]["labels"] == {"a": "b"}


async def test_watch_sees_spec_and_status_changes(custom: CustomObjectsApi) -> None:
    events: list[tuple[str, Any]] = []
    started = asyncio.Event()

    async def consume() -> None:
        w = watch.Watch()
        async with w.stream(
            custom.list_namespaced_custom_object,
            GROUP,
            VERSION,
            NS,
            "volumesnapshots",
            timeout_seconds=10,
        ) as stream:
            started.set()
            async for event in stream:
                obj = event["object"]
                events.append((event["type"], (obj.get("status") or {}).get("readyToUse")))
                if event["type"] == "DELETED":
                    return

    task = asyncio.create_task(consume())
    try:
        await asyncio.wait_for(started.wait(), 5)
        await custom.create_namespaced_custom_object(
            GROUP, VERSION, NS, "volumesnapshots", snapshot("snap")
        )
        await custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, NS, "volumesnapshots", "snap", {"status": {"readyToUse": True}}, **MERGE
        )
        await custom.delete_namespaced_custom_object(GROUP, VERSION, NS, "volumesnapshots", "snap")
        await asyncio.wait_for(task, 10)
    finally:
        task.cancel()
    assert events == [("ADDED", None), ("MODIFIED", True), ("DELETED", True)]


async def test_discovery_and_table(apiserver: ApiServer, custom: CustomObjectsApi) -> None:
    groups = await get_json(apiserver, "/apis")
    assert GROUP in {g["name"] for g in groups["groups"]}
    group = await get_json(apiserver, "/apis/snapshot.storage.k8s.io")
    assert group["preferredVersion"]["groupVersion"] == "snapshot.storage.k8s.io/v1"
    body = await get_json(apiserver, "/apis/snapshot.storage.k8s.io/v1")
    entries = {e["name"]: e for e in body["resources"]}
    assert entries["volumesnapshots"]["namespaced"] is True
    assert entries["volumesnapshots"]["shortNames"] == ["vs"]
    assert entries["volumesnapshotcontents"]["namespaced"] is False
    assert entries["volumesnapshotcontents"]["shortNames"] == ["vsc", "vscs"]
    assert entries["volumesnapshotclasses"]["kind"] == "VolumeSnapshotClass"
    assert "volumesnapshots/status" in entries
    assert "volumesnapshotcontents/status" in entries
    assert "volumesnapshotclasses/status" not in entries
    openapi = await get_json(apiserver, "/openapi/v3")
    doc = await get_json(
        apiserver, openapi["paths"]["apis/snapshot.storage.k8s.io/v1"]["serverRelativeURL"]
    )
    assert "io.k8s.storage.snapshot.v1.VolumeSnapshot" in doc["components"]["schemas"]

    await custom.create_namespaced_custom_object(
        GROUP, VERSION, NS, "volumesnapshots", snapshot("snap")
    )
    await custom.patch_namespaced_custom_object_status(
        GROUP,
        VERSION,
        NS,
        "volumesnapshots",
        "snap",
        {"status": {"readyToUse": True, "restoreSize": "1Gi"}},
        **MERGE,
    )
    table = await get_json(
        apiserver, "/apis/snapshot.storage.k8s.io/v1/namespaces/default/volumesnapshots", TABLE
    )
    names = [c["name"] for c in table["columnDefinitions"]]
    assert names == [
        "Name",
        "ReadyToUse",
        "SourcePVC",
        "SourceSnapshotContent",
        "RestoreSize",
        "SnapshotClass",
        "SnapshotContent",
        "CreationTime",
        "Age",
    ]
    cells = table["rows"][0]["cells"]
    assert cells[:6] == ["snap", True, "data", None, "1Gi", None]


TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"


async def test_claim_data_sources_are_normalized_and_validated(kube_client: ApiClient) -> None:
    core = CoreV1Api(kube_client)
    claims = ResourceClient(kube_client, resource_for("v1", "PersistentVolumeClaim"))

    source = {"apiGroup": GROUP, "kind": "VolumeSnapshot", "name": "snap"}
    created = await claims.create(claim_body("a", dataSource=source), NS)
    assert created["spec"]["dataSourceRef"] == source
    created = await claims.create(claim_body("b", dataSourceRef=source), NS)
    assert created["spec"]["dataSource"] == source
    # the typed client reads them back
    typed = await core.read_namespaced_persistent_volume_claim("a", NS)
    assert typed.spec.data_source_ref.kind == "VolumeSnapshot"
    # a core-group reference comes back with "apiGroup": null (no omitempty upstream)
    created = await claims.create(
        claim_body("p", dataSource={"kind": "PersistentVolumeClaim", "name": "a"}), NS
    )
    assert created["spec"]["dataSourceRef"] == {
        "apiGroup": None,
        "kind": "PersistentVolumeClaim",
        "name": "a",
    }

    with pytest.raises(ApiException) as err:
        await claims.create(
            claim_body("d", dataSourceRef={"kind": "VolumeSnapshot", "name": "s"}), NS
        )
    assert causes(err.value) == [
        (
            key,
            "Invalid value: \"VolumeSnapshot\": must be 'PersistentVolumeClaim' when "
            "referencing the default apiGroup",
        )
        for key in ("spec.dataSource", "spec.dataSourceRef")
    ]
    with pytest.raises(ApiException) as err:
        await claims.create(
            claim_body("e", dataSource=source, dataSourceRef={**source, "name": "other"}), NS
        )
    assert causes(err.value) == [("spec", "Invalid value: {}: must match dataSourceRef")]


@pytest.mark.parametrize(
    "source",
    [
        {"apiGroup": "example.com", "kind": "VolumeSnapshot", "name": "x"},
        {"kind": "VolumeSnapshot", "name": "x"},
        {"apiGroup": "hello.example.com", "kind": "Hello", "name": "x"},
        {"name": "x"},
    ],
    ids=["wrong-group", "no-group", "populator", "no-kind"],
)
async def test_data_source_of_another_kind_is_dropped_on_create(
    apiserver: ApiServer, source: dict[str, str]
) -> None:
    """EnforceDataSourceBackwardsCompatibility (KEP 1495): a dataSource given without
    dataSourceRef that is neither a claim nor a snapshot.storage.k8s.io VolumeSnapshot is
    dropped, silently, as kube-apiserver does (before validation): the claim is created
    empty. Other sources go through dataSourceRef."""
    async with apiserver.api_client() as client:
        claims = ResourceClient(client, PERSISTENT_VOLUME_CLAIMS)
        created = await claims.create(_claim("dropped", dataSource=source), NS)
        assert "dataSource" not in created["spec"]
        assert "dataSourceRef" not in created["spec"]
        # the same source through dataSourceRef is kept, and mirrored into dataSource
        kept = await claims.create(
            _claim("ref", dataSourceRef={"apiGroup": "example.com", "kind": "X", "name": "x"}),
            NS,
        )
        assert kept["spec"]["dataSource"] == {"apiGroup": "example.com", "kind": "X", "name": "x"}


async def test_cross_namespace_data_source_ref_needs_the_feature_gate(
    apiserver: ApiServer,
) -> None:
    """Without the alpha CrossNamespaceVolumeDataSource gate (kube-apiserver's default) a
    dataSourceRef naming another namespace is dropped; with it, it is kept, unmirrored."""
    cross = {"apiGroup": GROUP, "kind": "VolumeSnapshot", "name": "s", "namespace": "other"}
    async with apiserver.api_client() as client:
        claims = ResourceClient(client, PERSISTENT_VOLUME_CLAIMS)
        created = await claims.create(_claim("off", dataSourceRef=cross), NS)
        assert "dataSourceRef" not in created["spec"]
        assert "dataSource" not in created["spec"]
        apiserver.feature_gates.add("CrossNamespaceVolumeDataSource")
        created = await claims.create(_claim("on", dataSourceRef=cross), NS)
        assert "dataSource" not in created["spec"]
        assert created["spec"]["dataSourceRef"] == cross


def _claim(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}},
            **spec,
        },
    }


# -- kubectl ------------------------------------------------------------------------------------


SNAPSHOT_MANIFESTS = """\
apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshotClass
metadata:
  name: snapclass
driver: csi.example.com
deletionPolicy: Delete
---
apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshotContent
metadata:
  name: snapcontent
spec:
  driver: csi.example.com
  deletionPolicy: Retain
  source: {snapshotHandle: snap-123}
  volumeSnapshotRef: {name: snap1, namespace: default}
---
apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshot
metadata:
  name: snap1
spec:
  volumeSnapshotClassName: snapclass
  source: {volumeSnapshotContentName: snapcontent}
"""


@pytest.mark.kubectl
@pytest.mark.skipif(KUBECTL is None, reason="kubectl not found")
async def test_kubectl_gets_snapshots(kubectl: Kubectl) -> None:
    manifest = kubectl.tmp / "snapshots.yaml"
    manifest.write_text(SNAPSHOT_MANIFESTS)
    _, out, _ = await kubectl.run("create", "-f", str(manifest))
    assert "volumesnapshotclass.snapshot.storage.k8s.io/snapclass created" in out
    assert "volumesnapshotcontent.snapshot.storage.k8s.io/snapcontent created" in out
    assert "volumesnapshot.snapshot.storage.k8s.io/snap1 created" in out

    _, out, _ = await kubectl.run(
        "patch",
        "vs",
        "snap1",
        "--subresource=status",
        "--type",
        "merge",
        "-p",
        '{"status":{"readyToUse":true,"restoreSize":"1Gi",'
        '"boundVolumeSnapshotContentName":"snapcontent"}}',
    )
    _, out, _ = await kubectl.run("get", "volumesnapshots")
    header, row = out.splitlines()[:2]
    assert header.split()[:4] == ["NAME", "READYTOUSE", "SOURCEPVC", "SOURCESNAPSHOTCONTENT"]
    assert row.split()[:6] == ["snap1", "true", "snapcontent", "1Gi", "snapclass", "snapcontent"]
    snap = await kubectl.json("get", "vs", "snap1")
    assert snap["status"] == {
        "readyToUse": True,
        "restoreSize": "1Gi",
        "boundVolumeSnapshotContentName": "snapcontent",
    }
    _, out, _ = await kubectl.run("get", "vsc")
    # absent fields print as blanks, as for a real CRD
    assert out.splitlines()[1].split()[:5] == [
        "snapcontent",
        "Retain",
        "csi.example.com",
        "snap1",
        "default",
    ]
    _, out, _ = await kubectl.run("get", "volumesnapshotclass")
    assert out.splitlines()[1].split()[:3] == ["snapclass", "csi.example.com", "Delete"]

    await kubectl.run("label", "vs", "snap1", "app=demo")
    code, _, err = await kubectl.run(
        "patch", "vs", "snap1", "-p", '{"metadata":{"labels":{"b":"c"}}}', check=False
    )
    assert code != 0  # custom resources take no strategic merge patch
    assert "unknown format" in err or "not supported" in err
    _, out, _ = await kubectl.run("get", "vs", "-l", "app=demo", "-o", "name")
    assert out.strip() == "volumesnapshot.snapshot.storage.k8s.io/snap1"

    _, out, _ = await kubectl.run("api-resources", "--api-group", "snapshot.storage.k8s.io")
    lines = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert set(lines) == {"volumesnapshotclasses", "volumesnapshotcontents", "volumesnapshots"}
    assert "vs " in lines["volumesnapshots"]

    _, out, _ = await kubectl.run("delete", "vs", "snap1")
    assert 'volumesnapshot.snapshot.storage.k8s.io "snap1" deleted' in out

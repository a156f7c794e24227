"""CRUD semantics and error bodies of pyprovlib.testing.ApiServer, through the real
kubernetes-asyncio typed clients and raw HTTP where the typed client cannot go."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest
from api_support import error_body, refused
from kubernetes_asyncio.client import (
    ApiClient,
    CoordinationV1Api,
    CoreV1Api,
    StorageV1Api,
    V1DeleteOptions,
    V1Preconditions,
)
from kubernetes_asyncio.client.exceptions import ApiException

from pyprovlib.testing._server import ApiServer


def pvc(name: str, **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, **meta},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }


def pv(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "hostPath": {"path": f"/tmp/{name}"},
        },
    }


def status_of(err: ApiException) -> dict[str, Any]:
    body: dict[str, Any] = error_body(err)
    return body


async def raw(
    server: ApiServer,
    method: str,
    path: str,
    body: bytes | None = None,
    content_type: str = "application/json",
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, Any], dict[str, str]]:
    async with (
        aiohttp.ClientSession() as session,
        session.request(
            method,
            server.url + path,
            data=body,
            headers={"Content-Type": content_type, **(headers or {})},
        ) as resp,
    ):
        text = await resp.text()
        return resp.status, json.loads(text) if text.startswith("{") else {}, dict(resp.headers)


async def test_create_stamps_metadata_and_defaults(kube_client: ApiClient) -> None:
    v1 = CoreV1Api(kube_client)
    created = await v1.create_namespaced_persistent_volume_claim("default", pvc("c1"))
    assert created.metadata.uid
    assert len(created.metadata.uid) == 36
    assert created.metadata.resource_version.isdigit()
    assert created.metadata.generation == 1
    assert created.status.phase == "Pending"
    assert created.spec.volume_mode == "Filesystem"
    ts = created.metadata.creation_timestamp
    assert ts.microsecond == 0
    assert ts.utcoffset() is not None

    pv1 = await v1.create_persistent_volume(pv("pv1"))
    assert pv1.spec.persistent_volume_reclaim_policy == "Retain"
    assert pv1.status.phase == "Pending"
    assert int(pv1.metadata.resource_version) > int(created.metadata.resource_version)

    sc = await StorageV1Api(kube_client).create_storage_class(
        {"metadata": {"name": "fast"}, "provisioner": "example.com/p"}
    )
    assert sc.reclaim_policy == "Delete"
    assert sc.volume_binding_mode == "Immediate"

    ns = await v1.read_namespace("kube-node-lease")
    assert ns.status.phase == "Active"
    assert ns.metadata.labels["kubernetes.io/metadata.name"] == "kube-node-lease"


async def test_generate_name(kube_client: ApiClient) -> None:
    v1 = CoreV1Api(kube_client)
    body = pvc("")
    body["metadata"] = {"generateName": "claim-"}
    a = await v1.create_namespaced_persistent_volume_claim("default", body)
    b = await v1.create_namespaced_persistent_volume_claim("default", body)
    assert a.metadata.name != b.metadata.name
    for name in (a.metadata.name, b.metadata.name):
        assert name.startswith("claim-")
        assert len(name) == len("claim-") + 5
        assert set(name[len("claim-") :]) <= set("bcdfghjklmnpqrstvwxz2456789")


async def test_already_exists_and_not_found(kube_client: ApiClient) -> None:
    v1 = CoreV1Api(kube_client)
    await v1.create_namespaced_persistent_volume_claim("default", pvc("dup"))
    with pytest.raises(ApiException) as e:
        await v1.create_namespaced_persistent_volume_claim("default", pvc("dup"))
    assert e.value.status == 409
    st = status_of(e.value)
    assert st["reason"] == "AlreadyExists"
    assert st["message"] == 'persistentvolumeclaims "dup" already exists'
    assert st["details"] == {"name": "dup", "kind": "persistentvolumeclaims"}

    with pytest.raises(ApiException) as e:
        await v1.read_namespaced_persistent_volume_claim("nope", "default")
    st = status_of(e.value)
    assert (e.value.status, st["kind"], st["apiVersion"], st["status"], st["reason"]) == (
        404,
        "Status",
        "v1",
        "Failure",
        "NotFound",
    )
    assert st["message"] == 'persistentvolumeclaims "nope" not found'
    assert st["code"] == 404

    with pytest.raises(ApiException) as e:
        await StorageV1Api(kube_client).read_storage_class("nope")
    st = status_of(e.value)
    assert st["message"] == 'storageclasses.storage.k8s.io "nope" not found'
    assert st["details"]["group"] == "storage.k8s.io"


async def test_validation_errors_are_422_with_causes(kube_client: ApiClient) -> None:
    v1 = CoreV1Api(kube_client)
    with pytest.raises(ApiException) as e:
        await v1.create_namespaced_persistent_volume_claim("default", {"metadata": {"name": "x"}})
    assert e.value.status == 422
    st = status_of(e.value)
    assert st["reason"] == "Invalid"
    fields = {c["field"] for c in st["details"]["causes"]}
    assert fields == {"spec.accessModes", "spec.resources[storage]"}
    assert st["details"]["kind"] == "PersistentVolumeClaim"

    with pytest.raises(ApiException) as e:
        await v1.create_namespaced_config_map("default", {"metadata": {}})
    st = status_of(e.value)
    assert st["details"]["causes"][0]["field"] == "metadata.name"
    assert "name or generateName is required" in st["message"]

    with pytest.raises(ApiException) as e:
        await v1.create_namespaced_config_map("default", {"metadata": {"name": "Bad_Name"}})
    assert e.value.status == 422
    assert "RFC 1123 subdomain" in status_of(e.value)["message"]

    with pytest.raises(ApiException) as e:
        await v1.create_namespace({"metadata": {"name": "a.b"}})
    assert "RFC 1123 label" in status_of(e.value)["message"]

    bad_pv = pv("p")
    bad_pv["spec"]["nfs"] = {"server": "s", "path": "/"}
    with pytest.raises(ApiException) as e:
        await v1.create_persistent_volume(bad_pv)
    assert "may not specify more than 1 volume type" in status_of(e.value)["message"]
    no_source = pv("p")
    del no_source["spec"]["hostPath"]
    with pytest.raises(ApiException) as e:
        await v1.create_persistent_volume(no_source)
    assert "must specify a volume type" in status_of(e.value)["message"]

    storage = StorageV1Api(kube_client)
    with pytest.raises(ApiException) as e:
        await storage.create_storage_class({"metadata": {"name": "x"}})
    assert status_of(e.value)["details"]["causes"][0]["field"] == "provisioner"
    with pytest.raises(ApiException) as e:
        await storage.create_volume_attachment({"metadata": {"name": "va"}, "spec": {}})
    fields = {c["field"] for c in status_of(e.value)["details"]["causes"]}
    assert fields == {"spec.attacher", "spec.nodeName", "spec.source"}


async def test_lease_field_types_and_create_on_update(apiserver: ApiServer) -> None:
    status, body, _ = await raw(
        apiserver,
        "POST",
        "/apis/coordination.k8s.io/v1/namespaces/default/leases",
        json.dumps(
            {"metadata": {"name": "l"}, "spec": {"leaseDurationSeconds": "fifteen"}}
        ).encode(),
    )
    assert status == 400
    assert "leaseDurationSeconds" in body["message"]
    async with apiserver.api_client() as client:
        leases = CoordinationV1Api(client)
        # Leases allow create-on-update, like the real registry
        created = await leases.replace_namespaced_lease(
            "l",
            "default",
            {
                "metadata": {"name": "l"},
                "spec": {"holderIdentity": "me", "leaseDurationSeconds": 15},
            },
        )
        assert created.spec.holder_identity == "me"
        # ... PVCs do not
        with pytest.raises(ApiException) as e:
            await CoreV1Api(client).replace_namespaced_persistent_volume_claim(
                "ghost", "default", pvc("ghost")
            )
        assert e.value.status == 404


async def test_update_conflict_and_unconditional(kube_client: ApiClient) -> None:
    v1 = CoreV1Api(kube_client)
    c = await v1.create_namespaced_persistent_volume_claim("default", pvc("u"))
    fresh = await v1.read_namespaced_persistent_volume_claim("u", "default")
    fresh.metadata.annotations = {"a": "1"}
    updated = await v1.replace_namespaced_persistent_volume_claim("u", "default", fresh)
    assert int(updated.metadata.resource_version) > int(c.metadata.resource_version)
    c.metadata.annotations = {"a": "2"}
    with pytest.raises(ApiException) as e:
        await v1.replace_namespaced_persistent_volume_claim("u", "default", c)
    assert e.value.status == 409
    st = status_of(e.value)
    assert st["reason"] == "Conflict"
    assert st["message"] == (
        'Operation cannot be fulfilled on persistentvolumeclaims "u": the object has been '
        "modified; please apply your changes to the latest version and try again"
    )
    # The model takes None (unset) though its stub types the field str.
    c.metadata.resource_version = None  # type: ignore[assignment]
    again = await v1.replace_namespaced_persistent_volume_claim("u", "default", c)
    assert again.metadata.annotations == {"a": "2"}
    # a no-op update does not bump the resourceVersion
    same = await v1.replace_namespaced_persistent_volume_claim("u", "default", again)
    assert same.metadata.resource_version == again.metadata.resource_version


async def test_update_keeps_managed_fields_it_leaves_out(apiserver: ApiServer) -> None:
    """The API server's field manager: an update without managedFields (or with an empty list)
    keeps the stored ones, ``[{}]`` clears them, a list of entries replaces them."""
    entry = {"manager": "creator", "operation": "Update", "apiVersion": "v1"}
    path = "/api/v1/namespaces/default/persistentvolumeclaims"
    status, created, _ = await raw(
        apiserver, "POST", path, json.dumps(pvc("mf", managedFields=[entry])).encode()
    )
    assert status == 201

    async def put(meta: dict[str, Any]) -> list[Any] | None:
        _, current, _ = await raw(apiserver, "GET", f"{path}/mf")
        body = {**current, "metadata": {**current["metadata"], **meta}}
        body["metadata"].pop("resourceVersion")
        status, stored, _ = await raw(apiserver, "PUT", f"{path}/mf", json.dumps(body).encode())
        assert status == 200, stored
        return stored["metadata"].get("managedFields")

    without = {k: v for k, v in created["metadata"].items() if k != "managedFields"}
    _, current, _ = await raw(apiserver, "GET", f"{path}/mf")
    body = {**current, "metadata": {**without, "annotations": {"a": "1"}}}
    status, stored, _ = await raw(apiserver, "PUT", f"{path}/mf", json.dumps(body).encode())
    assert (status, stored["metadata"]["managedFields"]) == (200, [entry])
    assert await put({"managedFields": [], "annotations": {"a": "2"}}) == [entry]
    other = {**entry, "manager": "other"}
    assert await put({"managedFields": [other]}) == [other]
    assert await put({"managedFields": [{}]}) is None


async def test_generation_bumps_on_spec_change_only(kube_client: ApiClient) -> None:
    v1 = CoreV1Api(kube_client)
    p = await v1.create_persistent_volume(pv("g"))
    p.metadata.labels = {"x": "y"}
    p = await v1.replace_persistent_volume("g", p)
    assert p.metadata.generation == 1
    p.spec.persistent_volume_reclaim_policy = "Delete"
    p = await v1.replace_persistent_volume("g", p)
    assert p.metadata.generation == 2


async def test_status_subresource(kube_client: ApiClient) -> None:
    v1 = CoreV1Api(kube_client)
    await v1.create_namespaced_persistent_volume_claim("default", pvc("s"))
    # the main resource ignores status changes
    patched = await v1.patch_namespaced_persistent_volume_claim(
        "s", "default", {"status": {"phase": "Bound"}, "metadata": {"labels": {"l": "1"}}}
    )
    assert patched.status.phase == "Pending"
    assert patched.metadata.labels == {"l": "1"}
    # /status leaves the spec alone; the claim's status strategy keeps the request's
    # metadata (as kube-apiserver does: only the spec is copied from the stored object)
    patched = await v1.patch_namespaced_persistent_volume_claim_status(
        "s",
        "default",
        {
            "status": {"phase": "Bound"},
            "metadata": {"labels": {"l": "2"}},
            "spec": {"volumeName": "v"},
        },
    )
    assert patched.status.phase == "Bound"
    assert patched.metadata.labels == {"l": "2"}
    assert patched.spec.volume_name is None
    current = await v1.read_namespaced_persistent_volume_claim_status("s", "default")
    current.status.phase = "Lost"
    replaced = await v1.replace_namespaced_persistent_volume_claim_status("s", "default", current)
    assert replaced.status.phase == "Lost"


async def test_immutability(kube_client: ApiClient) -> None:
    v1 = CoreV1Api(kube_client)
    await v1.create_namespaced_persistent_volume_claim("default", pvc("imm"))
    # binding may set volumeName once
    bound = await v1.patch_namespaced_persistent_volume_claim(
        "imm", "default", {"spec": {"volumeName": "pv-x"}}
    )
    assert bound.spec.volume_name == "pv-x"
    with pytest.raises(ApiException) as e:
        await v1.patch_namespaced_persistent_volume_claim(
            "imm", "default", {"spec": {"accessModes": ["ReadWriteMany"]}}
        )
    assert e.value.status == 422
    assert "spec is immutable after creation" in status_of(e.value)["message"]
    storage = StorageV1Api(kube_client)
    await storage.create_storage_class(
        {"metadata": {"name": "sc"}, "provisioner": "p", "parameters": {"a": "1"}}
    )
    with pytest.raises(ApiException) as e:
        await storage.patch_storage_class("sc", {"parameters": {"a": "2"}})
    assert e.value.status == 422
    assert status_of(e.value)["details"]["causes"][0]["field"] == "parameters"
    ok = await storage.patch_storage_class("sc", {"metadata": {"annotations": {"k": "v"}}})
    assert ok.metadata.annotations == {"k": "v"}


async def test_delete_with_finalizers(kube_client: ApiClient) -> None:
    v1 = CoreV1Api(kube_client)
    await v1.create_namespaced_persistent_volume_claim("default", pvc("f", finalizers=["a/b"]))
    first = await v1.delete_namespaced_persistent_volume_claim("f", "default")
    assert first.metadata.deletion_timestamp is not None
    assert first.metadata.deletion_grace_period_seconds == 0
    still = await v1.read_namespaced_persistent_volume_claim("f", "default")
    assert still.metadata.finalizers == ["a/b"]
    with pytest.raises(ApiException) as e:
        await v1.patch_namespaced_persistent_volume_claim(
            "f", "default", {"metadata": {"finalizers": ["a/b", "c/d"]}}
        )
    assert e.value.status == 422
    assert "no new finalizers can be added" in status_of(e.value)["message"]
    await v1.patch_namespaced_persistent_volume_claim(
        "f", "default", [{"op": "remove", "path": "/metadata/finalizers"}]
    )
    assert await refused(v1.read_namespaced_persistent_volume_claim("f", "default")) == 404


async def test_delete_returns_status_and_preconditions(apiserver: ApiServer) -> None:
    async with apiserver.api_client() as client:
        v1 = CoreV1Api(client)
        c = await v1.create_namespaced_persistent_volume_claim("default", pvc("d"))
        with pytest.raises(ApiException) as e:
            await v1.delete_namespaced_persistent_volume_claim(
                "d", "default", body=V1DeleteOptions(preconditions=V1Preconditions(uid="other"))
            )
        assert e.value.status == 409
        assert "Precondition failed: UID in precondition: other" in status_of(e.value)["message"]
        with pytest.raises(ApiException) as e:
            await v1.delete_namespaced_persistent_volume_claim(
                "d",
                "default",
                body=V1DeleteOptions(preconditions=V1Preconditions(resource_version="1")),
            )
        assert e.value.status == 409
        # dryRun=All validates but keeps the object
        await v1.delete_namespaced_persistent_volume_claim("d", "default", dry_run="All")
        assert apiserver.storage.get("persistentvolumeclaims", "default", "d") is not None
    # the PVC registry answers a completed delete with the object ...
    status, body, _ = await raw(
        apiserver,
        "DELETE",
        "/api/v1/namespaces/default/persistentvolumeclaims/d",
        json.dumps({"preconditions": {"uid": c.metadata.uid}}).encode(),
    )
    assert status == 200
    assert body["kind"] == "PersistentVolumeClaim"
    assert int(body["metadata"]["resourceVersion"]) > int(c.metadata.resource_version)
    assert apiserver.storage.get("persistentvolumeclaims", "default", "d") is None
    # ... the ConfigMap registry with a Status
    await raw(
        apiserver, "POST", "/api/v1/namespaces/default/configmaps", b'{"metadata":{"name":"d"}}'
    )
    cm = apiserver.storage.get("configmaps", "default", "d")
    assert cm is not None
    status, body, _ = await raw(apiserver, "DELETE", "/api/v1/namespaces/default/configmaps/d")
    assert status == 200
    assert body["kind"] == "Status"
    assert body["status"] == "Success"
    assert body["details"] == {"name": "d", "kind": "configmaps", "uid": cm["metadata"]["uid"]}


async def test_dry_run_create(apiserver: ApiServer, kube_client: ApiClient) -> None:
    v1 = CoreV1Api(kube_client)
    rv = apiserver.storage.resource_version
    out = await v1.create_namespaced_persistent_volume_claim("default", pvc("dry"), dry_run="All")
    assert out.metadata.name == "dry"
    assert apiserver.storage.get("persistentvolumeclaims", "default", "dry") is None
    assert apiserver.storage.resource_version == rv


async def test_namespaces_missing_terminating_and_deleted(
    apiserver: ApiServer, kube_client: ApiClient
) -> None:
    v1 = CoreV1Api(kube_client)
    with pytest.raises(ApiException) as e:
        await v1.create_namespaced_config_map("ghost", {"metadata": {"name": "c"}})
    assert e.value.status == 404
    assert status_of(e.value)["message"] == 'namespaces "ghost" not found'

    await v1.create_namespace({"metadata": {"name": "work"}})
    await v1.create_namespaced_config_map("work", {"metadata": {"name": "plain"}})
    await v1.create_namespaced_persistent_volume_claim("work", pvc("held", finalizers=["x/y"]))
    await v1.delete_namespace("work")
    assert apiserver.storage.get("configmaps", "work", "plain") is None
    ns = await v1.read_namespace("work")
    assert ns.status.phase == "Terminating"
    with pytest.raises(ApiException) as e:
        await v1.create_namespaced_config_map("work", {"metadata": {"name": "late"}})
    assert e.value.status == 403
    st = status_of(e.value)
    assert st["reason"] == "Forbidden"
    assert "because it is being terminated" in st["message"]
    await v1.patch_namespaced_persistent_volume_claim(
        "held", "work", {"metadata": {"$deleteFromPrimitiveList/finalizers": ["x/y"]}}
    )
    with pytest.raises(ApiException) as e:
        await v1.read_namespace("work")
    assert e.value.status == 404
    assert await refused(v1.delete_namespace("default")) == 403


async def test_bad_requests_over_raw_http(apiserver: ApiServer) -> None:
    base = "/api/v1/namespaces/default/configmaps"
    status, body, _ = await raw(apiserver, "POST", base, b"{not json")
    assert status == 400
    assert body["reason"] == "BadRequest"
    assert body["kind"] == "Status"

    wrong_kind = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "w"}}
    status, body, _ = await raw(apiserver, "POST", base, json.dumps(wrong_kind).encode())
    assert status == 400

    wrong_ns = {"metadata": {"name": "w", "namespace": "kube-system"}}
    status, body, _ = await raw(apiserver, "POST", base, json.dumps(wrong_ns).encode())
    assert status == 400
    assert "does not match the namespace" in body["message"]

    status, body, _ = await raw(apiserver, "GET", "/api/v1/widgets")
    assert status == 404
    assert body["reason"] == "NotFound"
    assert body["message"] == "the server could not find the requested resource"
    status, body, _ = await raw(apiserver, "GET", "/apis/example.com/v1/things")
    assert status == 404

    status, body, _ = await raw(apiserver, "POST", f"{base}/x", b"{}")
    assert status == 405
    assert body["reason"] == "MethodNotAllowed"

    await raw(apiserver, "POST", base, json.dumps({"metadata": {"name": "p"}}).encode())
    status, body, _ = await raw(
        apiserver, "PATCH", f"{base}/p", b'{"data":{"a":"b"}}', content_type="text/plain"
    )
    assert status == 415
    assert body["reason"] == "UnsupportedMediaType"
    status, body, _ = await raw(
        apiserver, "POST", base, b"name: x", content_type="application/x-protobuf-thing"
    )
    assert status == 415

    # the server survives all of it
    status, body, _ = await raw(apiserver, "GET", f"{base}/p")
    assert status == 200
    assert body["kind"] == "ConfigMap"
    assert body["apiVersion"] == "v1"


async def test_cluster_scoped_and_all_namespaces_paths(apiserver: ApiServer) -> None:
    status, _, _ = await raw(apiserver, "GET", "/api/v1/namespaces/default/persistentvolumes")
    assert status == 404
    async with apiserver.api_client() as client:
        v1 = CoreV1Api(client)
        await v1.create_namespace({"metadata": {"name": "other"}})
        await v1.create_namespaced_persistent_volume_claim("default", pvc("a"))
        await v1.create_namespaced_persistent_volume_claim("other", pvc("b"))
        everywhere = await v1.list_persistent_volume_claim_for_all_namespaces()
        assert [(i.metadata.namespace, i.metadata.name) for i in everywhere.items] == [
            ("default", "a"),
            ("other", "b"),
        ]
        only = await v1.list_namespaced_persistent_volume_claim("other")
        assert [i.metadata.name for i in only.items] == ["b"]
    status, body, _ = await raw(apiserver, "GET", "/api/v1/persistentvolumeclaims")
    assert body["kind"] == "PersistentVolumeClaimList"
    assert body["apiVersion"] == "v1"
    assert body["metadata"]["resourceVersion"].isdigit()


async def test_delete_collection_with_selector(
    apiserver: ApiServer, kube_client: ApiClient
) -> None:
    v1 = CoreV1Api(kube_client)
    for name, app in (("a", "x"), ("b", "x"), ("c", "y")):
        await v1.create_namespaced_config_map(
            "default", {"metadata": {"name": name, "labels": {"app": app}}}
        )
    await v1.create_namespaced_config_map(
        "default", {"metadata": {"name": "held", "labels": {"app": "x"}, "finalizers": ["f/g"]}}
    )
    await v1.delete_collection_namespaced_config_map("default", label_selector="app=x")
    left = {o["metadata"]["name"]: o for o in apiserver.storage.list("configmaps", "default")}
    assert set(left) == {"c", "held"}
    assert left["held"]["metadata"]["deletionTimestamp"]
    assert apiserver.requests.count("deletecollection", "configmaps") == 1


async def test_claim_storage_class_may_be_set_from_nil_only(kube_client: ApiClient) -> None:
    v1 = CoreV1Api(kube_client)
    await v1.create_namespaced_persistent_volume_claim("default", pvc("nil-class"))
    set_once = await v1.patch_namespaced_persistent_volume_claim(
        "nil-class", "default", {"spec": {"storageClassName": "standard"}}
    )
    assert set_once.spec.storage_class_name == "standard"
    with pytest.raises(ApiException) as e:
        await v1.patch_namespaced_persistent_volume_claim(
            "nil-class", "default", {"spec": {"storageClassName": "other"}}
        )
    assert e.value.status == 422


async def test_namespace_status_subresource(kube_client: ApiClient) -> None:
    """/api/v1/namespaces/NAME/status is the namespace's status subresource (not a collection
    named "status" in that namespace); like the claim's, it keeps the request's metadata."""
    v1 = CoreV1Api(kube_client)
    await v1.create_namespace({"metadata": {"name": "with-status"}})
    read = await v1.read_namespace_status("with-status")
    assert read.status.phase == "Active"
    patched = await v1.patch_namespace_status(
        "with-status", {"metadata": {"labels": {"l": "1"}}, "status": {"phase": "Active"}}
    )
    assert patched.metadata.labels["l"] == "1"
    assert patched.metadata.labels["kubernetes.io/metadata.name"] == "with-status"

"""Conformance of the in-memory API server with kube-apiserver, for what storage controllers use.

Every test talks through the real kubernetes-asyncio client and asserts only what a real cluster
would show, so the same file runs against a real cluster when PYPROVLIB_E2E_KUBECONFIG names a
kubeconfig (via the ``kube_cluster`` fixture). Names are unique per test; cluster-scoped objects
are registered with ``kube_cluster.track`` and deleted afterwards.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from api_support import error_body, refused
from claim_support import attachment_body, class_body
from kubernetes_asyncio.client import (
    CoordinationV1Api,
    CoreV1Api,
    StorageV1Api,
    V1DeleteOptions,
    V1Preconditions,
)
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.watch import Watch
from provision_support import create_class

from pyprovlib.kube._resources import (
    PERSISTENT_VOLUME_CLAIMS,
    PERSISTENT_VOLUMES,
    STORAGE_CLASSES,
    VOLUME_ATTACHMENTS,
)
from pyprovlib.testing import wait_deleted
from pyprovlib.testing._cluster import TestCluster

pytestmark = pytest.mark.e2e

MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
PROVISIONER = "conformance.pyprovlib.example.com"


def status_of(err: ApiException) -> dict[str, Any]:
    body = error_body(err)
    assert body["kind"] == "Status"
    assert body["apiVersion"] == "v1"
    assert body["status"] == "Failure"
    assert body["code"] == err.status
    return body


def claim_body(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "labels": {"suite": "conformance"}},
        "spec": {
            # A class nobody provisions: nothing on a real cluster acts on these claims.
            "storageClassName": "pyprovlib-conformance-none",
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}},
            **spec,
        },
    }


def volume_body(name: str, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name, "labels": {"suite": "conformance", **labels}},
        "spec": {
            # Not the claims' class: no PV controller binds these to the claims of this file.
            "storageClassName": "pyprovlib-conformance-pv-only",
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "csi": {"driver": PROVISIONER, "volumeHandle": name},
        },
    }


async def test_claim_create_get_list_replace_patch_delete(kube_cluster: TestCluster) -> None:
    core = CoreV1Api(kube_cluster.api_client)
    ns = kube_cluster.namespace
    name = kube_cluster.unique_name("claim")

    created = await core.create_namespaced_persistent_volume_claim(ns, claim_body(name))
    assert created.metadata.uid
    assert created.metadata.resource_version
    assert created.metadata.creation_timestamp is not None
    assert created.metadata.namespace == ns
    assert created.status.phase == "Pending"  # defaulted by the server
    assert created.spec.volume_mode == "Filesystem"

    got = await core.read_namespaced_persistent_volume_claim(name, ns)
    assert got.metadata.uid == created.metadata.uid
    assert got.metadata.resource_version == created.metadata.resource_version

    listed = await core.list_namespaced_persistent_volume_claim(ns)
    assert name in [c.metadata.name for c in listed.items]
    assert listed.metadata.resource_version

    got.metadata.labels["replaced"] = "yes"
    replaced = await core.replace_namespaced_persistent_volume_claim(name, ns, got)
    assert replaced.metadata.labels["replaced"] == "yes"
    assert int(replaced.metadata.resource_version) > int(got.metadata.resource_version)

    merged = await core.patch_namespaced_persistent_volume_claim(
        name, ns, {"metadata": {"annotations": {"a": "1"}}}, _content_type=MERGE
    )
    assert merged.metadata.annotations["a"] == "1"
    jsoned = await core.patch_namespaced_persistent_volume_claim(
        name,
        ns,
        [{"op": "add", "path": "/metadata/labels/json", "value": "patched"}],
        _content_type=JSON_PATCH,
    )
    assert jsoned.metadata.labels == {"suite": "conformance", "replaced": "yes", "json": "patched"}
    strategic = await core.patch_namespaced_persistent_volume_claim(
        name, ns, {"metadata": {"labels": {"replaced": None}}}, _content_type=STRATEGIC
    )
    assert "replaced" not in strategic.metadata.labels
    assert strategic.metadata.annotations["a"] == "1"

    await core.delete_namespaced_persistent_volume_claim(name, ns)

    # On a real cluster the pvc-protection finalizer is removed by a controller shortly after.
    await wait_deleted(kube_cluster, PERSISTENT_VOLUME_CLAIMS, name, namespace=ns)


async def test_persistent_volume_crud_and_status(kube_cluster: TestCluster) -> None:
    core = CoreV1Api(kube_cluster.api_client)
    name = kube_cluster.unique_name("pv")
    kube_cluster.track(PERSISTENT_VOLUMES, name)

    created = await core.create_persistent_volume(volume_body(name, color="blue"))
    assert created.metadata.namespace is None
    assert created.spec.persistent_volume_reclaim_policy == "Retain"
    assert created.spec.volume_mode == "Filesystem"

    listed = await core.list_persistent_volume(label_selector="color=blue,suite=conformance")
    assert name in [v.metadata.name for v in listed.items]
    none = await core.list_persistent_volume(label_selector="color=blue,suite=nothing-here")
    assert name not in [v.metadata.name for v in none.items]

    # The PV controller (real or the in-memory binder) marks an unclaimed PV Available; once
    # it has, it leaves status alone.
    async def available() -> bool:
        return (await core.read_persistent_volume(name)).status.phase == "Available"

    await kube_cluster.wait_for(available, message="PV Available")

    # status is a subresource: writes to it leave the spec alone. The PV registry's status
    # strategy copies only the spec from the stored object, so metadata in the same write is
    # kept (kube-apiserver does; ResetObjectMetaForStatus is not applied to PVs).
    status = await core.patch_persistent_volume_status(
        name,
        {
            "status": {"message": "checked"},
            "metadata": {"labels": {"from-status": "yes"}},
            "spec": {"persistentVolumeReclaimPolicy": "Recycle"},
        },
        _content_type=MERGE,
    )
    assert status.status.message == "checked"
    assert status.metadata.labels["from-status"] == "yes"
    assert status.spec.persistent_volume_reclaim_policy == "Retain"
    # ... and writes to the main resource leave status alone.
    current = await core.read_persistent_volume(name)
    current.status.message = "overwritten?"
    current.metadata.annotations = {"touched": "yes"}
    replaced = await core.replace_persistent_volume(name, current)
    assert replaced.metadata.annotations["touched"] == "yes"
    assert replaced.status.message == "checked"

    patched = await core.patch_persistent_volume(
        name, {"metadata": {"labels": {"color": "green"}}}, _content_type=STRATEGIC
    )
    assert patched.metadata.labels["color"] == "green"

    await core.delete_persistent_volume(name)

    await wait_deleted(kube_cluster, PERSISTENT_VOLUMES, name)


async def test_storage_class_crud_and_defaults(kube_cluster: TestCluster) -> None:
    storage = StorageV1Api(kube_cluster.api_client)
    name = kube_cluster.unique_name("sc")
    kube_cluster.track(STORAGE_CLASSES, name)
    created = await storage.create_storage_class(
        class_body(name, PROVISIONER, parameters={"speed": "fast"})
    )
    assert created.volume_binding_mode == "Immediate"
    assert created.reclaim_policy == "Delete"

    got = await storage.read_storage_class(name)
    got.allow_volume_expansion = True
    replaced = await storage.replace_storage_class(name, got)
    assert replaced.allow_volume_expansion is True

    patched = await storage.patch_storage_class(
        name, {"metadata": {"annotations": {"x": "y"}}}, _content_type=MERGE
    )
    assert patched.metadata.annotations == {"x": "y"}
    # parameters are immutable
    with pytest.raises(ApiException) as info:
        await storage.patch_storage_class(
            name, {"parameters": {"speed": "slow"}}, _content_type=MERGE
        )
    assert info.value.status == 422
    assert status_of(info.value)["reason"] == "Invalid"

    listed = await storage.list_storage_class(field_selector=f"metadata.name={name}")
    assert [c.metadata.name for c in listed.items] == [name]
    deleted = await storage.delete_storage_class(name)
    assert deleted.kind == "StorageClass"
    assert await refused(storage.read_storage_class(name)) == 404


async def test_lease_crud_and_optimistic_concurrency(kube_cluster: TestCluster) -> None:
    coord = CoordinationV1Api(kube_cluster.api_client)
    ns = kube_cluster.namespace
    name = kube_cluster.unique_name("lease")
    created = await coord.create_namespaced_lease(
        ns,
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": name},
            "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15},
        },
    )
    assert created.spec.holder_identity == "a"

    first = await coord.read_namespaced_lease(name, ns)
    second = await coord.read_namespaced_lease(name, ns)
    first.spec.holder_identity = "b"
    updated = await coord.replace_namespaced_lease(name, ns, first)
    assert updated.spec.holder_identity == "b"

    second.spec.holder_identity = "c"
    with pytest.raises(ApiException) as info:
        await coord.replace_namespaced_lease(name, ns, second)
    assert info.value.status == 409
    assert status_of(info.value)["reason"] == "Conflict"
    assert (await coord.read_namespaced_lease(name, ns)).spec.holder_identity == "b"

    patched = await coord.patch_namespaced_lease(
        name, ns, {"spec": {"leaseTransitions": 2}}, _content_type=MERGE
    )
    assert patched.spec.lease_transitions == 2
    assert patched.spec.holder_identity == "b"

    leases = await coord.list_namespaced_lease(ns)
    assert name in [lease.metadata.name for lease in leases.items]
    done = await coord.delete_namespaced_lease(name, ns)
    assert done.kind == "Status"
    assert done.status == "Success"
    assert done.details.name == name
    assert await refused(coord.read_namespaced_lease(name, ns)) == 404


async def test_core_events_crud(kube_cluster: TestCluster) -> None:
    core = CoreV1Api(kube_cluster.api_client)
    ns = kube_cluster.namespace
    name = kube_cluster.unique_name("ev")
    now = "2026-01-01T00:00:00Z"
    created = await core.create_namespaced_event(
        ns,
        {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name},
            "involvedObject": {
                "kind": "PersistentVolumeClaim",
                "namespace": ns,
                "name": "some-claim",
                "apiVersion": "v1",
            },
            "reason": "ExternalProvisioning",
            "message": "waiting",
            "type": "Normal",
            "source": {"component": "conformance"},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        },
    )
    assert created.reason == "ExternalProvisioning"
    assert created.count == 1

    patched = await core.patch_namespaced_event(
        name, ns, {"count": 2, "lastTimestamp": "2026-01-01T00:01:00Z"}, _content_type=STRATEGIC
    )
    assert patched.count == 2
    assert patched.message == "waiting"

    events = await core.list_namespaced_event(ns, field_selector=f"metadata.name={name}")
    assert [e.metadata.name for e in events.items] == [name]
    assert events.items[0].involved_object.name == "some-claim"

    await core.delete_namespaced_event(name, ns)
    assert await refused(core.read_namespaced_event(name, ns)) == 404


async def test_volume_attachment_and_status_subresource(kube_cluster: TestCluster) -> None:
    storage = StorageV1Api(kube_cluster.api_client)
    name = kube_cluster.unique_name("va")
    kube_cluster.track(VOLUME_ATTACHMENTS, name)
    # An attacher nothing on a real cluster serves, for a node that is not there.
    created = await storage.create_volume_attachment(
        attachment_body(name, PROVISIONER, "pyprovlib-conformance-node", "pyprovlib-conformance-pv")
    )
    assert created.spec.attacher == PROVISIONER
    assert created.status is None or not created.status.attached

    status = await storage.patch_volume_attachment_status(
        name,
        {"status": {"attached": True, "attachmentMetadata": {"dev": "/dev/xvdb"}}},
        _content_type=MERGE,
    )
    assert status.status.attached is True
    assert status.status.attachment_metadata == {"dev": "/dev/xvdb"}

    got = await storage.read_volume_attachment_status(name)
    got.status.attached = False
    # A dict where the stub wants V1VolumeError: the client serializes it as it is.
    got.status.attach_error = {"message": "boom", "time": "2026-01-01T00:00:00Z"}  # type: ignore[assignment]
    replaced = await storage.replace_volume_attachment_status(name, got)
    assert replaced.status.attached is False
    assert replaced.status.attach_error.message == "boom"

    # The main resource ignores status and refuses spec changes.
    current = await storage.read_volume_attachment(name)
    current.status.attached = True
    current.metadata.finalizers = ["example.com/conformance"]
    updated = await storage.replace_volume_attachment(name, current)
    assert updated.status.attached is False
    assert updated.metadata.finalizers == ["example.com/conformance"]
    with pytest.raises(ApiException) as info:
        await storage.patch_volume_attachment(
            name, {"spec": {"nodeName": "elsewhere"}}, _content_type=MERGE
        )
    assert info.value.status == 422

    # Delete with a finalizer: marked, kept, then gone once the finalizer is removed.
    deleted = await storage.delete_volume_attachment(name)
    assert deleted.kind == "VolumeAttachment"
    assert deleted.metadata.deletion_timestamp is not None
    marked = await storage.read_volume_attachment(name)
    assert marked.metadata.deletion_timestamp is not None
    await storage.patch_volume_attachment(
        name, [{"op": "remove", "path": "/metadata/finalizers"}], _content_type=JSON_PATCH
    )

    await wait_deleted(kube_cluster, VOLUME_ATTACHMENTS, name)


async def test_already_exists_conflict_and_not_found(kube_cluster: TestCluster) -> None:
    core = CoreV1Api(kube_cluster.api_client)
    ns = kube_cluster.namespace
    name = kube_cluster.unique_name("cm")
    await core.create_namespaced_config_map(ns, {"metadata": {"name": name}, "data": {"k": "1"}})

    with pytest.raises(ApiException) as info:
        await core.create_namespaced_config_map(ns, {"metadata": {"name": name}})
    assert info.value.status == 409
    body = status_of(info.value)
    assert body["reason"] == "AlreadyExists"
    assert body["details"]["name"] == name
    assert body["details"]["kind"] == "configmaps"

    stale = await core.read_namespaced_config_map(name, ns)
    await core.patch_namespaced_config_map(name, ns, {"data": {"k": "2"}}, _content_type=MERGE)
    stale.data["k"] = "3"
    with pytest.raises(ApiException) as info:
        await core.replace_namespaced_config_map(name, ns, stale)
    assert info.value.status == 409
    assert status_of(info.value)["reason"] == "Conflict"
    assert (await core.read_namespaced_config_map(name, ns)).data == {"k": "2"}

    missing = kube_cluster.unique_name("missing")
    with pytest.raises(ApiException) as info:
        await core.read_namespaced_config_map(missing, ns)
    assert info.value.status == 404
    body = status_of(info.value)
    assert body["reason"] == "NotFound"
    assert body["details"] == {"name": missing, "kind": "configmaps"}
    assert body["message"] == f'configmaps "{missing}" not found'

    with pytest.raises(ApiException) as info:
        await CoreV1Api(kube_cluster.api_client).read_persistent_volume(missing)
    assert status_of(info.value)["message"] == f'persistentvolumes "{missing}" not found'


async def test_claim_without_access_modes_is_invalid(kube_cluster: TestCluster) -> None:
    core = CoreV1Api(kube_cluster.api_client)
    body = claim_body(kube_cluster.unique_name("bad"))
    del body["spec"]["accessModes"]
    with pytest.raises(ApiException) as info:
        await core.create_namespaced_persistent_volume_claim(kube_cluster.namespace, body)
    assert info.value.status == 422
    status = status_of(info.value)
    assert status["reason"] == "Invalid"
    assert status["details"]["kind"] == "PersistentVolumeClaim"
    fields = [c.get("field") for c in status["details"]["causes"]]
    assert "spec.accessModes" in fields


async def test_delete_waits_for_finalizers(kube_cluster: TestCluster) -> None:
    core = CoreV1Api(kube_cluster.api_client)
    ns = kube_cluster.namespace
    name = kube_cluster.unique_name("held")
    await core.create_namespaced_config_map(
        ns, {"metadata": {"name": name, "finalizers": ["example.com/a", "example.com/b"]}}
    )
    # A delete that only marks the object answers with the object (typed here as a Status).
    answer = await core.delete_namespaced_config_map(name, ns)
    assert answer.kind == "ConfigMap"
    held = await core.read_namespaced_config_map(name, ns)
    assert held.metadata.deletion_timestamp is not None
    assert held.metadata.finalizers == ["example.com/a", "example.com/b"]

    await core.patch_namespaced_config_map(
        name, ns, {"metadata": {"finalizers": ["example.com/b"]}}, _content_type=MERGE
    )
    still = await core.read_namespaced_config_map(name, ns)
    assert still.metadata.finalizers == ["example.com/b"]

    await core.patch_namespaced_config_map(
        name, ns, {"metadata": {"finalizers": None}}, _content_type=MERGE
    )
    assert await refused(core.read_namespaced_config_map(name, ns)) == 404


async def test_delete_precondition_uid_mismatch_conflicts(kube_cluster: TestCluster) -> None:
    core = CoreV1Api(kube_cluster.api_client)
    ns = kube_cluster.namespace
    name = kube_cluster.unique_name("pre")
    created = await core.create_namespaced_config_map(ns, {"metadata": {"name": name}})
    with pytest.raises(ApiException) as info:
        await core.delete_namespaced_config_map(
            name,
            ns,
            body=V1DeleteOptions(
                preconditions=V1Preconditions(uid="00000000-0000-0000-0000-000000000000")
            ),
        )
    assert info.value.status == 409
    assert status_of(info.value)["reason"] == "Conflict"
    assert (await core.read_namespaced_config_map(name, ns)).metadata.uid == created.metadata.uid

    await core.delete_namespaced_config_map(
        name, ns, body=V1DeleteOptions(preconditions=V1Preconditions(uid=created.metadata.uid))
    )
    assert await refused(core.read_namespaced_config_map(name, ns)) == 404


async def test_strategic_merge_of_finalizers_and_annotations(kube_cluster: TestCluster) -> None:
    core = CoreV1Api(kube_cluster.api_client)
    ns = kube_cluster.namespace
    name = kube_cluster.unique_name("smp")
    await core.create_namespaced_config_map(
        ns,
        {
            "metadata": {
                "name": name,
                "finalizers": ["example.com/a"],
                "annotations": {"keep": "1", "drop": "2"},
            }
        },
    )
    try:
        patched = await core.patch_namespaced_config_map(
            name,
            ns,
            {
                "metadata": {
                    "finalizers": ["example.com/b", "example.com/a"],
                    "annotations": {"drop": None, "add": "3"},
                }
            },
            _content_type=STRATEGIC,
        )
        # finalizers merge as a set (patchStrategy=merge); null deletes a map key.
        assert sorted(patched.metadata.finalizers) == ["example.com/a", "example.com/b"]
        assert patched.metadata.annotations == {"keep": "1", "add": "3"}

        # A merge patch, by contrast, replaces the list.
        replaced = await core.patch_namespaced_config_map(
            name, ns, {"metadata": {"finalizers": ["example.com/c"]}}, _content_type=MERGE
        )
        assert replaced.metadata.finalizers == ["example.com/c"]
    finally:
        await core.patch_namespaced_config_map(
            name, ns, {"metadata": {"finalizers": None}}, _content_type=MERGE
        )


async def test_label_and_field_selectors(kube_cluster: TestCluster) -> None:
    core = CoreV1Api(kube_cluster.api_client)
    ns = kube_cluster.namespace
    run = kube_cluster.unique_name("run")
    tiers = {"gold": "gold", "silver": "silver", "plain": None}
    names = {}
    for key, tier in tiers.items():
        name = kube_cluster.unique_name(key)
        names[key] = name
        labels = {"run": run, **({"tier": tier} if tier else {})}
        await core.create_namespaced_config_map(ns, {"metadata": {"name": name, "labels": labels}})

    async def select(selector: str) -> set[str]:
        listed = await core.list_namespaced_config_map(ns, label_selector=f"run={run},{selector}")
        return {c.metadata.name for c in listed.items}

    assert await select("tier=gold") == {names["gold"]}
    assert await select("tier!=gold") == {names["silver"], names["plain"]}
    assert await select("tier in (gold,silver)") == {names["gold"], names["silver"]}
    assert await select("tier notin (gold)") == {names["silver"], names["plain"]}
    assert await select("tier") == {names["gold"], names["silver"]}
    assert await select("!tier") == {names["plain"]}

    by_name = await core.list_namespaced_config_map(
        ns, field_selector=f"metadata.name={names['silver']}"
    )
    assert [c.metadata.name for c in by_name.items] == [names["silver"]]
    not_name = await core.list_namespaced_config_map(
        ns, label_selector=f"run={run}", field_selector=f"metadata.name!={names['silver']}"
    )
    assert {c.metadata.name for c in not_name.items} == {names["gold"], names["plain"]}
    by_ns = await core.list_config_map_for_all_namespaces(
        label_selector=f"run={run}", field_selector=f"metadata.namespace={ns}"
    )
    assert len(by_ns.items) == 3


async def test_limit_and_continue_pagination(kube_cluster: TestCluster) -> None:
    core = CoreV1Api(kube_cluster.api_client)
    ns = kube_cluster.namespace
    run = kube_cluster.unique_name("page")
    expected = set()
    for i in range(7):
        name = f"{run}-{i}"
        expected.add(name)
        await core.create_namespaced_config_map(
            ns, {"metadata": {"name": name, "labels": {"run": run}}}
        )

    seen: list[str] = []
    token = None
    pages = 0
    while True:
        page = await core.list_namespaced_config_map(
            ns, label_selector=f"run={run}", limit=3, _continue=token
        )
        pages += 1
        assert len(page.items) <= 3
        seen.extend(c.metadata.name for c in page.items)
        token = page.metadata._continue
        if not token:
            break
        assert page.metadata.remaining_item_count is None or page.metadata.remaining_item_count > 0
    # 7 objects at most 3 a page: at least 3 pages (a real server may return short pages).
    assert pages >= 3
    assert sorted(seen) == sorted(expected)
    assert len(seen) == len(set(seen))


async def test_watch_from_resource_version_sees_changes_in_order(
    kube_cluster: TestCluster,
) -> None:
    core = CoreV1Api(kube_cluster.api_client)
    ns = kube_cluster.namespace
    run = kube_cluster.unique_name("watch")
    start = (await core.list_namespaced_config_map(ns, label_selector=f"run={run}")).metadata
    name = f"{run}-obj"
    await core.create_namespaced_config_map(
        ns, {"metadata": {"name": name, "labels": {"run": run}}, "data": {"v": "1"}}
    )
    await core.patch_namespaced_config_map(name, ns, {"data": {"v": "2"}}, _content_type=MERGE)
    await core.delete_namespaced_config_map(name, ns)

    seen: list[tuple[str, str, str | None]] = []
    watch = Watch()
    async with asyncio.timeout(30):
        async for event in watch.stream(
            core.list_namespaced_config_map,
            ns,
            label_selector=f"run={run}",
            resource_version=start.resource_version,
            timeout_seconds=20,
        ):
            obj = event["object"]
            seen.append((event["type"], obj.metadata.name, (obj.data or {}).get("v")))
            if event["type"] == "DELETED":
                watch.stop()
    await watch.close()
    assert seen == [("ADDED", name, "1"), ("MODIFIED", name, "2"), ("DELETED", name, "2")]


async def test_watch_bookmarks(kube_cluster: TestCluster) -> None:
    core = CoreV1Api(kube_cluster.api_client)
    ns = kube_cluster.namespace
    run = kube_cluster.unique_name("bookmark")
    await core.create_namespaced_config_map(
        ns, {"metadata": {"name": f"{run}-obj", "labels": {"run": run}}}
    )
    listed = await core.list_namespaced_config_map(ns, label_selector=f"run={run}")
    # kube-apiserver sends bookmarks about once a minute; the in-memory server every second.
    bound = 75 if kube_cluster.is_real else 10
    bookmark_rv = None
    watch = Watch()
    async with asyncio.timeout(bound + 5):
        async for event in watch.stream(
            core.list_namespaced_config_map,
            ns,
            label_selector=f"run={run}",
            resource_version=listed.metadata.resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=bound,
        ):
            if event["type"] == "BOOKMARK":
                bookmark_rv = event["raw_object"]["metadata"]["resourceVersion"]
                watch.stop()
    await watch.close()
    assert bookmark_rv, "no BOOKMARK event arrived"
    assert int(bookmark_rv) >= int(listed.metadata.resource_version)


async def test_delete_returns_the_object_for_storage_resources(kube_cluster: TestCluster) -> None:
    core = CoreV1Api(kube_cluster.api_client)
    storage = StorageV1Api(kube_cluster.api_client)
    ns = kube_cluster.namespace
    sc_name = await create_class(kube_cluster, PROVISIONER)
    deleted_sc = await storage.delete_storage_class(sc_name)
    assert deleted_sc.kind == "StorageClass"
    assert deleted_sc.provisioner == PROVISIONER

    pv_name = kube_cluster.unique_name("pv")
    kube_cluster.track(PERSISTENT_VOLUMES, pv_name)
    pv = await core.create_persistent_volume(volume_body(pv_name))
    deleted_pv = await core.delete_persistent_volume(pv_name)
    assert deleted_pv.kind == "PersistentVolume"
    assert deleted_pv.metadata.uid == pv.metadata.uid

    claim_name = kube_cluster.unique_name("claim")
    claim = await core.create_namespaced_persistent_volume_claim(ns, claim_body(claim_name))
    deleted_claim = await core.delete_namespaced_persistent_volume_claim(claim_name, ns)
    assert deleted_claim.kind == "PersistentVolumeClaim"
    assert deleted_claim.metadata.uid == claim.metadata.uid


# --- the PV binder behaves like kube-controller-manager's persistentvolume controller ---------


async def claim_where(
    kube_cluster: TestCluster, name: str, check: Any, message: str, timeout: float = 30.0
) -> Any:
    core = CoreV1Api(kube_cluster.api_client)

    async def probe() -> Any:
        claim = await core.read_namespaced_persistent_volume_claim(name, kube_cluster.namespace)
        return claim if check(claim) else None

    return await kube_cluster.wait_for(probe, timeout=timeout, message=message)


async def event_for(kube_cluster: TestCluster, name: str, reason: str) -> Any:
    core = CoreV1Api(kube_cluster.api_client)

    async def probe() -> Any:
        events = await core.list_namespaced_event(kube_cluster.namespace)
        for e in events.items:
            if e.involved_object.name == name and e.reason == reason:
                return e
        return None

    return await kube_cluster.wait_for(probe, message=f"{reason} event for {name}")


def provisioner_annotated(claim: Any) -> bool:
    return "volume.kubernetes.io/storage-provisioner" in (claim.metadata.annotations or {})


async def test_pv_controller_annotates_and_binds_provisioned_claims(
    kube_cluster: TestCluster,
) -> None:
    core = CoreV1Api(kube_cluster.api_client)
    ns = kube_cluster.namespace
    cls = await create_class(kube_cluster, PROVISIONER)
    name = kube_cluster.unique_name("claim")
    claim = await core.create_namespaced_persistent_volume_claim(
        ns, claim_body(name, storageClassName=cls)
    )

    annotated = await claim_where(kube_cluster, name, provisioner_annotated, "annotations")
    ann = annotated.metadata.annotations
    assert ann["volume.kubernetes.io/storage-provisioner"] == PROVISIONER
    assert ann["volume.beta.kubernetes.io/storage-provisioner"] == PROVISIONER
    event = await event_for(kube_cluster, name, "ExternalProvisioning")
    assert event.source.component == "persistentvolume-controller"
    assert event.message == (
        f"Waiting for a volume to be created either by the external provisioner '{PROVISIONER}' "
        "or manually by the system administrator. If volume creation is delayed, please verify "
        "that the provisioner is running and correctly registered."
    )

    # Play the external provisioner: a PV whose claimRef names the claim.
    pv_name = f"pvc-{claim.metadata.uid}"
    kube_cluster.track(PERSISTENT_VOLUMES, pv_name)
    pv = volume_body(pv_name)
    pv["metadata"]["annotations"] = {"pv.kubernetes.io/provisioned-by": PROVISIONER}
    pv["spec"]["storageClassName"] = cls
    pv["spec"]["capacity"] = {"storage": "2Gi"}
    pv["spec"]["claimRef"] = {
        "kind": "PersistentVolumeClaim",
        "apiVersion": "v1",
        "namespace": ns,
        "name": name,
        "uid": claim.metadata.uid,
    }
    await core.create_persistent_volume(pv)

    bound = await claim_where(
        kube_cluster, name, lambda c: c.status.phase == "Bound", "claim Bound"
    )
    assert bound.spec.volume_name == pv_name
    assert bound.status.capacity == {"storage": "2Gi"}
    assert bound.status.access_modes == ["ReadWriteOnce"]
    assert bound.metadata.annotations["pv.kubernetes.io/bind-completed"] == "yes"
    assert bound.metadata.annotations["pv.kubernetes.io/bound-by-controller"] == "yes"
    volume = await core.read_persistent_volume(pv_name)
    assert volume.status.phase == "Bound"

    await core.delete_namespaced_persistent_volume_claim(name, ns)

    async def released() -> bool:
        return (await core.read_persistent_volume(pv_name)).status.phase == "Released"

    await kube_cluster.wait_for(released, message="PV Released after its claim went away")


async def waiting_for_a_consumer(kube_cluster: TestCluster) -> tuple[str, Any]:
    """A claim of a new WaitForFirstConsumer class, once the PV controller said it waits.
    Returns its name and that event."""
    cls = kube_cluster.unique_name("late")
    kube_cluster.track(STORAGE_CLASSES, cls)
    await StorageV1Api(kube_cluster.api_client).create_storage_class(
        {
            "metadata": {"name": cls},
            "provisioner": PROVISIONER,
            "volumeBindingMode": "WaitForFirstConsumer",
        }
    )
    name = kube_cluster.unique_name("claim")
    await CoreV1Api(kube_cluster.api_client).create_namespaced_persistent_volume_claim(
        kube_cluster.namespace, claim_body(name, storageClassName=cls)
    )
    return name, await event_for(kube_cluster, name, "WaitForFirstConsumer")


async def test_wait_for_first_consumer_needs_a_consumer(kube_cluster: TestCluster) -> None:
    core = CoreV1Api(kube_cluster.api_client)
    name, event = await waiting_for_a_consumer(kube_cluster)
    assert event.message == "waiting for first consumer to be created before binding"
    waiting = await core.read_namespaced_persistent_volume_claim(name, kube_cluster.namespace)
    assert not provisioner_annotated(waiting)

    pod = await kube_cluster.create_consumer_pod(name)
    assert pod["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == name
    scheduled = await claim_where(
        kube_cluster, name, provisioner_annotated, "provisioning after a consumer appeared", 90
    )
    assert scheduled.metadata.annotations["volume.kubernetes.io/selected-node"]
    assert scheduled.metadata.annotations["volume.kubernetes.io/storage-provisioner"] == (
        PROVISIONER
    )


async def test_schedule_sets_selected_node_in_memory(kube_cluster: TestCluster) -> None:
    kube_cluster.require_own_cluster("sets selected-node without a pod")
    name, _event = await waiting_for_a_consumer(kube_cluster)
    await kube_cluster.schedule(name, "node-7")
    claim = await claim_where(kube_cluster, name, provisioner_annotated, "provisioning")
    assert claim.metadata.annotations["volume.kubernetes.io/selected-node"] == "node-7"


# --- the harness itself ---------------------------------------------------------------------


async def test_wait_for_reports_what_it_waited_for(kube_cluster: TestCluster) -> None:
    calls = 0

    async def never() -> int:
        nonlocal calls
        calls += 1
        return 0

    with pytest.raises(AssertionError, match=r"waiting for the impossible: 0"):
        await kube_cluster.wait_for(never, timeout=0.2, message="the impossible")
    assert calls > 1

    async def soon() -> str:
        return "ready" if calls > 5 else ""

    async def count_then_soon() -> str:
        nonlocal calls
        calls += 1
        return await soon()

    assert await kube_cluster.wait_for(count_then_soon, timeout=5) == "ready"
    assert kube_cluster.unique_name("Abc-") != kube_cluster.unique_name("Abc-")
    assert kube_cluster.unique_name("Abc-").startswith("abc-")


async def test_cluster_on_a_kubeconfig_cleans_up(tmp_path: Any) -> None:
    from pyprovlib.testing._server import ApiServer

    async with ApiServer() as server:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        cluster = TestCluster(kubeconfig)
        async with cluster:
            assert cluster.is_real
            assert cluster.server is None
            storage = StorageV1Api(cluster.api_client)
            sc = cluster.unique_name("sc")
            cluster.track(STORAGE_CLASSES, sc)
            await storage.create_storage_class({"metadata": {"name": sc}, "provisioner": "x.y/z"})
            with pytest.raises(pytest.skip.Exception):
                cluster.require_in_memory("fault injection")
            with pytest.raises(ValueError, match="namespaced"):
                cluster.track(PERSISTENT_VOLUME_CLAIMS, "x")
            namespace = cluster.namespace
        async with server.api_client() as client:
            assert await refused(StorageV1Api(client).read_storage_class(sc)) == 404

            async def namespace_gone() -> bool:
                try:
                    ns = await CoreV1Api(client).read_namespace(namespace)
                except ApiException as err:
                    return err.status == 404
                return ns.status.phase == "Terminating"

            assert await namespace_gone()


@pytest.mark.parametrize(
    ("kind", "keeps_request_metadata"),
    [("claim", True), ("node", True), ("pod", True), ("attachment", False)],
)
async def test_status_writes_and_metadata(
    kube_cluster: TestCluster, kind: str, keeps_request_metadata: bool
) -> None:
    """What a write to /status keeps of the metadata it carries: the claim, node and pod status
    strategies copy only the spec from the stored object (labels, annotations and finalizers
    of the request are kept; a pod's owner references are not), VolumeAttachment's resets the
    metadata to the stored one (ResetObjectMetaForStatus)."""
    from pyprovlib.kube._resources import NODES, PODS
    from pyprovlib.testing._binder import _Http

    http = _Http(kube_cluster.api_client)
    ns = kube_cluster.namespace
    name = kube_cluster.unique_name(kind)
    if kind == "claim":
        collection = PERSISTENT_VOLUME_CLAIMS.path(ns)
        body: dict[str, Any] = claim_body(name)
        status: dict[str, Any] = {"phase": "Lost"}
    elif kind == "node":
        collection = NODES.path()
        body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}
        status = {"phase": "Running"}
        kube_cluster.track(NODES, name)
    elif kind == "pod":
        collection = PODS.path(ns)
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            # A node name no node has: no scheduler or kubelet touches it.
            "metadata": {"name": name},
            "spec": {
                "nodeName": "pyprovlib-no-such-node",
                "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
            },
        }
        status = {"message": "from the test"}
    else:
        collection = VOLUME_ATTACHMENTS.path()
        body = attachment_body(name, PROVISIONER, "pyprovlib-no-such-node", name)
        status = {"attached": True}
        kube_cluster.track(VOLUME_ATTACHMENTS, name)
    await http.json("POST", collection, body=body)
    owner = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "o",
        "uid": "1" * 8 + "-1111-1111-1111-" + "1" * 12,
    }
    written = await http.json(
        "PATCH",
        f"{collection}/{name}/status",
        body={
            "metadata": {
                "labels": {"from-status": "yes"},
                "annotations": {"example.com/from-status": "yes"},
                "finalizers": ["example.com/from-status"],
                "ownerReferences": [owner],
            },
            "status": status,
        },
        content_type=MERGE,
    )
    meta = written["metadata"]
    try:
        assert written["status"] | status == written["status"]
        assert ((meta.get("labels") or {}).get("from-status") == "yes") is keeps_request_metadata
        annotations = meta.get("annotations") or {}
        assert ("example.com/from-status" in annotations) is keeps_request_metadata
        finalizers = meta.get("finalizers") or []
        assert ("example.com/from-status" in finalizers) is keeps_request_metadata
        assert bool(meta.get("ownerReferences")) is (
            keep_owner := keeps_request_metadata and kind != "pod"
        )
        stored = await http.json("GET", f"{collection}/{name}")
        assert bool(stored["metadata"].get("ownerReferences")) is keep_owner
    finally:
        if "example.com/from-status" in (meta.get("finalizers") or []):
            await http.json(
                "PATCH",
                f"{collection}/{name}",
                body={"metadata": {"finalizers": None}},
                content_type=MERGE,
            )


@pytest.mark.parametrize(
    ("spec", "kept"),
    [
        ({"dataSource": {"apiGroup": "example.com", "kind": "VolumeSnapshot", "name": "x"}}, None),
        ({"dataSource": {"apiGroup": "hello.example.com", "kind": "Hello", "name": "x"}}, None),
        (
            {"dataSourceRef": {"apiGroup": "hello.example.com", "kind": "Hello", "name": "x"}},
            {"apiGroup": "hello.example.com", "kind": "Hello", "name": "x"},
        ),
        (
            {"dataSource": {"kind": "PersistentVolumeClaim", "name": "x"}},
            {"apiGroup": None, "kind": "PersistentVolumeClaim", "name": "x"},
        ),
        (
            {
                "dataSourceRef": {
                    "apiGroup": "snapshot.storage.k8s.io",
                    "kind": "VolumeSnapshot",
                    "name": "x",
                    "namespace": "elsewhere",
                }
            },
            None,
        ),
    ],
    ids=["wrong-group", "populator-as-dataSource", "populator-ref", "claim", "cross-namespace"],
)
async def test_claim_data_sources_are_normalized_or_dropped(
    kube_cluster: TestCluster, spec: dict[str, Any], kept: dict[str, Any] | None
) -> None:
    """A claim's dataSource/dataSourceRef on create (pkg/api/persistentvolumeclaim): a
    dataSource alone that is neither a claim nor a snapshot.storage.k8s.io VolumeSnapshot is
    dropped; a dataSourceRef of any kind is kept and mirrored; a core-group reference comes back
    with "apiGroup": null; a cross-namespace dataSourceRef is dropped without the alpha
    CrossNamespaceVolumeDataSource gate (off by default)."""
    from pyprovlib.testing._binder import _Http

    http = _Http(kube_cluster.api_client)
    name = kube_cluster.unique_name("source")
    created = await http.json(
        "POST",
        PERSISTENT_VOLUME_CLAIMS.path(kube_cluster.namespace),
        body=claim_body(name, **spec),
    )
    assert created["spec"].get("dataSource") == kept
    assert created["spec"].get("dataSourceRef") == kept

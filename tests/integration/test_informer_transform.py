"""The informer transform (client-go's ``SetTransform`` / ``informers.WithTransform``) against
the in-memory API server over HTTP: every LIST item and every watch event's object goes
through it before the cache and the handlers see it; a transform that raises fails the
LIST/watch and the informer relists after a backoff; the controllers' own factories strip
``metadata.managedFields``, a factory passed in keeps its owner's choice.

The in-memory server does not write managedFields itself: the objects here carry them from
their create request, which it keeps (as the real API server does)."""

from __future__ import annotations

import asyncio
import io

import pytest
from kubernetes_asyncio.client import ApiClient
from provision_support import MemoryProvisioner

from pyprovlib._errors import PyprovlibError
from pyprovlib.controller._attach import AttachController
from pyprovlib.controller._provision import ProvisionController
from pyprovlib.kube import strip_managed_fields as exported_strip
from pyprovlib.kube._informer import (
    SharedInformerFactory,
    TransformError,
    strip_managed_fields,
)
from pyprovlib.kube._objects import Obj, meta_namespace_key
from pyprovlib.kube._resources import PERSISTENT_VOLUME_CLAIMS, PERSISTENT_VOLUMES
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.kube._store import DeletedFinalStateUnknown
from pyprovlib.testing import eventually

MANAGED = [
    {
        "manager": "kubectl-client-side-apply",
        "operation": "Update",
        "apiVersion": "v1",
        "time": "2026-01-01T00:00:00Z",
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:metadata": {"f:labels": {"f:app": {}}}},
    }
]


def claim(name: str, **labels: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": name,
            "namespace": "default",
            "labels": {"app": "x", **labels},
            "managedFields": MANAGED,
        },
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }


def test_strip_managed_fields_drops_only_that_key_in_place() -> None:
    labels = {"app": "x"}
    spec = {"capacity": {"storage": "1Gi"}}
    obj: Obj = {
        "kind": "PersistentVolume",
        "metadata": {"name": "pv", "labels": labels, "managedFields": MANAGED},
        "spec": spec,
    }
    metadata = obj["metadata"]
    out = strip_managed_fields(obj)
    assert out is obj
    assert obj["metadata"] is metadata
    assert obj == {
        "kind": "PersistentVolume",
        "metadata": {"name": "pv", "labels": labels},
        "spec": spec,
    }
    assert obj["metadata"]["labels"] is labels
    assert obj["spec"] is spec
    # Nothing to drop: the object comes back as it was.
    for unchanged in ({"metadata": {"name": "a"}}, {"kind": "X"}, {"metadata": None}):
        before = repr(unchanged)
        assert strip_managed_fields(unchanged) is unchanged
        assert repr(unchanged) == before
    assert exported_strip is strip_managed_fields


async def test_without_a_transform_the_cache_holds_objects_as_received(
    kube_client: ApiClient, task_group: asyncio.TaskGroup
) -> None:
    await ResourceClient(kube_client, PERSISTENT_VOLUME_CLAIMS).create(claim("c0"))
    factory = SharedInformerFactory(kube_client)
    assert factory.transform is None
    informer = factory.informer_for(PERSISTENT_VOLUME_CLAIMS)
    assert informer.transform is None
    factory.start(task_group)
    assert await factory.wait_for_cache_sync(timeout=10)
    cached = informer.store.get_by_key("default/c0")
    assert cached is not None
    assert cached["metadata"]["managedFields"] == MANAGED


async def test_the_transform_sees_every_list_item_and_watch_event_before_the_cache(
    kube_client: ApiClient, task_group: asyncio.TaskGroup
) -> None:
    pvcs = ResourceClient(kube_client, PERSISTENT_VOLUME_CLAIMS)
    await pvcs.create(claim("listed"))
    seen: list[tuple[str, str]] = []

    def transform(obj: Obj) -> Obj:
        seen.append((meta_namespace_key(obj), obj["metadata"]["resourceVersion"]))
        return strip_managed_fields(obj)

    factory = SharedInformerFactory(kube_client, transform=transform)
    informer = factory.informer_for(PERSISTENT_VOLUME_CLAIMS)
    other = factory.informer_for(PERSISTENT_VOLUMES)
    assert informer.transform is transform
    assert other.transform is transform
    handed: list[tuple[str, Obj]] = []

    def on_delete(obj: Obj | DeletedFinalStateUnknown) -> None:
        assert not isinstance(obj, DeletedFinalStateUnknown)
        handed.append(("delete", obj))

    informer.add_event_handler(
        lambda obj: handed.append(("add", obj)),
        lambda old, new: handed.extend([("old", old), ("new", new)]),
        on_delete,
    )
    factory.start(task_group)
    assert await factory.wait_for_cache_sync(timeout=10)

    added = await pvcs.create(claim("watched"))
    modified = await pvcs.patch(
        "listed", {"metadata": {"labels": {"changed": "yes"}}}, namespace="default"
    )
    assert modified["metadata"]["managedFields"] == MANAGED  # the server kept them
    await pvcs.delete("watched", "default")
    await eventually(
        lambda: [kind for kind, _ in handed] == ["add", "add", "old", "new", "delete"],
        message="add (LIST), add, update and delete (watch) handed to the handler",
    )
    rv = added["metadata"]["resourceVersion"]
    assert ("default/watched", rv) in seen  # ADDED
    assert ("default/listed", modified["metadata"]["resourceVersion"]) in seen  # MODIFIED
    assert len([key for key, _ in seen if key == "default/watched"]) == 2  # and DELETED
    for kind, obj in handed:
        assert "managedFields" not in obj["metadata"], kind
    cached = informer.store.get_by_key("default/listed")
    assert cached is not None
    assert cached["metadata"]["labels"]["changed"] == "yes"
    assert "managedFields" not in cached["metadata"]
    # The API server still has them: only the cache went without.
    assert (await pvcs.get("listed", "default"))["metadata"]["managedFields"] == MANAGED


async def test_set_transform_only_before_the_informer_runs(
    kube_client: ApiClient, task_group: asyncio.TaskGroup
) -> None:
    factory = SharedInformerFactory(kube_client)
    informer = factory.informer_for(PERSISTENT_VOLUME_CLAIMS)
    informer.set_transform(strip_managed_fields)
    assert informer.transform is strip_managed_fields
    await ResourceClient(kube_client, PERSISTENT_VOLUME_CLAIMS).create(claim("c0"))
    factory.start(task_group)
    assert await factory.wait_for_cache_sync(timeout=10)
    cached = informer.store.get_by_key("default/c0")
    assert cached is not None
    assert "managedFields" not in cached["metadata"]
    with pytest.raises(RuntimeError, match="already started"):
        informer.set_transform(None)
    assert informer.transform is strip_managed_fields


async def test_a_failing_transform_fails_the_list_and_watch_and_the_informer_relists(
    kube_client: ApiClient, task_group: asyncio.TaskGroup, logs: io.StringIO
) -> None:
    pvcs = ResourceClient(kube_client, PERSISTENT_VOLUME_CLAIMS)
    await pvcs.create(claim("good"))
    await pvcs.create(claim("bad", poison="yes"))
    broken = True

    def transform(obj: Obj) -> Obj:
        if broken and obj["metadata"]["labels"].get("poison"):
            raise ValueError("cannot reshape this one")
        return strip_managed_fields(obj)

    factory = SharedInformerFactory(
        kube_client, transform=transform, backoff_initial=0.01, backoff_cap=0.05
    )
    informer = factory.informer_for(PERSISTENT_VOLUME_CLAIMS)
    factory.start(task_group)
    # The LIST carrying the object fails as a whole: nothing cached, not synced, relisted.
    await eventually(lambda: "informer transform failed" in logs.getvalue(), message="error")
    await eventually(lambda: "default/bad" in logs.getvalue(), message="the key in the log")
    assert "cannot reshape this one" in logs.getvalue()
    assert not informer.has_synced()
    assert len(informer.store) == 0
    broken = False
    assert await factory.wait_for_cache_sync(timeout=10)
    assert sorted(informer.store.list_keys()) == ["default/bad", "default/good"]

    # A watch event whose object the transform rejects: the cache keeps the version it had
    # (no change is skipped silently), the watch ends, and the relists fail too until the
    # transform accepts the object; then the cache catches up.
    lists = informer.reflector.lists
    failures = logs.getvalue().count("informer transform failed")
    broken = True
    poisoned = await pvcs.patch(
        "good", {"metadata": {"labels": {"poison": "now"}}}, namespace="default"
    )
    await eventually(
        lambda: logs.getvalue().count("informer transform failed") >= failures + 3,
        message="the failed watch, then relists failing again",
    )
    cached = informer.store.get_by_key("default/good")
    assert cached is not None
    assert cached["metadata"]["labels"] == {"app": "x"}
    assert informer.reflector.lists == lists
    broken = False
    want = poisoned["metadata"]["resourceVersion"]
    await eventually(
        lambda: (
            (informer.store.get_by_key("default/good") or {})["metadata"]["resourceVersion"] == want
        ),
        message="the cache caught up",
    )
    assert informer.reflector.lists > lists, "the informer relisted"


async def test_a_transform_must_return_a_dict(
    kube_client: ApiClient, task_group: asyncio.TaskGroup, logs: io.StringIO
) -> None:
    await ResourceClient(kube_client, PERSISTENT_VOLUME_CLAIMS).create(claim("c0"))
    factory = SharedInformerFactory(
        kube_client,
        transform=lambda obj: None,  # type: ignore[arg-type,return-value]
        backoff_initial=0.01,
        backoff_cap=0.05,
    )
    informer = factory.informer_for(PERSISTENT_VOLUME_CLAIMS)
    factory.start(task_group)
    await eventually(
        lambda: "returned NoneType for PersistentVolumeClaim default/c0" in logs.getvalue(),
        message="the error",
    )
    assert not informer.has_synced()
    assert issubclass(TransformError, PyprovlibError)


async def test_controllers_strip_managed_fields_unless_given_a_factory(
    kube_client: ApiClient,
) -> None:
    provision = ProvisionController(kube_client, "example.com/p", MemoryProvisioner())
    assert provision.informer_factory.transform is strip_managed_fields
    attach = AttachController(kube_client, "example.com", None)
    assert attach.informer_factory.transform is strip_managed_fields
    mine = SharedInformerFactory(kube_client)
    kept = ProvisionController(
        kube_client, "example.com/p", MemoryProvisioner(), informer_factory=mine
    )
    assert kept.informer_factory is mine
    assert mine.transform is None

"""core/v1 and events.k8s.io/v1 Events of pyprovlib.testing.ApiServer: one stored object,
two views, and the create validation of each API."""

from __future__ import annotations

import json

import aiohttp
import pytest
from api_support import error_body
from kubernetes_asyncio.client import ApiClient, CoreV1Api, EventsV1Api
from kubernetes_asyncio.client.exceptions import ApiException

from pyprovlib.testing._server import ApiServer

NEW_STYLE = {
    "metadata": {"name": "e1"},
    "eventTime": "2026-01-01T00:00:00.000000Z",
    "reportingController": "example.com/provisioner",
    "reportingInstance": "provisioner-1",
    "action": "Provisioning",
    "reason": "ProvisioningSucceeded",
    "note": "volume created",
    "type": "Normal",
    "regarding": {"kind": "PersistentVolumeClaim", "namespace": "default", "name": "c1"},
}


async def test_events_v1_is_a_view_of_core_events(
    apiserver: ApiServer, kube_client: ApiClient
) -> None:
    events = EventsV1Api(kube_client)
    core = CoreV1Api(kube_client)
    created = await events.create_namespaced_event("default", NEW_STYLE)
    assert created.note == "volume created"
    legacy = await core.read_namespaced_event("e1", "default")
    assert legacy.message == "volume created"
    assert legacy.involved_object.name == "c1"
    assert legacy.reporting_component == "example.com/provisioner"
    back = await events.read_namespaced_event("e1", "default")
    assert back.regarding.kind == "PersistentVolumeClaim"
    listed = await events.list_namespaced_event("default", field_selector="regarding.name=c1")
    assert [e.metadata.name for e in listed.items] == ["e1"]
    legacy_listed = await core.list_namespaced_event(
        "default", field_selector="involvedObject.name=c1"
    )
    assert [e.metadata.name for e in legacy_listed.items] == ["e1"]
    patched = await events.patch_namespaced_event(
        "e1", "default", {"note": "changed"}, _content_type="application/merge-patch+json"
    )
    assert patched.note == "changed"
    assert (await core.read_namespaced_event("e1", "default")).message == "changed"
    stored = apiserver.storage.get("events.k8s.io/events", "default", "e1")
    assert stored is not None
    assert stored["note"] == "changed"
    stored_legacy = apiserver.storage.get("events", "default", "e1")
    assert stored_legacy is not None
    assert stored_legacy["message"] == "changed"

    async with (
        aiohttp.ClientSession() as session,
        session.get(
            apiserver.url + "/apis/events.k8s.io/v1/namespaces/default/events",
            params={"watch": "1", "resourceVersion": created.metadata.resource_version},
        ) as resp,
    ):
        await core.delete_namespaced_event("e1", "default")
        event = json.loads(await resp.content.readline())
        assert event["type"] == "MODIFIED"
        assert event["object"]["apiVersion"] == "events.k8s.io/v1"
        assert event["object"]["note"] == "changed"
        event = json.loads(await resp.content.readline())
        assert event["type"] == "DELETED"


async def test_event_validation(kube_client: ApiClient) -> None:
    events = EventsV1Api(kube_client)
    missing = {k: v for k, v in NEW_STYLE.items() if k not in ("eventTime", "action")}
    with pytest.raises(ApiException) as e:
        await events.create_namespaced_event("default", missing)
    assert e.value.status == 422
    fields = {c["field"] for c in error_body(e.value)["details"]["causes"]}
    assert fields == {"eventTime"}
    too_long = {**NEW_STYLE, "note": "x" * 1025}
    with pytest.raises(ApiException) as e:
        await events.create_namespaced_event("default", too_long)
    assert e.value.status == 422
    core = CoreV1Api(kube_client)
    with pytest.raises(ApiException) as e:
        await core.create_namespaced_event(
            "default",
            {
                "metadata": {"name": "wrong-ns"},
                "involvedObject": {"kind": "Pod", "namespace": "kube-system", "name": "p"},
                "reason": "X",
            },
        )
    assert e.value.status == 422
    assert "does not match event.namespace" in error_body(e.value)["message"]
    # a legacy event about a cluster-scoped object lives in "default"
    ok = await core.create_namespaced_event(
        "default",
        {
            "metadata": {"name": "pv-event"},
            "involvedObject": {"kind": "PersistentVolume", "name": "pv"},
        },
    )
    assert ok.involved_object.name == "pv"

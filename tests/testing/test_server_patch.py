"""The three patch types of pyprovlib.testing.ApiServer: merge semantics as Kubernetes merges
finalizers, annotations, labels and keyed lists, and the errors of bad patches."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio.client import ApiClient, CoreV1Api
from kubernetes_asyncio.client.exceptions import ApiException

from pyprovlib.testing._patch import (
    apply_json_patch,
    apply_merge_patch,
    apply_strategic_merge_patch,
)
from pyprovlib.testing._server import ApiServer
from pyprovlib.testing._status import ApiError

MERGE = "application/merge-patch+json"
JSON = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"


async def _seed(v1: CoreV1Api) -> None:
    await v1.create_namespaced_config_map(
        "default",
        {
            "metadata": {
                "name": "cm",
                "finalizers": ["a/one", "a/two"],
                "annotations": {"keep": "1", "drop": "2"},
                "labels": {"l": "1"},
            },
            "data": {"x": "1"},
        },
    )


async def _patch(v1: CoreV1Api, body: Any, content_type: str) -> Any:
    return await v1.patch_namespaced_config_map("cm", "default", body, _content_type=content_type)


async def test_strategic_merge_finalizers_union_and_annotations(kube_client: ApiClient) -> None:
    v1 = CoreV1Api(kube_client)
    await _seed(v1)
    out = await _patch(
        v1,
        {
            "metadata": {
                "finalizers": ["a/two", "a/three"],
                "annotations": {"drop": None, "new": "3"},
            }
        },
        STRATEGIC,
    )
    assert out.metadata.finalizers == ["a/one", "a/two", "a/three"]
    assert out.metadata.annotations == {"keep": "1", "new": "3"}
    assert out.metadata.labels == {"l": "1"}
    out = await _patch(
        v1, {"metadata": {"$deleteFromPrimitiveList/finalizers": ["a/one", "a/three"]}}, STRATEGIC
    )
    assert out.metadata.finalizers == ["a/two"]


async def test_merge_patch_replaces_lists(kube_client: ApiClient) -> None:
    v1 = CoreV1Api(kube_client)
    await _seed(v1)
    out = await _patch(
        v1, {"metadata": {"finalizers": ["b/x"], "labels": {"m": "2"}}, "data": {"x": None}}, MERGE
    )
    assert out.metadata.finalizers == ["b/x"]
    assert out.metadata.labels == {"l": "1", "m": "2"}
    assert out.data is None


async def test_json_patch_ops_and_failing_test(kube_client: ApiClient) -> None:
    v1 = CoreV1Api(kube_client)
    await _seed(v1)
    out = await _patch(
        v1,
        [
            {"op": "test", "path": "/metadata/finalizers/0", "value": "a/one"},
            {"op": "add", "path": "/metadata/finalizers/-", "value": "a/three"},
            {"op": "remove", "path": "/metadata/finalizers/0"},
            {"op": "replace", "path": "/data/x", "value": "2"},
            {"op": "copy", "from": "/data/x", "path": "/data/y"},
            {"op": "move", "from": "/metadata/annotations/drop", "path": "/metadata/labels/moved"},
            {"op": "add", "path": "/metadata/annotations/a~1b", "value": "slash"},
        ],
        JSON,
    )
    assert out.metadata.finalizers == ["a/two", "a/three"]
    assert out.data == {"x": "2", "y": "2"}
    assert out.metadata.labels == {"l": "1", "moved": "2"}
    assert out.metadata.annotations == {"keep": "1", "a/b": "slash"}
    with pytest.raises(ApiException) as e:
        await _patch(v1, [{"op": "test", "path": "/data/x", "value": "nope"}], JSON)
    assert e.value.status == 422
    with pytest.raises(ApiException) as e:
        await _patch(v1, [{"op": "remove", "path": "/data/missing"}], JSON)
    assert e.value.status == 422


@pytest.mark.parametrize(
    ("metadata", "status"),
    [
        ({"name": "other"}, 400),
        ({"namespace": "kube-system"}, 400),
        ({"uid": "0000"}, 409),
        ({"resourceVersion": "1"}, 409),
    ],
)
async def test_patch_cannot_rename_or_change_uid(
    kube_client: ApiClient, metadata: dict[str, str], status: int
) -> None:
    v1 = CoreV1Api(kube_client)
    await _seed(v1)
    with pytest.raises(ApiException) as e:
        await _patch(v1, {"metadata": metadata}, MERGE)
    assert e.value.status == status


async def test_patch_of_a_missing_object_is_not_found(kube_client: ApiClient) -> None:
    v1 = CoreV1Api(kube_client)
    with pytest.raises(ApiException) as e:
        await v1.patch_namespaced_config_map("ghost", "default", {"data": {}})
    assert e.value.status == 404


async def test_bad_patch_bodies(apiserver: ApiServer, kube_client: ApiClient) -> None:
    await _seed(CoreV1Api(kube_client))
    url = apiserver.url + "/api/v1/namespaces/default/configmaps/cm"
    async with aiohttp.ClientSession() as session:
        for content_type, body, want in (
            (MERGE, b"{broken", 400),
            (JSON, b'{"op": "add"}', 400),
            ("application/apply-patch+yaml", b"data: {}", 415),
            ("application/xml", b"<x/>", 415),
        ):
            async with session.patch(
                url, data=body, headers={"Content-Type": content_type}
            ) as resp:
                assert resp.status == want, content_type
                status = json.loads(await resp.text())
                assert status["kind"] == "Status"
                assert status["code"] == want


def test_strategic_merge_keyed_lists_and_directives() -> None:
    pod: dict[str, Any] = {
        "metadata": {
            "ownerReferences": [{"uid": "1", "name": "a"}, {"uid": "2", "name": "b"}],
        },
        "spec": {
            "containers": [{"name": "c1", "image": "i1", "env": [{"name": "A", "value": "1"}]}],
            "tolerations": [{"key": "k1"}],
            "volumes": [{"name": "v1", "emptyDir": {}}],
        },
        "status": {"conditions": [{"type": "Ready", "status": "False"}]},
    }
    patch = {
        "metadata": {"ownerReferences": [{"uid": "2", "name": "b2"}, {"uid": "3", "name": "c"}]},
        "spec": {
            "containers": [{"name": "c1", "env": [{"name": "B", "value": "2"}]}],
            "tolerations": [{"key": "k2"}],
            "volumes": [{"name": "v1", "$patch": "delete"}],
        },
        "status": {"conditions": [{"type": "Ready", "status": "True"}, {"type": "X"}]},
    }
    out = apply_strategic_merge_patch(pod, patch)
    assert out["metadata"]["ownerReferences"] == [
        {"uid": "1", "name": "a"},
        {"uid": "2", "name": "b2"},
        {"uid": "3", "name": "c"},
    ]
    assert out["spec"]["containers"] == [
        {
            "name": "c1",
            "image": "i1",
            # the patch's items first, as kube-apiserver orders them (checked on a real one)
            "env": [{"name": "B", "value": "2"}, {"name": "A", "value": "1"}],
        }
    ]
    assert out["spec"]["tolerations"] == [{"key": "k2"}]
    assert out["spec"]["volumes"] == []
    assert out["status"]["conditions"] == [{"type": "Ready", "status": "True"}, {"type": "X"}]
    # the input is not mutated
    assert pod["spec"]["tolerations"] == [{"key": "k1"}]

    replaced = apply_strategic_merge_patch(
        {"metadata": {"labels": {"a": "1", "b": "2"}}},
        {"metadata": {"labels": {"$patch": "replace", "c": "3"}}},
    )
    assert replaced["metadata"]["labels"] == {"c": "3"}
    deleted = apply_strategic_merge_patch(
        {"spec": {"a": {"b": 1}, "c": 1}}, {"spec": {"a": {"$patch": "delete"}}}
    )
    assert deleted == {"spec": {"c": 1}}
    ordered = apply_strategic_merge_patch(
        {"metadata": {"finalizers": ["a", "b"]}},
        {"metadata": {"$setElementOrder/finalizers": ["b", "a", "c"], "finalizers": ["c"]}},
    )
    assert ordered["metadata"]["finalizers"] == ["b", "a", "c"]


def test_merge_patch_rfc7386_examples() -> None:
    target = {"a": "b", "c": {"d": "e", "f": "g"}}
    assert apply_merge_patch(target, {"a": "z", "c": {"f": None}}) == {"a": "z", "c": {"d": "e"}}
    assert apply_merge_patch({"a": [{"b": "c"}]}, {"a": [1]}) == {"a": [1]}
    assert apply_merge_patch({"e": None}, {"a": 1}) == {"e": None, "a": 1}
    assert apply_merge_patch(["a"], {"a": "b"}) == {"a": "b"}
    assert apply_merge_patch(target, {"c": {"d": None}}) == {"a": "b", "c": {"f": "g"}}
    assert target == {"a": "b", "c": {"d": "e", "f": "g"}}, "the input is not mutated"


def test_json_patch_errors() -> None:
    with pytest.raises(ApiError) as e:
        apply_json_patch({"a": [1]}, [{"op": "add", "path": "/a/5", "value": 1}])
    assert e.value.code == 422
    # an unknown op decodes and fails to apply: 422, as on kube-apiserver (differential row
    # json-patch-errors); a body that does not decode is the 400
    with pytest.raises(ApiError) as e:
        apply_json_patch({}, [{"op": "frobnicate", "path": "/a"}])
    assert e.value.code == 422
    with pytest.raises(ApiError) as e:
        apply_json_patch({}, [{"op": "add", "path": 5, "value": 1}])
    assert e.value.code == 400
    assert e.value.message == (
        "error decoding patch: json: cannot unmarshal number into Go struct field "
        "jsonPatchOp.path of type string"
    )
    target = {"a": {"b": 1}}
    assert apply_json_patch(target, [{"op": "add", "path": "/a/c", "value": 2}]) == {
        "a": {"b": 1, "c": 2}
    }
    assert target == {"a": {"b": 1}}, "the input is not mutated"
    assert apply_json_patch({"a": {"b": 1}}, [{"op": "test", "path": "/a", "value": {"b": 1}}]) == {
        "a": {"b": 1}
    }

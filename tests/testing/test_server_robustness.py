"""Bad input never crashes the in-memory API server: whatever JSON arrives, the registry answers
with a client error (4xx Status), never an unexpected exception."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from pyprovlib.kube import _resources as R
from pyprovlib.kube._clock import FakeClock
from pyprovlib.testing._registry import DeleteOptions, Registry
from pyprovlib.testing._selectors import parse_field_selector, parse_label_selector
from pyprovlib.testing._status import ApiError
from pyprovlib.testing._storage import Storage

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=12,
)
keys = st.sampled_from(
    [
        "metadata",
        "spec",
        "status",
        "kind",
        "apiVersion",
        "name",
        "labels",
        "annotations",
        "finalizers",
        "accessModes",
        "resources",
        "requests",
        "storage",
        "capacity",
        "hostPath",
        "leaseDurationSeconds",
        "provisioner",
        "source",
        "attacher",
        "nodeName",
        "data",
    ]
)
shaped = st.recursive(
    st.none() | st.booleans() | st.integers() | st.sampled_from(["x", "Bad_Name", "", "1Gi"]),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(keys, children, max_size=4),
    max_leaves=16,
)
names = st.sampled_from(["x", "y", "Bad_Name", "", "a" * 300]) | json_values
meta_values = {
    "name": names,
    "generateName": st.sampled_from(["gen-", ""]) | json_values,
    "namespace": st.sampled_from(["default", "other"]) | json_values,
    "labels": st.dictionaries(st.text(max_size=5), st.text(max_size=5) | json_values, max_size=2),
    "annotations": st.dictionaries(st.text(max_size=5), json_values, max_size=2),
    "finalizers": st.lists(st.text(max_size=5) | json_values, max_size=2) | json_values,
    "uid": json_values,
    "resourceVersion": st.sampled_from(["1", "999", "x"]) | json_values,
}
metadata = st.fixed_dictionaries({}, optional=meta_values) | json_values
objects = st.fixed_dictionaries(
    {"metadata": metadata},
    optional={
        "spec": shaped,
        "status": shaped,
        "kind": json_values,
        "apiVersion": json_values,
        "provisioner": json_values,
        "parameters": shaped,
        "data": shaped,
    },
)
bodies = st.one_of(json_values, shaped, objects, objects)
resources = st.sampled_from(
    [
        R.PERSISTENT_VOLUME_CLAIMS,
        R.PERSISTENT_VOLUMES,
        R.STORAGE_CLASSES,
        R.VOLUME_ATTACHMENTS,
        R.LEASES,
        R.CONFIGMAPS,
        R.NAMESPACES,
        R.PODS,
        R.NODES,
        R.CSINODES,
    ]
)


def _registry() -> Registry:
    registry = Registry(Storage(), FakeClock())
    registry.create(R.CONFIGMAPS, "default", {"metadata": {"name": "x"}})
    return registry


def _client_error(err: ApiError) -> None:
    assert 400 <= err.code < 500, err.body()
    assert err.body()["kind"] == "Status"


@settings(max_examples=150)
@given(resource=resources, body=bodies)
def test_create_and_update_never_crash(resource: R.Resource, body: Any) -> None:
    registry = _registry()
    namespace = "default" if resource.namespaced else None
    try:
        registry.create(resource, namespace, body)
    except ApiError as e:
        _client_error(e)
    try:
        registry.update(resource, namespace, "x", body)
    except ApiError as e:
        _client_error(e)


@settings(max_examples=150)
@given(
    patch=st.one_of(
        bodies,
        st.lists(
            st.fixed_dictionaries(
                {
                    "op": st.sampled_from(
                        ["add", "remove", "replace", "move", "copy", "test", "x"]
                    ),
                    "path": st.sampled_from(
                        [
                            "",
                            "/",
                            "/metadata",
                            "/metadata/name",
                            "/data/a",
                            "/metadata/finalizers/-",
                            "/metadata/finalizers/0",
                            "/x/y",
                        ]
                    ),
                },
                optional={
                    "value": json_values,
                    "from": st.sampled_from(["/data", "/metadata/uid"]),
                },
            ),
            max_size=3,
        ),
    ),
    content_type=st.sampled_from(
        [
            "application/merge-patch+json",
            "application/json-patch+json",
            "application/strategic-merge-patch+json",
        ]
    ),
    subresource=st.sampled_from([None, "status"]),
)
def test_patches_never_crash(patch: Any, content_type: str, subresource: str | None) -> None:
    registry = _registry()
    try:
        registry.patch(
            R.CONFIGMAPS,
            "default",
            "x",
            content_type,
            json.dumps(patch).encode(),
            subresource=subresource,
        )
    except ApiError as e:
        _client_error(e)
    # whatever happened, the stored object is still well formed
    obj = registry.get(R.CONFIGMAPS, "default", "x")
    assert obj["metadata"]["name"] == "x"
    registry.delete(R.CONFIGMAPS, "default", "x", DeleteOptions())


@settings(max_examples=200)
@given(text=st.text(max_size=30))
def test_selectors_never_crash(text: str) -> None:
    for parse in (parse_label_selector, lambda t: parse_field_selector(t, "", "pods")):
        try:
            sel = parse(text)
        except ApiError as e:
            _client_error(e)
        else:
            sel.matches({"metadata": {"name": "a", "labels": {"a": "b"}}})

"""The in-memory API server serves storage.k8s.io/v1 VolumeAttributesClasses and the
``volumeAttributesClassName`` fields of claims and volumes as kube-apiserver v1.36 does (the
same requests run against a real one in tests/e2e/test_differential_vac.py), and its PV binder
binds and reports the class as kube-controller-manager's PV controller does."""

from __future__ import annotations

from typing import Any

import pytest
from api_support import error_body
from claim_support import claim_body, vac_body
from kubernetes_asyncio.client import ApiClient
from server_support import get_json
from sidecar_support import wait_for

from pyprovlib import testing
from pyprovlib.kube._errors import ApiException
from pyprovlib.kube._resources import (
    PERSISTENT_VOLUME_CLAIMS,
    PERSISTENT_VOLUMES,
    VOLUME_ATTRIBUTES_CLASSES,
)
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.testing._server import ApiServer

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"


def vac(name: str, **fields: Any) -> dict[str, Any]:
    return vac_body(name, "hostpath.csi.k8s.io", **fields)


def causes(err: ApiException) -> list[tuple[str, str]]:
    body = error_body(err)
    return [(c["field"], c["message"]) for c in body["details"]["causes"]]


async def test_classes_are_validated_and_immutable(kube_client: ApiClient) -> None:
    classes = ResourceClient(kube_client, VOLUME_ATTRIBUTES_CLASSES)
    created = await classes.create(vac("gold"))
    assert (created["driverName"], created["parameters"]) == (
        "hostpath.csi.k8s.io",
        {"iops": "3000"},
    )
    with pytest.raises(ApiException) as refused:
        await classes.create(vac("bad", driverName="Bad_Driver!", parameters={}))
    assert refused.value.status == 422
    assert causes(refused.value) == [
        (
            "driverName",
            'Invalid value: "bad_driver!": name part must consist of alphanumeric characters, '
            "'-', '_' or '.', and must start and end with an alphanumeric character (e.g. "
            "'MyName',  or 'my.name',  or '123-abc', regex used for validation is "
            "'([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')",
        ),
        ("parameters", "Required value: must contain at least one key/value pair"),
    ]
    with pytest.raises(ApiException) as refused:
        await classes.patch("gold", {"parameters": {"iops": "1"}, "driverName": "x.example.com"})
    assert causes(refused.value) == [
        ("parameters", "Forbidden: updates to parameters are forbidden."),
        ("driverName", "Forbidden: updates to driverName are forbidden."),
    ]
    labelled = await classes.patch("gold", {"metadata": {"labels": {"tier": "1"}}})
    assert labelled["metadata"]["labels"] == {"tier": "1"}
    # The DELETE answers with the object, as the real registry does.
    deleted = await classes.delete("gold")
    assert deleted is not None
    assert deleted["kind"] == "VolumeAttributesClass"


async def test_discovery_and_table(apiserver: ApiServer) -> None:
    resources = await get_json(apiserver, "/apis/storage.k8s.io/v1")
    (entry,) = [r for r in resources["resources"] if r["name"] == "volumeattributesclasses"]
    assert (entry["kind"], entry["namespaced"], entry["shortNames"]) == (
        "VolumeAttributesClass",
        False,
        ["vac"],
    )
    async with apiserver.api_client() as client:
        await ResourceClient(client, VOLUME_ATTRIBUTES_CLASSES).create(vac("silver"))
    table = await get_json(apiserver, VOLUME_ATTRIBUTES_CLASSES.path(), accept=TABLE)
    assert [c["name"] for c in table["columnDefinitions"]] == ["Name", "DriverName", "Age"]
    assert table["rows"][0]["cells"][:2] == ["silver", "hostpath.csi.k8s.io"]


async def test_bound_claims_change_class_but_never_drop_it(
    apiserver_with_binder: ApiServer,
) -> None:
    """Binding copies the volume's class into the claim's status; only a Bound claim may
    change its class, and not to nothing once it has a current one."""
    async with apiserver_with_binder.api_client() as client:
        claims = ResourceClient(client, PERSISTENT_VOLUME_CLAIMS)
        volumes = ResourceClient(client, PERSISTENT_VOLUMES)
        await volumes.create(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": "pv1"},
                "spec": {
                    "capacity": {"storage": "1Gi"},
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": "manual",
                    "volumeAttributesClassName": "gold",
                    "csi": {"driver": "hostpath.csi.k8s.io", "volumeHandle": "h1"},
                },
            }
        )
        claim = claim_body("c1", "manual", namespace="default")
        # A claim asking for no class is not given the volume of class gold.
        await claims.create(claim)
        claim["metadata"]["name"] = "c2"
        claim["spec"]["volumeAttributesClassName"] = "gold"
        unbound = await claims.create(claim)

        async def bound() -> dict[str, Any] | None:
            c = await claims.get("c2", "default")
            return c if c["status"].get("phase") == "Bound" else None

        c2 = await wait_for(bound, message="c2 Bound to pv1")
        assert c2["spec"]["volumeName"] == "pv1"
        assert c2["status"]["currentVolumeAttributesClassName"] == "gold"
        assert apiserver_with_binder.binder is not None
        await testing.wait_idle(apiserver_with_binder.binder, c2, unbound)
        c1 = await claims.get("c1", "default")
        assert c1["status"]["phase"] == "Pending"
        with pytest.raises(ApiException) as refused:
            await claims.patch(
                "c1", {"spec": {"volumeAttributesClassName": "gold"}}, namespace="default"
            )
        assert causes(refused.value)[0][0] == "spec"  # only a Bound claim may change it

        for value, word in ((None, "nil"), ("", "empty string")):
            with pytest.raises(ApiException) as refused:
                await claims.patch(
                    "c2", {"spec": {"volumeAttributesClassName": value}}, namespace="default"
                )
            assert causes(refused.value) == [
                (
                    "spec.volumeAttributesClassName",
                    f"Forbidden: update to {word} is forbidden when "
                    "status.currentVolumeAttributesClassName is not nil",
                )
            ]
        changed = await claims.patch(
            "c2", {"spec": {"volumeAttributesClassName": "silver"}}, namespace="default"
        )
        assert changed["spec"]["volumeAttributesClassName"] == "silver"
        # Later changes of the volume's class are not copied by the binder (the resizer's).
        await volumes.patch("pv1", {"spec": {"volumeAttributesClassName": "silver"}})
        with pytest.raises(ApiException) as refused:
            await volumes.patch("pv1", {"spec": {"volumeAttributesClassName": None}})
        assert causes(refused.value) == [
            (
                "spec.volumeAttributesClassName",
                "Forbidden: update from non-nil value to nil is forbidden",
            )
        ]
        c2 = await claims.get("c2", "default")
        assert apiserver_with_binder.binder is not None
        await testing.wait_idle(apiserver_with_binder.binder, c2)
        assert (await claims.get("c2", "default"))["status"][
            "currentVolumeAttributesClassName"
        ] == "gold"

"""Differential rows for VolumeAttributesClasses and the claim and volume fields that name them
(issue 28): the same requests against the in-memory API server and a real kube-apiserver,
compared as in ``test_differential`` (status code, Status reason and causes, normalised
objects). Both sides bind a pre-bound claim and volume, the real one with
kube-controller-manager's PV controller, the in-memory one with its binder.

``pytest tests/e2e/test_differential_vac.py -m e2e -v -s`` prints every row's transcript.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from claim_support import vac_body
from differential_support import (
    DRIVER,
    JSON_PATCH,
    MERGE,
    Response,
    Side,
    assert_same_answers,
    claim,
    normalise,
    pytestmark,  # noqa: F401 - the e2e mark and the skip without a real kube-apiserver
    require_real_apiserver,
    transcript_of,
    two_sides,
    volume,
)

from pyprovlib.testing._cluster import TestCluster
from pyprovlib.testing._server import ApiServer

VACS = "/apis/storage.k8s.io/v1/volumeattributesclasses"
PVS = "/api/v1/persistentvolumes"
# kube-apiserver's StorageObjectInUseProtection admission adds it to every class (a known
# difference, as pvc-protection: docs/testing.md); the rows ignore it.
VAC_PROTECTION = "kubernetes.io/vac-protection"


def vac(name: str, **fields: Any) -> dict[str, Any]:
    return vac_body(name, DRIVER, **fields)


def prebound_volume(name: str, claim_name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    return volume(
        name,
        storage_class="pyprovlib-differential-vac",
        claimRef={"namespace": namespace, "name": claim_name},
        **spec,
    )


def _without_vac_protection(resp: Response) -> None:
    body = resp.body
    meta = body.get("metadata") if isinstance(body, dict) else None
    if isinstance(meta, dict) and VAC_PROTECTION in (meta.get("finalizers") or []):
        kept = [f for f in meta["finalizers"] if f != VAC_PROTECTION]
        if kept:
            meta["finalizers"] = kept
        else:
            del meta["finalizers"]


async def do(s: Side, label: str, method: str, path: str, body: Any = None, **kw: Any) -> None:
    """``Side.do`` with the vac-protection finalizer left out of what is recorded."""
    resp = await s.request(method, path, body, **kw)
    _without_vac_protection(resp)
    seen: dict[str, Any] = {"code": resp.code}
    if isinstance(resp.body, dict) and resp.body.get("kind") == "Status":
        seen["reason"] = resp.body.get("reason", "")
        causes = (resp.body.get("details") or {}).get("causes") or []
        if causes:
            # The message's first line: kube-apiserver appends a diff of the spec to some.
            seen["causes"] = sorted(
                {
                    (c.get("reason", ""), c.get("field", ""), c.get("message", "").split("\n")[0])
                    for c in causes
                }
            )
    else:
        seen["object"] = obj = normalise(resp.body, s)
        ref = (obj.get("spec") or {}).get("claimRef") if isinstance(obj, dict) else None
        if isinstance(ref, dict):
            # The claim's uid and resourceVersion differ between the two servers.
            ref.pop("uid", None)
            ref.pop("resourceVersion", None)
    s.record(label, seen)


async def wait_bound(s: Side, name: str) -> None:
    """Until the claim is Bound (by the real PV controller or the in-memory binder)."""
    path = s.ns_path("persistentvolumeclaims", name)
    async with asyncio.timeout(60):
        while True:
            resp = await s.request("GET", path)
            if ((resp.body or {}).get("status") or {}).get("phase") == "Bound":
                return
            await asyncio.sleep(0.2)


# ---------------------------------------------------------------------------------------------
# Rows


async def vac_validation(s: Side) -> None:
    """A class needs a qualified driver name and at least one parameter, no empty key, at most
    512; the messages are the real ones."""
    good = s.cluster_name("vac-good")
    s.cleanup.append(f"{VACS}/{good}")
    await do(s, "create", "POST", VACS, vac(good))
    await do(s, "no parameters", "POST", VACS, vac(s.cluster_name("vac-a"), parameters=None))
    await do(
        s,
        "bad driver, empty key",
        "POST",
        VACS,
        vac(s.cluster_name("vac-b"), driverName="Bad_Driver!", parameters={"": "x"}),
    )
    await do(s, "no driver", "POST", VACS, vac(s.cluster_name("vac-c"), driverName=""))
    many = {f"k{i}": "v" for i in range(513)}
    await do(s, "513 parameters", "POST", VACS, vac(s.cluster_name("vac-d"), parameters=many))
    await do(
        s,
        "prefixed driver",
        "POST",
        VACS,
        vac(s.cluster_name("vac-e"), driverName="example.com/a/b"),
    )


async def vac_immutable(s: Side) -> None:
    """Parameters and driver name never change; metadata does."""
    name = s.cluster_name("vac-imm")
    s.cleanup.append(f"{VACS}/{name}")
    await s.request("POST", VACS, vac(name))
    path = f"{VACS}/{name}"
    await do(s, "parameters", "PATCH", path, {"parameters": {"iops": "1"}}, content_type=MERGE)
    await do(s, "driver", "PATCH", path, {"driverName": "other.example.com"}, content_type=MERGE)
    await do(s, "labels", "PATCH", path, {"metadata": {"labels": {"l": "1"}}}, content_type=MERGE)
    await do(s, "get", "GET", path)


async def pvc_vac_unbound(s: Side) -> None:
    """An unbound claim's class name is fixed; a name must be a DNS subdomain; "" is allowed."""
    await do(
        s,
        "create with class",
        "POST",
        s.ns_path("persistentvolumeclaims"),
        claim("c1", volumeAttributesClassName="gold"),
    )
    path = s.ns_path("persistentvolumeclaims", "c1")
    for label, value in (("other", "silver"), ("empty", ""), ("null", None)):
        body = {"spec": {"volumeAttributesClassName": value}}
        await do(s, f"change to {label}", "PATCH", path, body, content_type=MERGE)
    await do(
        s,
        "invalid name",
        "POST",
        s.ns_path("persistentvolumeclaims"),
        claim("c2", volumeAttributesClassName="Not_A_Name"),
    )
    await do(
        s,
        "empty name",
        "POST",
        s.ns_path("persistentvolumeclaims"),
        claim("c3", volumeAttributesClassName=""),
    )


async def vac_bound_claim_and_volume(s: Side) -> None:
    """Binding copies the volume's class into the claim's currentVolumeAttributesClassName; a
    Bound claim may change its class but not drop it; a volume's class is never "" nor
    dropped; a class need not exist."""
    pv = s.cluster_name("pv-vac")
    s.cleanup.append(f"{PVS}/{pv}")
    await do(
        s,
        "volume",
        "POST",
        PVS,
        prebound_volume(pv, "c1", s.namespace, volumeAttributesClassName="gold"),
    )
    body = claim(
        "c1",
        storageClassName="pyprovlib-differential-vac",
        volumeName=pv,
        volumeAttributesClassName="gold",
    )
    await s.request("POST", s.ns_path("persistentvolumeclaims"), body)
    await wait_bound(s, "c1")
    path = s.ns_path("persistentvolumeclaims", "c1")
    await do(s, "bound claim", "GET", path)
    for label, value in (("empty", ""), ("null", None), ("missing class", "silver")):
        patch = {"spec": {"volumeAttributesClassName": value}}
        await do(s, f"claim to {label}", "PATCH", path, patch, content_type=MERGE)
    status = {
        "status": {
            "modifyVolumeStatus": {"status": "InProgress", "targetVolumeAttributesClassName": "x"}
        }
    }
    await do(s, "claim status", "PATCH", path + "/status", status, content_type=MERGE)
    drop = {"status": {"modifyVolumeStatus": None, "currentVolumeAttributesClassName": None}}
    await do(s, "claim status dropped", "PATCH", path + "/status", drop, content_type=MERGE)
    volume_path = f"{PVS}/{pv}"
    for label, value in (("empty", ""), ("null", None), ("invalid", "Bad_Name"), ("other", "y")):
        patch = {"spec": {"volumeAttributesClassName": value}}
        await do(s, f"volume to {label}", "PATCH", volume_path, patch, content_type=MERGE)
    await do(
        s,
        "volume json patch remove",
        "PATCH",
        volume_path,
        [{"op": "remove", "path": "/spec/volumeAttributesClassName"}],
        content_type=JSON_PATCH,
    )


ROWS = {
    "vac-validation": vac_validation,
    "vac-immutable": vac_immutable,
    "pvc-vac-unbound": pvc_vac_unbound,
    "vac-bound-claim-and-volume": vac_bound_claim_and_volume,
}


@pytest.fixture
async def in_memory(kube_cluster: TestCluster) -> Any:
    await require_real_apiserver(kube_cluster)
    async with ApiServer(binder=True) as server:
        yield server


@pytest.mark.parametrize("row_id", list(ROWS))
async def test_same_answers(row_id: str, kube_cluster: TestCluster, in_memory: ApiServer) -> None:
    row = ROWS[row_id]
    async with two_sides(kube_cluster, in_memory) as (mem, real):
        mem_t, real_t = await asyncio.gather(
            transcript_of(mem, row(mem)), transcript_of(real, row(real))
        )
    assert_same_answers(row_id, (row.__doc__ or "").strip().splitlines()[0], mem_t, real_t)

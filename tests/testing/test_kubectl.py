"""kubectl's everyday verbs against the standalone in-memory API server (a real subprocess,
driven by the real kubectl binary)."""

from __future__ import annotations

import asyncio
import json

import pytest
from kubectl_support import KUBECTL, Kubectl

from pyprovlib import testing

pytestmark = pytest.mark.kubectl


if KUBECTL is None:
    pytest.skip("kubectl not found", allow_module_level=True)


async def test_create_and_get(kubectl: Kubectl) -> None:
    _, out, _ = await kubectl.run("create", "-f", str(kubectl.tmp / "objs.yaml"))
    assert "storageclass.storage.k8s.io/fast created" in out
    assert "persistentvolumeclaim/claim1 created" in out
    assert "persistentvolume/pv1 created" in out

    _, out, _ = await kubectl.run("get", "pvc", "claim1", "-o", "yaml")
    assert "name: claim1" in out
    assert "phase: Pending" in out
    claim = await kubectl.json("get", "pvc", "claim1")
    assert claim["kind"] == "PersistentVolumeClaim"
    listed = await kubectl.json("get", "pvc", "-l", "app=demo")
    assert [i["metadata"]["name"] for i in listed["items"]] == ["claim1"]
    listed = await kubectl.json("get", "pvc", "-l", "app=other")
    assert listed["items"] == []
    _, out, _ = await kubectl.run(
        "get", "pv", "--field-selector", "metadata.name=pv1", "-o", "name"
    )
    assert out.strip() == "persistentvolume/pv1"
    code, _, err = await kubectl.run("get", "pv", "--field-selector", "spec.x=1", check=False)
    assert code != 0
    assert "field label not supported: spec.x" in err

    _, out, _ = await kubectl.run("get", "pvc")
    header, row = out.splitlines()[:2]
    assert header.split()[:5] == ["NAME", "STATUS", "VOLUME", "CAPACITY", "ACCESS"]
    assert row.split()[:3] == ["claim1", "Pending", "fast"]
    _, out, _ = await kubectl.run("get", "pv")
    assert out.splitlines()[1].split()[:5] == ["pv1", "2Gi", "RWO", "Retain", "Pending"]
    _, out, _ = await kubectl.run("get", "sc")
    assert out.splitlines()[1].split()[:4] == [
        "fast",
        "example.com/hostpath",
        "Delete",
        "Immediate",
    ]

    _, out, _ = await kubectl.run("api-resources")
    lines = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert "pvc" in lines["persistentvolumeclaims"]
    assert "storage.k8s.io/v1" in lines["volumeattachments"]


async def test_patch_annotate_label_replace(kubectl: Kubectl) -> None:
    await kubectl.run("create", "-f", str(kubectl.tmp / "objs.yaml"))
    await kubectl.patch("pvc claim1", "merge", '{"metadata":{"annotations":{"m":"1"}}}')
    await kubectl.patch(
        "pvc claim1",
        "json",
        '[{"op":"add","path":"/metadata/finalizers","value":["example.com/a"]}]',
    )
    await kubectl.patch("pvc claim1", "strategic", '{"metadata":{"finalizers":["example.com/b"]}}')
    await kubectl.run("annotate", "pvc", "claim1", "note=hello")
    await kubectl.run("label", "pvc", "claim1", "tier=gold")
    claim = await kubectl.json("get", "pvc", "claim1")
    meta = claim["metadata"]
    assert isinstance(meta, dict)
    # strategicpatch puts the patch's items first (normalizeElementOrder), as kube-apiserver
    # does (tests/e2e/test_differential.py, row patch-kinds-finalizers)
    assert meta["finalizers"] == ["example.com/b", "example.com/a"]
    assert meta["annotations"] == {"m": "1", "note": "hello"}
    assert meta["labels"] == {"app": "demo", "tier": "gold"}

    # edit-style replace: get, change, replace with the resourceVersion read
    meta["annotations"]["m"] = "2"
    edited = kubectl.tmp / "edited.json"
    edited.write_text(json.dumps(claim))
    _, out, _ = await kubectl.run("replace", "-f", str(edited))
    assert "replaced" in out
    # replacing again with the now-stale resourceVersion is a conflict
    code, _, err = await kubectl.run("replace", "-f", str(edited), check=False)
    assert code != 0
    assert "the object has been modified" in err
    code, _, err = await kubectl.patch(
        "pvc claim1", "json", '[{"op":"test","path":"/metadata/name","value":"x"}]', check=False
    )
    assert code != 0


async def test_delete_waits_for_finalizers(kubectl: Kubectl) -> None:
    await kubectl.run("create", "-f", str(kubectl.tmp / "objs.yaml"))
    await kubectl.patch("pv pv1", "merge", '{"metadata":{"finalizers":["example.com/hold"]}}')
    deleting = await kubectl.start("delete", "pv", "pv1", "--timeout=15s")
    try:

        async def deletion_timestamp() -> str:
            _, out, _ = await kubectl.run(
                "get", "pv", "pv1", "-o", "jsonpath={.metadata.deletionTimestamp}"
            )
            return out.strip()

        await testing.eventually(
            deletion_timestamp, timeout=10, message="pv1 to get a deletionTimestamp"
        )
        assert deleting.returncode is None  # still waiting on the finalizer
        await kubectl.patch("pv pv1", "json", '[{"op":"remove","path":"/metadata/finalizers"}]')
        out, err = await asyncio.wait_for(deleting.communicate(), 15)
        assert deleting.returncode == 0, err.decode()
        assert "deleted" in out.decode()
    finally:
        if deleting.returncode is None:
            deleting.kill()
            await deleting.wait()
    code, _, stderr = await kubectl.run("get", "pv", "pv1", check=False)
    assert code != 0
    assert "NotFound" in stderr


async def test_get_watch(kubectl: Kubectl) -> None:
    await kubectl.run("create", "-f", str(kubectl.tmp / "objs.yaml"))
    watcher = await kubectl.start("get", "pvc", "-w", "--request-timeout=20s")
    assert watcher.stdout is not None
    seen: list[str] = []
    try:

        async def until(word: str) -> None:
            while not any(word in line for line in seen):
                raw = await asyncio.wait_for(watcher.stdout.readline(), 15)  # type: ignore[union-attr]
                assert raw, f"watch ended before {word!r}: {seen}"
                seen.append(raw.decode())

        await until("claim1")
        await kubectl.run("label", "pvc", "claim1", "seen=yes")
        await kubectl.run("delete", "pvc", "claim1", "--wait=false")
        # the label change and the deletion both print a row for claim1
        while sum("claim1" in line for line in seen) < 3:
            raw = await asyncio.wait_for(watcher.stdout.readline(), 15)
            assert raw
            seen.append(raw.decode())
        assert seen[0].split()[0] == "NAME"
    finally:
        watcher.kill()
        await watcher.wait()


LIST_MANIFEST = """\
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: ConfigMap
  metadata: {name: listed-a, namespace: default}
  data: {a: "1"}
- apiVersion: v1
  kind: ConfigMap
  metadata: {name: listed-b, namespace: default}
"""


async def test_kind_list_needs_validate_false(kubectl: Kubectl) -> None:
    """Documented limitation (docs/testing.md): kubectl validates a ``kind: List`` document
    against the protobuf OpenAPI v2 document (/openapi/v2), which the in-memory server does
    not serve, so ``create -f`` refuses it; with ``--validate=false`` it creates every item
    (kube-apiserver accepts it either way; multi-document YAML works everywhere)."""
    path = kubectl.tmp / "list.yaml"
    path.write_text(LIST_MANIFEST)
    code, _, err = await kubectl.run("create", "-f", str(path), check=False)
    assert code != 0
    assert "error validating data: the server could not find the requested resource" in err
    _, out, _ = await kubectl.run("create", "-f", str(path), "--validate=false")
    assert "configmap/listed-a created" in out
    assert "configmap/listed-b created" in out

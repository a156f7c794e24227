"""Hostile input to the controllers (issue 11, "Hostile input").

hypothesis generates claims, classes, PVs and VolumeAttachments with odd sizes (``1Zi``,
``-1Gi``, ``0``, ``1e3``, ``999999999999Ei``), missing fields, unicode, very long names and
JSON of unexpected types. The in-memory server validates like the real one (quantities
included), so what it would refuse is handed to the controllers directly — through their
decision functions, informer handlers and ``sync_claim`` / ``sync_volume`` — as a buggy or
hostile server could deliver it. Asserted: nothing crashes, no provisioning happens for an
invalid claim, and each refusal is a ``ProvisioningFailed`` event saying why.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes_asyncio.client import ApiClient
from rel_support import (
    PROVISIONER,
    Backend,
    BackendProvisioner,
    create_class,
    create_namespace,
    fast_options,
    running,
    unique,
)

from pyprovlib.controller._attach import AttachController, should_enqueue_va_change
from pyprovlib.controller._provision import (
    ANN_STORAGE_PROVISIONER,
    ClassNotFoundError,
    ProvisionController,
    claim_is_block,
    claim_reference,
    claim_wants_provisioning,
    desired_finalizers,
    get_claim_class,
    is_provisioner_for_volume,
    volume_should_delete,
)
from pyprovlib.kube._informer import DeletedFinalStateUnknown
from pyprovlib.testing._server import ApiServer

ODD_SIZES = [
    "1Zi",
    "-1Gi",
    "0",
    "1e3",
    "999999999999Ei",
    "1Gi",
    "1.5Gi",
    "0.1",
    "1m",
    "-0",
    " 1Gi",
    "1gi",
    "\u0661Gi",
    "",
    "Gi",
    "1e999999",
    "1" * 400,
]
json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10)
any_json = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=10,
)
odd_text = st.sampled_from(["", "é", "\x00", "a" * 300, "../..", "名前", "\u202e"]) | st.text(
    max_size=20
)
sizes = st.sampled_from(ODD_SIZES) | any_json


def maybe(value: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.just(_MISSING), value, any_json)


_MISSING = object()


def build(fields: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not _MISSING}


claim_specs = st.builds(
    lambda modes, size, volume_mode, selector, volume_name, requests_shape: build(
        {
            "accessModes": modes,
            "resources": (
                {"requests": {"storage": size}} if requests_shape == "ok" else requests_shape
            ),
            "volumeMode": volume_mode,
            "selector": selector,
            "volumeName": volume_name,
        }
    ),
    maybe(st.just(["ReadWriteOnce"])),
    sizes,
    maybe(st.sampled_from(["Filesystem", "Block", "Weird"])),
    st.sampled_from([_MISSING, _MISSING, None, {"matchLabels": {"a": "b"}}]) | any_json,
    st.sampled_from([_MISSING, _MISSING, ""]) | any_json,
    st.sampled_from(["ok", "ok", "ok"]) | any_json,
)
claims = st.builds(
    lambda meta_extra, spec, status, kind: build(
        {
            "apiVersion": "v1",
            "kind": kind,
            "metadata": meta_extra,
            "spec": spec,
            "status": status,
        }
    ),
    st.fixed_dictionaries(
        {},
        optional={
            "labels": st.dictionaries(odd_text, odd_text, max_size=2) | any_json,
            "annotations": st.dictionaries(odd_text, odd_text, max_size=2) | any_json,
            "finalizers": any_json,
        },
    ),
    st.one_of(claim_specs, any_json),
    maybe(st.fixed_dictionaries({"phase": st.sampled_from(["Pending", "Bound", "Lost"])})),
    st.sampled_from(["PersistentVolumeClaim", "Nonsense"]) | any_json,
)
volumes = st.builds(
    lambda meta, spec, status: build({"metadata": meta, "spec": spec, "status": status}),
    st.fixed_dictionaries(
        {"name": odd_text},
        optional={
            "annotations": st.dictionaries(
                st.sampled_from(
                    ["pv.kubernetes.io/provisioned-by", "pv.kubernetes.io/migrated-to", "x"]
                ),
                st.sampled_from([PROVISIONER, "other"]) | any_json,
                max_size=2,
            )
            | any_json,
            "finalizers": any_json,
            "deletionTimestamp": st.sampled_from(["2024-01-01T00:00:00Z"]) | any_json,
            "uid": odd_text | any_json,
        },
    )
    | any_json,
    st.fixed_dictionaries(
        {},
        optional={
            "persistentVolumeReclaimPolicy": st.sampled_from(["Delete", "Retain"]) | any_json,
            "capacity": st.fixed_dictionaries({"storage": sizes}) | any_json,
            "csi": st.fixed_dictionaries({"driver": st.sampled_from([PROVISIONER])}) | any_json,
            "claimRef": any_json,
            "storageClassName": odd_text | any_json,
        },
    )
    | any_json,
    maybe(st.fixed_dictionaries({"phase": st.sampled_from(["Released", "Bound", "Failed"])})),
)
classes = st.builds(
    lambda provisioner, binding, params, mount: build(
        {
            "metadata": {"name": "c"},
            "provisioner": provisioner,
            "volumeBindingMode": binding,
            "parameters": params,
            "mountOptions": mount,
        }
    ),
    st.sampled_from([PROVISIONER, "other"]) | any_json,
    maybe(st.sampled_from(["Immediate", "WaitForFirstConsumer"])),
    maybe(st.dictionaries(odd_text, odd_text, max_size=3)),
    maybe(st.lists(odd_text, max_size=2)),
)

_QUANTITY = re.compile(
    r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
)


def storage_is_valid(claim: dict[str, Any]) -> bool:
    """The oracle: what a real API server accepts as a claim's storage request (a well-formed
    quantity greater than zero), written independently of pyprovlib's parser."""
    spec = claim.get("spec")
    resources = spec.get("resources") if isinstance(spec, dict) else None
    requests = resources.get("requests") if isinstance(resources, dict) else None
    size = requests.get("storage") if isinstance(requests, dict) else None
    if not isinstance(size, str) or not _QUANTITY.match(size):
        return False
    number = re.match(r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)", size)
    assert number is not None
    return float(number.group(0)) > 0


def assert_not_a_crash(err: Exception) -> None:
    """A retryable failure is fine; a programming error (TypeError, KeyError, ...) escaping
    from the controller's own code is a crash."""
    assert not isinstance(err, (TypeError, KeyError, AttributeError, IndexError)), repr(err)


# --- pure decision functions -------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(claim=st.one_of(claims, any_json.filter(lambda v: isinstance(v, dict))), sc=classes)
def test_claim_decisions_never_crash(claim: dict[str, Any], sc: dict[str, Any]) -> None:
    get_claim_class(claim)
    claim_is_block(claim)
    for storage_class in (sc, None):
        try:
            claim_wants_provisioning(claim, storage_class, {PROVISIONER})
        except ClassNotFoundError:
            assert storage_class is None
    if isinstance(claim.get("metadata"), dict):
        claim_reference(claim)


@settings(max_examples=300, deadline=None)
@given(volume=st.one_of(volumes, any_json.filter(lambda v: isinstance(v, dict))))
def test_volume_decisions_never_crash(volume: dict[str, Any]) -> None:
    is_provisioner_for_volume(volume, {PROVISIONER})
    for add in (True, False):
        volume_should_delete(volume, add)
        desired_finalizers(volume, add)


# --- the provisioning controller, running, handed hostile claims -----------------------------

_serial = itertools.count()


class Harness:
    def __init__(
        self, server: ApiServer, client: ApiClient, controller: ProvisionController, ns: str
    ) -> None:
        self.server = server
        self.client = client
        self.controller = controller
        self.ns = ns
        self.provisioner: BackendProvisioner = controller.provisioner  # type: ignore[assignment]
        self.class_name = ""


@pytest_asyncio.fixture
async def harness() -> AsyncIterator[Harness]:
    async with ApiServer(binder=True) as server, server.api_client() as client:
        ns = unique("hostile")
        await create_namespace(client, ns)
        controller = ProvisionController(
            client, PROVISIONER, BackendProvisioner(Backend()), fast_options()
        )
        async with running(controller):
            async with asyncio.timeout(10):
                while not controller.ready():
                    await asyncio.sleep(0.02)
            h = Harness(server, client, controller, ns)
            h.class_name = await create_class(client, PROVISIONER, reclaimPolicy="Delete")
            async with asyncio.timeout(10):
                while controller.class_informer.store.get_by_key(h.class_name) is None:
                    await asyncio.sleep(0.02)
            yield h


async def wait_event(h: Harness, claim_name: str, reason: str) -> list[str]:
    for _ in range(100):
        messages = [
            e.get("message", "")
            for e in h.server.storage.list("events", h.ns)
            if e.get("involvedObject", {}).get("name") == claim_name and e.get("reason") == reason
        ]
        if messages:
            return messages
        await asyncio.sleep(0.02)
    return []


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(claim=claims, sc=classes, size=st.sampled_from(ODD_SIZES))
async def test_hostile_claims_are_refused_with_a_reason(
    harness: Harness, claim: dict[str, Any], sc: dict[str, Any], size: str
) -> None:
    h = harness
    n = next(_serial)
    class_name = h.class_name
    # Make the claim ours, so that every check past "is it for us" is exercised.
    claim_name = f"hostile-{n}"
    meta = claim.setdefault("metadata", {})
    if not isinstance(meta, dict):
        claim["metadata"] = meta = {}
    annotations = meta.get("annotations")
    if not isinstance(annotations, dict):
        meta["annotations"] = annotations = {}
    annotations[ANN_STORAGE_PROVISIONER] = PROVISIONER
    meta.update(name=claim_name, namespace=h.ns, uid=f"00000000-0000-0000-0000-{n:012d}")
    spec = claim.get("spec")
    if isinstance(spec, dict):
        spec["storageClassName"] = class_name
        resources = spec.get("resources")
        if isinstance(resources, dict) and isinstance(resources.get("requests"), dict):
            resources["requests"]["storage"] = size
    calls_before = h.provisioner.calls
    try:
        await h.controller.sync_claim(claim)
    except ClassNotFoundError:
        pass
    except Exception as err:
        assert_not_a_crash(err)
    provisioned = h.provisioner.calls > calls_before
    if not storage_is_valid(claim):
        assert not provisioned, f"provisioned an invalid claim: {claim}"
        if isinstance(spec, dict) and not spec.get("volumeName"):
            messages = await wait_event(h, claim_name, "ProvisioningFailed")
            assert messages, f"no ProvisioningFailed event for {claim}"


async def test_odd_sizes_each_get_an_event_naming_the_problem(harness: Harness) -> None:
    h = harness
    class_name = h.class_name
    for n, size in enumerate(ODD_SIZES):
        claim = {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {
                "name": f"odd-{n}",
                "namespace": h.ns,
                "uid": f"11111111-0000-0000-0000-{n:012d}",
                "annotations": {ANN_STORAGE_PROVISIONER: PROVISIONER},
            },
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": class_name,
                "resources": {"requests": {"storage": size}},
            },
        }
        before = h.provisioner.calls
        try:
            await h.controller.sync_claim(claim)
        except Exception as err:
            assert_not_a_crash(err)
        if h.provisioner.calls == before + 1:
            assert storage_is_valid(claim), f"provisioned for {size!r}"
            continue
        # Refused: invalid, or valid but beyond what Kubernetes can represent (> int64 bytes).
        assert not storage_is_valid(claim) or len(size) > 12 or "e9" in size, size
        messages = await wait_event(h, f"odd-{n}", "ProvisioningFailed")
        assert messages, f"no event for storage {size!r}"
        shown = size if len(size) < 50 else size[:20]
        assert any(
            "invalid" in m or "negative" in m or "larger" in m or shown in m for m in messages
        ), (size, messages)


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(volume=volumes)
async def test_hostile_volumes_never_crash_and_foreign_ones_are_left_alone(
    harness: Harness, volume: dict[str, Any]
) -> None:
    h = harness
    backend = h.provisioner.backend
    backend.assets["pvc-sentinel"] = {"size": "1Gi"}
    try:
        await h.controller.sync_volume(volume)
    except Exception as err:
        assert_not_a_crash(err)
    if not is_provisioner_for_volume(volume, {PROVISIONER}):
        assert "pvc-sentinel" in backend.assets
    # The informer handlers take anything.
    h.controller._enqueue_volume(volume) if isinstance(volume.get("metadata"), dict) else None


# --- the attacher's handlers ------------------------------------------------------------------

vas = st.builds(
    lambda meta, spec, status: build({"metadata": meta, "spec": spec, "status": status}),
    st.fixed_dictionaries(
        {"name": odd_text},
        optional={"finalizers": any_json, "deletionTimestamp": any_json, "annotations": any_json},
    ),
    st.fixed_dictionaries(
        {},
        optional={
            "attacher": st.sampled_from(["attach.test", "other"]) | any_json,
            "nodeName": odd_text | any_json,
            "source": st.fixed_dictionaries(
                {},
                optional={
                    "persistentVolumeName": odd_text | any_json,
                    "inlineVolumeSpec": any_json,
                },
            )
            | any_json,
        },
    )
    | any_json,
    maybe(
        st.fixed_dictionaries(
            {},
            optional={
                "attached": any_json,
                "attachError": any_json,
                "detachError": any_json,
                "attachmentMetadata": any_json,
            },
        )
    ),
)


@pytest_asyncio.fixture
async def attach_controller() -> AsyncIterator[AttachController]:
    async with ApiServer() as server, server.api_client() as client:
        yield AttachController(client, "attach.test", None)


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(old=vas, new=vas)
async def test_attacher_handlers_take_hostile_volume_attachments(
    attach_controller: AttachController, old: dict[str, Any], new: dict[str, Any]
) -> None:
    c = attach_controller
    should_enqueue_va_change(old, new)
    c._va_added(new)
    c._va_updated(old, new)
    c._va_deleted(new)
    c._va_deleted(DeletedFinalStateUnknown("x", old))
    c._pv_changed(new)


@pytest.mark.parametrize("requests", [{"storage": "0"}, {"storage": "0Gi"}, {}])
async def test_zero_or_missing_storage_request_is_refused(
    harness: Harness, requests: dict[str, str]
) -> None:
    h = harness
    n = next(_serial)
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": f"zero-{n}",
            "namespace": h.ns,
            "uid": f"22222222-0000-0000-0000-{n:012d}",
            "annotations": {ANN_STORAGE_PROVISIONER: PROVISIONER},
        },
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": h.class_name,
            "resources": {"requests": requests},
        },
    }
    with contextlib.suppress(Exception):
        await h.controller.sync_claim(claim)
    assert h.provisioner.calls == 0, f"provisioned a claim requesting {requests}"
    assert await wait_event(h, f"zero-{n}", "ProvisioningFailed")

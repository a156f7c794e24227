"""Unit tests of the ProvisionController's pure decisions, ported from upstream's
controller_test.go tables (TestShouldProvision, TestShouldDelete, TestShouldDeleteWithFinalizer,
TestIsProvisionerForVolume, TestRemoveFinalizer, TestAddFinalizer, TestCanProvision's volume
modes) plus the PV the controller completes, the slow set and infeasible-error detection."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from pyprovlib._provisioner import ProvisioningError, ProvisioningState
from pyprovlib.controller._provision import (
    ANN_BETA_STORAGE_CLASS,
    ANN_BETA_STORAGE_PROVISIONER,
    ANN_DYNAMICALLY_PROVISIONED,
    ANN_MIGRATED_TO,
    ANN_SELECTED_NODE,
    ANN_STORAGE_PROVISIONER,
    FINALIZER_PV,
    ClassNotFoundError,
    InfeasibleError,
    SlowSet,
    add_finalizer,
    claim_is_block,
    claim_reference,
    claim_wants_provisioning,
    complete_volume,
    desired_finalizers,
    get_claim_class,
    is_infeasible_error,
    is_provisioner_for_volume,
    remove_finalizer,
    volume_should_delete,
)
from pyprovlib.controller._volume_store import event_target
from pyprovlib.kube._clock import FakeClock

NAMES = frozenset({"foo.bar/baz"})
TIMESTAMP = "2026-01-01T00:00:00Z"


def new_class(
    name: str = "class-1", provisioner: str = "foo.bar/baz", **extra: Any
) -> dict[str, Any]:
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": name, "uid": f"uid-{name}"},
        "provisioner": provisioner,
        "reclaimPolicy": "Delete",
        **extra,
    }


def new_claim(
    name: str = "claim-1",
    uid: str = "uid-1-1",
    class_name: str = "class-1",
    provisioner: str = "foo.bar/baz",
    volume_name: str = "",
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    ann: dict[str, str] = {}
    if provisioner:
        ann[ANN_BETA_STORAGE_PROVISIONER] = provisioner
    ann.update(annotations or {})
    spec: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce", "ReadOnlyMany"],
        "resources": {"requests": {"storage": "1Mi"}},
        "storageClassName": class_name,
    }
    if volume_name:
        spec["volumeName"] = volume_name
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": name,
            "namespace": "default",
            "uid": uid,
            "resourceVersion": "7",
            "annotations": ann,
        },
        "spec": spec,
        "status": {"phase": "Pending"},
    }


def new_volume(
    phase: str = "Released",
    policy: str = "Delete",
    annotations: dict[str, str] | None = None,
    finalizers: list[str] | None = None,
    deletion_timestamp: str | None = None,
    csi_driver: str | None = None,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "volume-1", "uid": "pv-uid"}
    if annotations is not None:
        metadata["annotations"] = annotations
    if finalizers is not None:
        metadata["finalizers"] = finalizers
    if deletion_timestamp:
        metadata["deletionTimestamp"] = deletion_timestamp
    spec: dict[str, Any] = {
        "persistentVolumeReclaimPolicy": policy,
        "accessModes": ["ReadWriteOnce"],
        "capacity": {"storage": "1Mi"},
    }
    if csi_driver:
        spec["csi"] = {"driver": csi_driver, "volumeHandle": "h-1"}
    else:
        spec["nfs"] = {"server": "foo", "path": "bar"}
    return {"metadata": metadata, "spec": spec, "status": {"phase": phase}}


WAIT = {"volumeBindingMode": "WaitForFirstConsumer"}


@pytest.mark.parametrize(
    ("case", "names", "klass", "claim", "expected"),
    [
        ("by provisioner name", NAMES, new_class(), new_claim(), True),
        (
            "by additional provisioner name",
            frozenset({"csi.com/mock-csi", "foo.bar/baz", "foo.xyz/baz"}),
            new_class(),
            new_claim(),
            True,
        ),
        ("already bound", NAMES, new_class(), new_claim(volume_name="foo"), False),
        (
            "not this provisioner's job",
            NAMES,
            new_class(provisioner="abc.def/ghi"),
            new_claim(provisioner="abc.def/ghi"),
            False,
        ),
        (
            "unknown beta annotation",
            NAMES,
            new_class(),
            new_claim(provisioner="", annotations={ANN_BETA_STORAGE_PROVISIONER: "abc.def/ghi"}),
            False,
        ),
        ("no annotation", NAMES, new_class(), new_claim(provisioner=""), False),
        (
            "unknown GA annotation",
            NAMES,
            new_class(),
            new_claim(provisioner="", annotations={ANN_STORAGE_PROVISIONER: "abc.def/ghi"}),
            False,
        ),
        (
            "GA annotation wins over beta",
            NAMES,
            new_class(),
            new_claim(annotations={ANN_STORAGE_PROVISIONER: "abc.def/ghi"}),
            False,
        ),
        (
            "WaitForFirstConsumer without selected node",
            NAMES,
            new_class(**WAIT),
            new_claim(),
            False,
        ),
        (
            "WaitForFirstConsumer with selected node (beta annotation)",
            NAMES,
            new_class(**WAIT),
            new_claim(annotations={ANN_SELECTED_NODE: "node1"}),
            True,
        ),
        (
            "WaitForFirstConsumer with selected node (GA annotation)",
            NAMES,
            new_class(**WAIT),
            new_claim(
                provisioner="",
                annotations={ANN_STORAGE_PROVISIONER: "foo.bar/baz", ANN_SELECTED_NODE: "node1"},
            ),
            True,
        ),
        (
            "WaitForFirstConsumer with an empty selected node",
            NAMES,
            new_class(**WAIT),
            new_claim(annotations={ANN_SELECTED_NODE: ""}),
            False,
        ),
    ],
)
def test_claim_wants_provisioning(
    case: str, names: frozenset[str], klass: dict[str, Any], claim: dict[str, Any], expected: bool
) -> None:
    assert claim_wants_provisioning(claim, klass, names) is expected, case


def test_claim_of_ours_with_missing_class_raises_naming_the_class() -> None:
    with pytest.raises(ClassNotFoundError, match='StorageClass "class-2" not found') as info:
        claim_wants_provisioning(new_claim(class_name="class-2"), None, NAMES)
    assert info.value.class_name == "class-2"
    assert "storageClassName" in str(info.value)


def test_claim_of_someone_else_with_missing_class_is_just_not_ours() -> None:
    assert not claim_wants_provisioning(new_claim(provisioner="abc.def/ghi"), None, NAMES)


def test_claim_class_prefers_the_beta_annotation() -> None:
    claim = new_claim(class_name="spec-class", annotations={ANN_BETA_STORAGE_CLASS: "ann-class"})
    assert get_claim_class(claim) == "ann-class"
    assert get_claim_class(new_claim(class_name="spec-class")) == "spec-class"
    no_class = new_claim()
    del no_class["spec"]["storageClassName"]
    assert get_claim_class(no_class) == ""
    assert get_claim_class({}) == ""


@pytest.mark.parametrize(("mode", "block"), [(None, False), ("Filesystem", False), ("Block", True)])
def test_claim_is_block(mode: str | None, block: bool) -> None:
    claim = new_claim()
    if mode:
        claim["spec"]["volumeMode"] = mode
    assert claim_is_block(claim) is block


OURS = {ANN_DYNAMICALLY_PROVISIONED: "foo.bar/baz"}


@pytest.mark.parametrize(
    ("case", "volume", "expected"),
    [
        ("should delete", new_volume(annotations=OURS), True),
        ("failed phase", new_volume(phase="Failed", annotations=OURS), False),
        ("still bound", new_volume(phase="Bound", annotations=OURS), False),
        ("retain policy", new_volume(policy="Retain", annotations=OURS), False),
        ("being deleted", new_volume(annotations=OURS, deletion_timestamp=TIMESTAMP), False),
    ],
)
def test_volume_should_delete_without_finalizer_option(
    case: str, volume: dict[str, Any], expected: bool
) -> None:
    assert volume_should_delete(volume, add_finalizer=False) is expected, case


@pytest.mark.parametrize(
    ("case", "volume", "expected"),
    [
        (
            "finalizer, no deletionTimestamp",
            new_volume(annotations=OURS, finalizers=[FINALIZER_PV]),
            True,
        ),
        (
            "finalizer and deletionTimestamp",
            new_volume(annotations=OURS, finalizers=[FINALIZER_PV], deletion_timestamp=TIMESTAMP),
            True,
        ),
        (
            "deletionTimestamp, finalizer already removed",
            new_volume(annotations=OURS, finalizers=[], deletion_timestamp=TIMESTAMP),
            False,
        ),
        (
            "still bound with finalizer",
            new_volume(phase="Bound", annotations=OURS, finalizers=[FINALIZER_PV]),
            False,
        ),
        ("retain policy", new_volume(policy="Retain", annotations=OURS, finalizers=[]), False),
    ],
)
def test_volume_should_delete_with_finalizer_option(
    case: str, volume: dict[str, Any], expected: bool
) -> None:
    assert volume_should_delete(volume, add_finalizer=True) is expected, case


@pytest.mark.parametrize(
    ("case", "names", "volume", "expected"),
    [
        ("known dynamic in-tree", NAMES, new_volume(annotations=OURS), True),
        (
            "known dynamic migrated",
            NAMES,
            new_volume(annotations={**OURS, ANN_MIGRATED_TO: "foo.bar/baz"}),
            True,
        ),
        (
            "unknown dynamic in-tree",
            frozenset({"foo.bar1/baz1"}),
            new_volume(annotations=OURS),
            False,
        ),
        (
            "unknown dynamic migrated",
            frozenset({"foo.bar1/baz1"}),
            new_volume(annotations={**OURS, ANN_MIGRATED_TO: "foo.bar/baz"}),
            False,
        ),
        (
            "migrated to us although provisioned by the in-tree plugin",
            frozenset({"csi.driver"}),
            new_volume(annotations={**OURS, ANN_MIGRATED_TO: "csi.driver"}),
            True,
        ),
        ("known dynamic csi", NAMES, new_volume(annotations=OURS, csi_driver="foo.bar/baz"), True),
        (
            "unknown dynamic csi",
            frozenset({"foo.bar1/baz1"}),
            new_volume(annotations=OURS, csi_driver="foo.bar/baz"),
            False,
        ),
        ("known static csi", NAMES, new_volume(csi_driver="foo.bar/baz"), True),
        (
            "unknown static csi",
            frozenset({"foo.bar1/baz1"}),
            new_volume(csi_driver="foo.bar/baz"),
            False,
        ),
        ("static in-tree is never ours", NAMES, new_volume(), False),
        (
            "known static migrated",
            NAMES,
            new_volume(annotations={ANN_MIGRATED_TO: "foo.bar/baz"}),
            True,
        ),
        (
            "unknown static migrated",
            frozenset({"foo.bar1/baz1"}),
            new_volume(annotations={ANN_MIGRATED_TO: "foo.bar/baz"}),
            False,
        ),
    ],
)
def test_is_provisioner_for_volume(
    case: str, names: frozenset[str], volume: dict[str, Any], expected: bool
) -> None:
    assert is_provisioner_for_volume(volume, names) is expected, case


@pytest.mark.parametrize(
    ("before", "after", "modified"),
    [
        ([FINALIZER_PV], None, True),
        (["dummy"], ["dummy"], False),
        (["dummy", FINALIZER_PV], ["dummy"], True),
        ([], None, False),
        (None, None, False),
    ],
)
def test_remove_finalizer(
    before: list[str] | None, after: list[str] | None, modified: bool
) -> None:
    original = copy.deepcopy(before)
    result, changed = remove_finalizer(before, FINALIZER_PV)
    assert (result, changed) == (after, modified)
    assert before == original  # the input is never modified


@pytest.mark.parametrize(
    ("before", "after", "modified"),
    [
        ([FINALIZER_PV], [FINALIZER_PV], False),
        (None, [FINALIZER_PV], True),
        ([], [FINALIZER_PV], True),
        (["dummy"], ["dummy", FINALIZER_PV], True),
    ],
)
def test_add_finalizer(before: list[str] | None, after: list[str], modified: bool) -> None:
    assert add_finalizer(before, FINALIZER_PV) == (after, modified)


@pytest.mark.parametrize(
    ("case", "volume", "option", "expected"),
    [
        (
            "added to a bound Delete PV",
            new_volume(phase="Bound", annotations=OURS),
            True,
            [FINALIZER_PV],
        ),
        (
            "kept when present",
            new_volume(phase="Bound", annotations=OURS, finalizers=[FINALIZER_PV]),
            True,
            None,
        ),
        (
            "not added while being deleted",
            new_volume(annotations=OURS, deletion_timestamp=TIMESTAMP),
            True,
            None,
        ),
        ("not added to a Released PV", new_volume(annotations=OURS), True, None),
        (
            "removed when the option is off",
            new_volume(phase="Bound", annotations=OURS, finalizers=[FINALIZER_PV]),
            False,
            [],
        ),
        (
            "removed from Retain PVs",
            new_volume(
                phase="Bound", policy="Retain", annotations=OURS, finalizers=["x", FINALIZER_PV]
            ),
            True,
            ["x"],
        ),
        (
            "removed from Recycle PVs",
            new_volume(
                phase="Bound", policy="Recycle", annotations=OURS, finalizers=[FINALIZER_PV]
            ),
            True,
            [],
        ),
        ("nothing to remove", new_volume(phase="Bound", annotations=OURS), False, None),
        (
            "added to migrated static volume",
            new_volume(phase="Bound", annotations={ANN_MIGRATED_TO: "foo.bar/baz"}),
            True,
            [FINALIZER_PV],
        ),
    ],
)
def test_desired_finalizers(
    case: str, volume: dict[str, Any], option: bool, expected: list[str] | None
) -> None:
    assert desired_finalizers(volume, option) == expected, case


def test_claim_reference_carries_uid_and_resource_version() -> None:
    assert claim_reference(new_claim()) == {
        "kind": "PersistentVolumeClaim",
        "apiVersion": "v1",
        "namespace": "default",
        "name": "claim-1",
        "uid": "uid-1-1",
        "resourceVersion": "7",
    }


def test_complete_volume_fills_in_what_the_controller_owns() -> None:
    volume: dict[str, Any] = {
        "metadata": {"name": "pvc-uid-1-1"},
        "spec": {"hostPath": {"path": "/x"}},
    }
    klass = new_class(reclaimPolicy="Retain", mountOptions=["ro", "noatime"])
    out = complete_volume(
        volume, claim=new_claim(), storage_class=klass, add_finalizer_enabled=True
    )
    assert out is volume
    assert out["metadata"]["annotations"] == {ANN_DYNAMICALLY_PROVISIONED: "foo.bar/baz"}
    assert out["metadata"]["finalizers"] == [FINALIZER_PV]
    assert out["spec"]["claimRef"]["uid"] == "uid-1-1"
    assert out["spec"]["storageClassName"] == "class-1"
    assert out["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
    assert out["spec"]["mountOptions"] == ["ro", "noatime"]


def test_complete_volume_keeps_what_the_provisioner_chose() -> None:
    volume: dict[str, Any] = {
        "metadata": {"name": "v", "annotations": {"mine": "1"}, "finalizers": ["other"]},
        "spec": {"persistentVolumeReclaimPolicy": "Delete", "mountOptions": ["rw"]},
    }
    klass = new_class(reclaimPolicy="Retain", mountOptions=["ro"])
    del klass["reclaimPolicy"]
    out = complete_volume(
        volume, claim=new_claim(), storage_class=klass, add_finalizer_enabled=False
    )
    assert out["metadata"]["annotations"] == {
        "mine": "1",
        ANN_DYNAMICALLY_PROVISIONED: "foo.bar/baz",
    }
    assert out["metadata"]["finalizers"] == ["other"]
    assert out["spec"]["persistentVolumeReclaimPolicy"] == "Delete"
    assert out["spec"]["mountOptions"] == ["rw"]


def test_complete_volume_defaults_reclaim_policy_to_delete() -> None:
    klass = new_class()
    del klass["reclaimPolicy"]
    out = complete_volume({}, claim=new_claim(), storage_class=klass, add_finalizer_enabled=False)
    assert out["spec"]["persistentVolumeReclaimPolicy"] == "Delete"
    assert "mountOptions" not in out["spec"]


def _raise_like_the_csi_provisioner() -> None:
    try:
        raise GRPCError(Status.INVALID_ARGUMENT, "bad")
    except GRPCError:
        raise ProvisioningError("rpc error: bad") from None


def test_infeasible_errors() -> None:
    assert is_infeasible_error(InfeasibleError("bad parameter"))
    assert is_infeasible_error(GRPCError(Status.INVALID_ARGUMENT, "bad"))
    wrapped = ProvisioningError("driver refused")
    wrapped.__cause__ = GRPCError(Status.INVALID_ARGUMENT, "bad")
    assert is_infeasible_error(wrapped)
    # The CSI provisioner raises ``ProvisioningError(...) from None`` inside its handler.
    with pytest.raises(ProvisioningError) as hidden:
        _raise_like_the_csi_provisioner()
    assert is_infeasible_error(hidden.value)
    assert not is_infeasible_error(GRPCError(Status.INTERNAL, "oops"))
    assert not is_infeasible_error(ProvisioningError("x", ProvisioningState.IN_BACKGROUND))
    assert not is_infeasible_error(RuntimeError("x"))
    assert InfeasibleError("x").state is ProvisioningState.FINISHED


async def test_slow_set_holds_claims_for_the_retry_interval() -> None:
    clock = FakeClock()
    slow = SlowSet(300.0, clock)
    assert slow.time_remaining("a") == 0.0
    assert "a" not in slow
    slow.add("a", "class-uid")
    assert "a" in slow
    assert slow.class_uid("a") == "class-uid"
    await clock.advance(100)
    assert slow.time_remaining("a") == pytest.approx(200.0)
    await clock.advance(200)
    assert "a" not in slow
    assert slow.class_uid("a") is None
    slow.add("b", "u")
    slow.remove("b")
    assert "b" not in slow


def test_event_target_adds_the_type_list_items_lack() -> None:
    item = {"metadata": {"name": "c", "namespace": "ns", "uid": "u"}}
    target = event_target(item, "PersistentVolumeClaim")
    assert target["kind"] == "PersistentVolumeClaim"
    assert target["apiVersion"] == "v1"
    assert "kind" not in item  # the cached object is never modified
    complete = {"kind": "PersistentVolume", "apiVersion": "v1", "metadata": {"name": "v"}}
    assert event_target(complete, "PersistentVolume") is complete

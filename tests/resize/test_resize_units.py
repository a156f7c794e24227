"""Pure pieces of the resizer: condition merging, which claim updates are looked at, which
claims need a resize, error classification, options and names."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes_asyncio.client import (
    V1HostPathVolumeSource,
    V1PersistentVolume,
    V1PersistentVolumeSpec,
)

from pyprovlib._attacher import GrpcCode
from pyprovlib._resizer import NotExpandable, ResizeError
from pyprovlib.controller._resize import (
    ANN_STORAGE_RESIZER,
    ResizeController,
    expansion_target,
    merge_resize_conditions,
    should_enqueue_pvc_change,
)
from pyprovlib.controller._resize.options import (
    InvalidResizeOptionsError,
    ResizeControllerOptions,
    lease_name,
)


def claim(
    request: str = "2Gi",
    capacity: str | None = "1Gi",
    *,
    rv: str = "1",
    phase: str = "Bound",
    volume: str = "pv-1",
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if capacity is not None:
        status["capacity"] = {"storage": capacity}
    return {
        "metadata": {
            "name": "c",
            "namespace": "ns",
            "resourceVersion": rv,
            "annotations": annotations or {},
        },
        "spec": {"resources": {"requests": {"storage": request}}, "volumeName": volume},
        "status": status,
    }


def cond(kind: str, status: str = "True", message: str = "", t: str = "t0") -> dict[str, Any]:
    return {"type": kind, "status": status, "message": message, "lastTransitionTime": t}


def test_merge_keeps_foreign_conditions_and_replaces_resize_ones() -> None:
    old = [cond("Resizing", t="t0"), cond("Other"), cond("ControllerResizeError", message="x")]
    merged = merge_resize_conditions(
        old, [cond("FileSystemResizePending", t="t1")], keep_old_resize_conditions=False
    )
    assert [c["type"] for c in merged] == ["Other", "FileSystemResizePending"]
    kept = merge_resize_conditions(
        old, [cond("FileSystemResizePending", t="t1")], keep_old_resize_conditions=True
    )
    assert [c["type"] for c in kept] == [
        "Resizing",
        "Other",
        "ControllerResizeError",
        "FileSystemResizePending",
    ]


def test_merge_keeps_the_transition_time_of_an_unchanged_condition() -> None:
    merged = merge_resize_conditions(
        [cond("Resizing", t="t0")], [cond("Resizing", t="t9")], keep_old_resize_conditions=False
    )
    assert merged == [cond("Resizing", t="t0")]
    changed = merge_resize_conditions(
        [cond("ControllerResizeError", message="a", t="t0")],
        [cond("ControllerResizeError", message="b", t="t9")],
        keep_old_resize_conditions=True,
    )
    assert changed == [cond("ControllerResizeError", message="b", t="t9")]


def test_merge_with_nothing_new_drops_every_resize_condition() -> None:
    old = [cond("Resizing"), cond("NodeResizeError"), cond("Ready")]
    assert merge_resize_conditions(old, [], keep_old_resize_conditions=False) == [cond("Ready")]


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (claim("1Gi", rv="1"), claim("2Gi", rv="2"), True),  # grew
        (claim("3Gi", rv="1"), claim("2Gi", rv="2"), True),  # lowered: recovery
        (claim("2Gi", rv="1"), claim("2Gi", rv="1"), True),  # resync
        (claim("2Gi", rv="1"), claim("2Gi", rv="2"), False),  # unrelated change
        (claim("2Gi", "1Gi", rv="1"), claim("2Gi", "2Gi", rv="2"), True),  # capacity grew
        (claim("2Gi", "2Gi", rv="1"), claim("2Gi", "1Gi", rv="2"), False),
        (claim(rv="1"), claim(rv="2", annotations={ANN_STORAGE_RESIZER: "x"}), True),
    ],
)
def test_should_enqueue_pvc_change(old: Any, new: Any, expected: bool) -> None:
    assert should_enqueue_pvc_change(old, new) is expected


@pytest.mark.parametrize(
    ("pvc", "expected"),
    [
        (claim("2Gi", "1Gi"), True),
        (claim("2048Mi", "2Gi"), False),
        (claim("1Gi", "2Gi"), False),
        (claim("2Gi", "1Gi", phase="Pending"), False),
        (claim("2Gi", "1Gi", volume=""), False),
        (claim("2Gi", None), True),
    ],
)
def test_claim_needs_resize(pvc: Any, expected: bool) -> None:
    assert ResizeController.claim_needs_resize(pvc) is expected


@pytest.mark.parametrize(
    ("code", "final", "infeasible", "in_use"),
    [
        (GrpcCode.INTERNAL, True, False, False),
        (GrpcCode.OUT_OF_RANGE, True, True, False),
        (GrpcCode.INVALID_ARGUMENT, True, True, False),
        (GrpcCode.NOT_FOUND, True, True, False),
        (GrpcCode.FAILED_PRECONDITION, True, False, True),
        (GrpcCode.DEADLINE_EXCEEDED, False, False, False),
        (GrpcCode.UNAVAILABLE, False, False, False),
        (GrpcCode.ABORTED, False, False, False),
        (None, False, False, False),
    ],
)
def test_resize_error_classification(
    code: int | None, final: bool, infeasible: bool, in_use: bool
) -> None:
    err = ResizeError("m", code=code)
    assert (err.final, err.infeasible, err.in_use) == (final, infeasible, in_use)


def test_resize_error_overrides() -> None:
    err = ResizeError("m", code=GrpcCode.INTERNAL, final=False, infeasible=True, in_use=True)
    assert (err.final, err.infeasible, err.in_use) == (False, True, True)


def test_lease_name_follows_external_resizer() -> None:
    assert lease_name("rbd.csi.ceph.com") == "external-resizer-rbd-csi-ceph-com"
    assert lease_name("pyprovlib.io/hostpath") == "external-resizer-pyprovlib-io-hostpath"
    assert lease_name("driver_") == "external-resizer-driver-X"


def test_options_defaults_and_validation() -> None:
    o = ResizeControllerOptions()
    assert (o.resync_period, o.timeout, o.workers) == (600.0, 10.0, 10)
    assert (o.retry_interval_start, o.retry_interval_max) == (1.0, 300.0)
    assert o.handle_volume_in_use_error is True
    assert (o.lease_duration, o.renew_deadline, o.retry_period) == (15.0, 10.0, 5.0)
    for bad in (
        {"workers": 0},
        {"timeout": 0},
        {"retry_interval_start": 0},
        {"retry_interval_start": 2.0, "retry_interval_max": 1.0},
        {"resync_period": -1},
    ):
        with pytest.raises(InvalidResizeOptionsError):
            ResizeControllerOptions(**bad)


async def test_not_expandable_refuses_everything() -> None:
    backend = NotExpandable("x.io/hostpath", "hostpath volumes are directories")
    pv = V1PersistentVolume(
        spec=V1PersistentVolumeSpec(host_path=V1HostPathVolumeSource(path="/x"))
    )
    assert backend.can_support(pv) is False
    assert backend.unsupported_reason(pv) == "hostpath volumes are directories"
    with pytest.raises(ResizeError, match="directories"):
        await backend.expand(pv, 1)


def state(
    request: str,
    pv_size: str,
    *,
    status: str = "",
    allocated: str | None = None,
    fs_pending: bool = False,
) -> tuple[dict[str, Any], dict[str, Any]]:
    pvc = claim(request, "1Gi")
    if status:
        pvc["status"]["allocatedResourceStatuses"] = {"storage": status}
    if allocated:
        pvc["status"]["allocatedResources"] = {"storage": allocated}
    if fs_pending:
        pvc["status"]["conditions"] = [cond("FileSystemResizePending")]
    return pvc, {"spec": {"capacity": {"storage": pv_size}}}


# Mirrors external-resizer's expand_and_recover_test.go cases.
@pytest.mark.parametrize(
    ("case", "kwargs", "final_error", "expected"),
    [
        ("first expansion", {"request": "10Gi", "pv_size": "1Gi"}, False, "10Gi"),
        (
            "uncertain controller expansion keeps the allocation",
            {
                "request": "5Gi",
                "pv_size": "1Gi",
                "status": "ControllerResizeInProgress",
                "allocated": "10Gi",
            },
            False,
            "10Gi",
        ),
        (
            "final controller error: the lowered request wins",
            {
                "request": "5Gi",
                "pv_size": "1Gi",
                "status": "ControllerResizeInProgress",
                "allocated": "10Gi",
            },
            True,
            "5Gi",
        ),
        (
            "infeasible: the lowered request wins",
            {
                "request": "5Gi",
                "pv_size": "1Gi",
                "status": "ControllerResizeInfeasible",
                "allocated": "10Gi",
            },
            False,
            "5Gi",
        ),
        (
            "node expansion pending at the allocated size: wait for the node",
            {
                "request": "10Gi",
                "pv_size": "5Gi",
                "status": "NodeResizePending",
                "allocated": "5Gi",
            },
            False,
            None,
        ),
        (
            "node expansion pending at a larger allocation: finish it first",
            {
                "request": "10Gi",
                "pv_size": "2Gi",
                "status": "NodeResizePending",
                "allocated": "5Gi",
            },
            False,
            "5Gi",
        ),
        (
            "node expansion infeasible, volume smaller: the allocation",
            {
                "request": "10Gi",
                "pv_size": "2Gi",
                "status": "NodeResizeInfeasible",
                "allocated": "5Gi",
            },
            False,
            "5Gi",
        ),
        (
            "pv expanded, node in progress: kubelet's turn",
            {
                "request": "10Gi",
                "pv_size": "10Gi",
                "status": "NodeResizeInProgress",
                "allocated": "10Gi",
            },
            False,
            None,
        ),
        (
            "pv expanded but not recorded: resume at the allocation",
            {
                "request": "10Gi",
                "pv_size": "10Gi",
                "status": "ControllerResizeInProgress",
                "allocated": "10Gi",
            },
            False,
            "10Gi",
        ),
        (
            "user lowered the request after the pv grew: the allocation",
            {
                "request": "6Gi",
                "pv_size": "10Gi",
                "status": "ControllerResizeInProgress",
                "allocated": "10Gi",
            },
            False,
            "10Gi",
        ),
        (
            "no status, allocation recorded",
            {"request": "10Gi", "pv_size": "10Gi", "allocated": "10Gi"},
            False,
            "10Gi",
        ),
        (
            "old API server: fs resize pending means nothing to do",
            {"request": "10Gi", "pv_size": "10Gi", "fs_pending": True},
            False,
            None,
        ),
        (
            "old API server without the condition: expand again (idempotent)",
            {"request": "10Gi", "pv_size": "10Gi"},
            False,
            "10Gi",
        ),
    ],
)
def test_expansion_target(
    case: str, kwargs: dict[str, Any], final_error: bool, expected: str | None
) -> None:
    pvc, pv = state(**kwargs)
    target = expansion_target(pvc, pv, final_error=final_error)
    assert (str(target) if target is not None else None) == expected, case


def test_expansion_target_node_infeasible_without_control_plane_expansion() -> None:
    pvc, pv = state("10Gi", "10Gi", status="NodeResizeInfeasible", allocated="12Gi")
    assert str(expansion_target(pvc, pv, final_error=False)) == "12Gi"
    target = expansion_target(pvc, pv, final_error=False, supports_control_plane_expansion=False)
    assert str(target) == "10Gi"

"""Pure pieces of the attacher: names (util.go's SanitizeDriverName / GetFinalizerName and the
lease name), shouldEnqueueVAChange, the options' defaults and checks, the Attacher contract."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyprovlib._attacher import Attacher, AttachError, AttachNode, AttachVolume, GrpcCode
from pyprovlib.controller._attach import should_enqueue_va_change
from pyprovlib.controller._attach.options import (
    AttachControllerOptions,
    InvalidAttachOptionsError,
    finalizer_name,
    lease_name,
)
from pyprovlib.controller._sidecar_options import sanitize_driver_name


@pytest.mark.parametrize(
    ("driver", "sanitized"),
    [
        ("hostpath.csi.k8s.io", "hostpath-csi-k8s-io"),
        ("ebs_csi/driver", "ebs-csi-driver"),
        ("plain-name", "plain-name"),
        ("ends.with.dot.", "ends-with-dot-X"),
        ("Mixed123", "Mixed123"),
    ],
)
def test_sanitize_driver_name(driver: str, sanitized: str) -> None:
    assert sanitize_driver_name(driver) == sanitized


def test_finalizer_and_lease_names() -> None:
    assert finalizer_name("csi.example.com") == "external-attacher/csi-example-com"
    assert lease_name("csi.example.com") == "external-attacher-leader-csi-example-com"
    with pytest.raises(ValueError, match="empty"):
        sanitize_driver_name("")


def _va(**status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "va", "resourceVersion": "1", "finalizers": ["f"]},
        "spec": {"attacher": "d", "nodeName": "n", "source": {"persistentVolumeName": "pv"}},
        "status": {"attached": False, **status},
    }


def _bump(va: Mapping[str, Any], rv: str = "2") -> dict[str, Any]:
    new = copy.deepcopy(dict(va))
    new["metadata"]["resourceVersion"] = rv
    return new


def test_resync_is_enqueued() -> None:
    va = _va(attachError={"message": "x", "time": "t"})
    assert should_enqueue_va_change(va, va)


def test_change_without_errors_is_enqueued() -> None:
    old = _va()
    new = _bump(old)
    new["metadata"]["finalizers"] = []
    assert should_enqueue_va_change(old, new)
    # Even a bare resourceVersion bump without any error around is processed.
    assert should_enqueue_va_change(old, _bump(old))


def test_error_only_changes_are_not_enqueued() -> None:
    old = _va()
    new = _bump(old)
    new["status"]["attachError"] = {"message": "boom", "time": "t1", "errorCode": 13}
    new["metadata"]["managedFields"] = [{"manager": "attacher"}]
    assert not should_enqueue_va_change(old, new)
    newer = _bump(new, "3")
    newer["status"]["attachError"] = {"message": "boom again", "time": "t2"}
    assert not should_enqueue_va_change(new, newer)
    detaching = _bump(newer, "4")
    detaching["status"]["detachError"] = {"message": "no", "time": "t3"}
    assert not should_enqueue_va_change(newer, detaching)


def test_error_plus_other_change_is_enqueued() -> None:
    old = _va()
    new = _bump(old)
    new["status"]["attachError"] = {"message": "boom", "time": "t1"}
    new["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert should_enqueue_va_change(old, new)
    cleared = _bump(new, "3")
    del cleared["status"]["attachError"]
    cleared["status"]["attached"] = True
    assert should_enqueue_va_change(new, cleared)


def test_options_defaults_are_external_attachers() -> None:
    o = AttachControllerOptions()
    assert (o.resync_period, o.timeout, o.workers) == (600.0, 15.0, 10)
    assert (o.retry_interval_start, o.retry_interval_max, o.reconcile_sync) == (1.0, 300.0, 60.0)
    assert (o.lease_duration, o.renew_deadline, o.retry_period) == (15.0, 10.0, 5.0)
    assert o.default_fs_type == ""
    assert o.reconcile is None
    assert not o.leader_election


@pytest.mark.parametrize(
    "bad",
    [
        {"workers": 0},
        {"timeout": 0},
        {"retry_interval_start": 0},
        {"retry_interval_start": 10, "retry_interval_max": 1},
        {"reconcile_sync": 0},
        {"resync_period": -1},
    ],
)
def test_options_are_checked(bad: dict[str, Any]) -> None:
    with pytest.raises(InvalidAttachOptionsError):
        AttachControllerOptions(**bad)


class _Minimal(Attacher):
    async def attach(
        self, volume: AttachVolume, node: AttachNode, readonly: bool, context: Mapping[str, str]
    ) -> Mapping[str, str]:
        return {}

    async def detach(self, volume: AttachVolume, node: AttachNode) -> None:
        return None


class _Listing(_Minimal):
    async def list_published(self) -> Mapping[str, list[str]]:
        return {"v": ["n"]}


async def test_list_published_is_optional() -> None:
    assert not _Minimal().supports_list_published
    assert _Listing().supports_list_published
    with pytest.raises(NotImplementedError):
        await _Minimal().list_published()
    assert await _Listing().list_published() == {"v": ["n"]}


def test_attach_error_in_progress_codes() -> None:
    for code in (
        GrpcCode.CANCELLED,
        GrpcCode.DEADLINE_EXCEEDED,
        GrpcCode.UNAVAILABLE,
        GrpcCode.RESOURCE_EXHAUSTED,
        GrpcCode.ABORTED,
    ):
        assert AttachError("x", code=code).in_progress
    final: tuple[int | None, ...] = (GrpcCode.INTERNAL, GrpcCode.NOT_FOUND, None)
    for final_code in final:
        assert not AttachError("x", code=final_code).in_progress
    assert AttachError("x", in_progress=True).in_progress


def test_volume_repr_hides_secrets() -> None:
    volume = AttachVolume("vol", "drv", secrets={"password": "s3cr3t-value"})
    assert "s3cr3t" not in repr(volume)
    assert not volume.is_block
    assert AttachVolume("vol", "drv", volume_mode="Block").is_block


_values = st.one_of(st.none(), st.booleans(), st.text(max_size=5), st.integers(0, 20))
_errors = st.one_of(
    st.none(),
    st.fixed_dictionaries({"message": st.text(max_size=10), "time": st.text(max_size=5)}),
)


def _with_errors(va: dict[str, Any], attach: Any, detach: Any) -> dict[str, Any]:
    out = copy.deepcopy(va)
    for key, value in (("attachError", attach), ("detachError", detach)):
        if value is None:
            out["status"].pop(key, None)
        else:
            out["status"][key] = value
    return out


@given(
    old_attach=_errors,
    old_detach=_errors,
    new_attach=_errors,
    new_detach=_errors,
    field=st.sampled_from(["attached", "attachmentMetadata", "other"]),
    value=_values,
)
def test_should_enqueue_property(
    old_attach: Any, old_detach: Any, new_attach: Any, new_detach: Any, field: str, value: Any
) -> None:
    old = _with_errors(_va(), old_attach, old_detach)
    errors_only = _bump(_with_errors(old, new_attach, new_detach))
    if (old_attach, old_detach) != (new_attach, new_detach) or any(
        e is not None for e in (old_attach, old_detach)
    ):
        # Only the errors (or nothing but the resourceVersion) changed, with errors around.
        assert not should_enqueue_va_change(old, errors_only)
    other = copy.deepcopy(errors_only)
    previous = other["status"].get(field, "<absent>")
    other["status"][field] = value
    if previous != value:
        assert should_enqueue_va_change(old, other)

"""The modify controller's pure decisions: which claim updates need a look, and what to do
with a claim now (external-resizer's ``modify``), row by row."""

from __future__ import annotations

from typing import Any

import pytest

from pyprovlib._modifier import ModifyError, NotModifiable
from pyprovlib.controller._modify import (
    InvalidModifyOptionsError,
    ModifyControllerOptions,
    Step,
    lease_name,
    next_step,
    should_enqueue,
)
from pyprovlib.controller._modify.expectations import ModifyExpectations
from pyprovlib.kube._clock import FakeClock


def pvc(
    spec: str | None = None,
    current: str | None = None,
    status: str | None = None,
    target: str = "",
    *,
    phase: str = "Bound",
    rv: str = "1",
) -> dict[str, Any]:
    st: dict[str, Any] = {"phase": phase}
    if current is not None:
        st["currentVolumeAttributesClassName"] = current
    if status is not None:
        st["modifyVolumeStatus"] = {"status": status, "targetVolumeAttributesClassName": target}
    sp: dict[str, Any] = {"volumeName": "pv"}
    if spec is not None:
        sp["volumeAttributesClassName"] = spec
    return {
        "metadata": {"name": "c", "namespace": "ns", "resourceVersion": rv},
        "spec": sp,
        "status": st,
    }


@pytest.mark.parametrize(
    ("claim", "uncertain", "step"),
    [
        (pvc("gold", "gold"), False, Step.NOTHING),
        (pvc(None, None), False, Step.NOTHING),
        (pvc("", None), False, Step.NOTHING),
        (pvc("silver", "gold"), False, Step.START),
        (pvc("gold", None), False, Step.START),  # first class of a volume provisioned without
        (pvc("gold", "gold", "Infeasible", "bad"), False, Step.START),  # back to the current
        (pvc("gold", "gold", "Pending"), False, Step.START),
        (pvc("silver", "gold", "InProgress", "bronze"), True, Step.CONTINUE),
        (pvc("silver", "gold", "InProgress", "bronze"), False, Step.START),
        (pvc(None, None, "InProgress", "bronze"), False, Step.CONTINUE),
        (pvc(None, None, "Infeasible", "bad"), False, Step.ROLLED_BACK),
        (pvc(None, None, "Pending"), False, Step.ROLLED_BACK),
        (pvc("silver", "gold", "Infeasible", "silver"), True, Step.START),
    ],
)
def test_next_step(claim: dict[str, Any], uncertain: bool, step: Step) -> None:
    assert next_step(claim, uncertain=uncertain) is step


def test_updates_that_need_a_look() -> None:
    assert should_enqueue(pvc("gold", rv="1"), pvc("silver", rv="2"))
    assert should_enqueue(pvc("gold", rv="1"), pvc(None, rv="2"))  # taken back
    assert should_enqueue(pvc("gold", rv="1", phase="Pending"), pvc("gold", rv="2"))
    assert should_enqueue(pvc("gold", rv="5"), pvc("gold", rv="5"))  # resync
    # Our own status writes, and anything else, are not.
    assert not should_enqueue(pvc("gold", rv="1"), pvc("gold", "gold", "InProgress", rv="2"))


async def test_slow_period_starts_once_and_ends() -> None:
    clock = FakeClock()
    slow = ModifyExpectations(clock, slow_period=10.0)
    assert slow.slow_remaining("ns/c") == 0.0
    slow.add_slow("ns/c")
    await clock.advance(4.0)
    slow.add_slow("ns/c")  # a running period is not extended
    assert slow.slow_remaining("ns/c") == pytest.approx(6.0)
    await clock.advance(6.0)
    assert slow.slow_remaining("ns/c") == 0.0


def test_errors_are_final_and_infeasible_by_code() -> None:
    assert ModifyError("x", code=3).infeasible  # InvalidArgument
    assert ModifyError("x", code=3).final
    assert not ModifyError("x", code=11).infeasible  # OutOfRange: infeasible for resize only
    assert not ModifyError("x", code=4).final  # DeadlineExceeded
    assert not ModifyError("x").final
    assert ModifyError("x", detail="y").detail == "y"
    assert not NotModifiable("d", "why").modify_supported


def test_options() -> None:
    options = ModifyControllerOptions()
    assert (options.workers, options.timeout, options.retry_interval_max) == (10, 10.0, 300.0)
    assert options.extra_modify_metadata is False
    assert lease_name("hostpath.csi.k8s.io") == "external-resizer-modify-hostpath-csi-k8s-io"
    with pytest.raises(InvalidModifyOptionsError, match="workers"):
        ModifyControllerOptions(workers=0)

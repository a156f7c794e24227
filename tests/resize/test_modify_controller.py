"""The ModifyController against the API server (``kube_cluster``: in memory, or a real cluster
with ``PYPROVLIB_E2E_KUBECONFIG`` / ``PYPROVLIB_KUBE_ASSETS``) with a Python Modifier: a
VolumeAttributesClass change of a Bound claim reaches the backend once with the class's
parameters and the claim and volume say so; infeasible, failing and uncertain changes,
rollbacks, missing classes and restarts behave as external-resizer's modify controller."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from modify_support import (
    MemoryModifier,
    ModifyScenario,
    condition_types,
    controller,
    made_infeasible,
    modify_state,
)
from resize_support import conditions
from sidecar_support import running, wait_for

from pyprovlib._attacher import GrpcCode
from pyprovlib._modifier import ModifyError, NotModifiable
from pyprovlib.controller._modify import (
    PV_NAME_KEY,
    PVC_NAME_KEY,
    PVC_NAMESPACE_KEY,
    ModifyController,
)
from pyprovlib.testing._cluster import TestCluster

pytestmark = pytest.mark.e2e


@pytest.fixture
def s(kube_cluster: TestCluster) -> ModifyScenario:
    return ModifyScenario(kube_cluster)


async def settled(s: ModifyScenario, ctrl: ModifyController[Any], *claims: str) -> None:
    await s.settled(ctrl, *claims)


async def test_a_change_reaches_the_backend_once_and_the_claim_says_so(
    s: ModifyScenario,
) -> None:
    gold = await s.vac({"iops": "3000"})
    platinum = await s.vac({"iops": "9000", "throughput": "500"})
    claim, pv, handle = await s.claim_with_class(gold)
    assert modify_state(await s.get_claim(claim)) == (None, None, gold)
    backend = MemoryModifier(s.driver)
    ctrl = controller(s.cluster, backend)
    async with running(ctrl):
        await settled(s, ctrl, claim)
        assert backend.calls == []  # the claim has the class it asks for
        await s.set_class(claim, platinum)
        done = await s.wait_state(claim, (None, None, platinum))
        await settled(s, ctrl, claim)
    assert backend.calls == [(handle, {"iops": "9000", "throughput": "500"})]
    assert await s.pv_class(pv) == platinum
    assert condition_types(done) == []
    assert await s.reasons(claim) == ["VolumeModify", "VolumeModifySuccessful"]
    (started, finished) = await s.events(claim)
    assert started["message"] == f"external resizer is modifying volume {claim} with vac {platinum}"
    assert finished["message"] == (
        f"external resizer modified volume {claim} with vac {platinum} successfully"
    )
    assert started["source"]["component"] == f"external-resizer {s.driver}"


async def test_the_claim_is_in_progress_while_the_backend_works(s: ModifyScenario) -> None:
    gold = await s.vac({"iops": "1"})
    claim, pv, _ = await s.claim_with_class(None)
    backend = MemoryModifier(s.driver)
    backend.gate = gate = _gate()
    async with running(controller(s.cluster, backend)):
        await s.set_class(claim, gold)
        busy = await s.wait_state(claim, ("InProgress", gold, None))
        assert conditions(busy)["ModifyingVolume"]["message"] == (
            f'Modifying volume to "{gold}" is in progress.'
        )
        assert await s.pv_class(pv) is None
        gate.set()
        await s.wait_state(claim, (None, None, gold))
    assert await s.pv_class(pv) == gold


def _gate() -> asyncio.Event:
    return asyncio.Event()


async def test_extra_modify_metadata(s: ModifyScenario) -> None:
    gold = await s.vac({"iops": "1"})
    claim, pv, handle = await s.claim_with_class(None)
    backend = MemoryModifier(s.driver)
    async with running(controller(s.cluster, backend, extra_modify_metadata=True)):
        await s.set_class(claim, gold)
        await s.wait_state(claim, (None, None, gold))
    assert backend.calls == [
        (
            handle,
            {
                "iops": "1",
                PVC_NAME_KEY: claim,
                PVC_NAMESPACE_KEY: s.namespace,
                PV_NAME_KEY: pv,
            },
        )
    ]


async def test_infeasible_change_is_reported_and_retried_slowly(s: ModifyScenario) -> None:
    gold = await s.vac({"iops": "1"})
    bad = await s.vac({"colour": "blue"})
    claim, pv, _ = await s.claim_with_class(gold)
    backend = MemoryModifier(s.driver)
    backend.errors = [
        ModifyError(
            "rpc error: code = InvalidArgument desc = invalid parameters: [colour]",
            code=GrpcCode.INVALID_ARGUMENT,
            detail="invalid parameters: [colour]",
        )
        for _ in range(2)
    ]
    ctrl = controller(s.cluster, backend, retry_interval_max=3.0)
    async with running(ctrl):
        await s.set_class(claim, bad)
        failed = await s.wait_state(claim, ("Infeasible", bad, gold))
        await settled(s, ctrl, claim)
        # Not tried again before retry_interval_max: the key waits, delayed.
        assert len(backend.calls) == 1
        assert not ctrl.idle(count_delayed=True)
        by_type = conditions(failed)
        assert by_type["ModifyingVolume"]["message"] == (
            f'Modifying volume to "{bad}" failed. Waiting for retry.'
        )
        error = by_type["ModifyVolumeError"]
        assert (error["reason"], error["message"]) == (
            "InvalidArgument",
            "invalid parameters: [colour]",
        )
        event = await s.wait_event(claim, "VolumeModifyFailed")
        assert event["type"] == "Warning"
        assert event["message"] == (
            "rpc error: code = InvalidArgument desc = invalid parameters: [colour]"
        )
        # Then once more, with the same class.
        await wait_for(lambda: _true(len(backend.calls) == 2), timeout=10, message="the slow retry")
        await s.wait_state(claim, ("Infeasible", bad, gold))
    assert [params for _, params in backend.calls] == [{"colour": "blue"}] * 2
    assert await s.pv_class(pv) == gold


async def _true(value: bool) -> bool | None:
    return value or None


async def test_rollback_to_the_current_class_after_an_infeasible_change(
    s: ModifyScenario,
) -> None:
    gold = await s.vac({"iops": "1"})
    bad = await s.vac({"colour": "blue"})
    claim, pv, _ = await s.claim_with_class(gold)
    async with made_infeasible(s, claim, bad, gold) as (ctrl, backend):
        # Back to the class the volume had: upstream applies it again (the driver may have
        # changed part of it), at once, whatever the slow period.
        await s.set_class(claim, gold)
        done = await s.wait_state(claim, (None, None, gold))
        await settled(s, ctrl, claim)
    assert [params for _, params in backend.calls] == [{"colour": "blue"}, {"iops": "1"}]
    assert condition_types(done) == []
    assert await s.pv_class(pv) == gold


async def test_rollback_to_no_class_cancels_without_calling_the_backend(
    s: ModifyScenario,
) -> None:
    bad = await s.vac({"colour": "blue"})
    claim, pv, _ = await s.claim_with_class(None)
    async with made_infeasible(s, claim, bad, None) as (ctrl, backend):
        await s.set_class(claim, None)
        await s.wait_event(claim, "VolumeModifyCanceled")
        cancelled = await s.wait_claim(
            claim, lambda c: condition_types(c) == ["ModifyVolumeError"], "ModifyingVolume gone"
        )
        await settled(s, ctrl, claim)
    # The record of the last attempt stays, as upstream leaves it.
    assert modify_state(cancelled) == ("Infeasible", bad, None)
    assert len(backend.calls) == 1
    assert await s.pv_class(pv) is None


async def test_an_uncertain_change_is_finished_before_another_is_started(
    s: ModifyScenario,
) -> None:
    """A timeout leaves the outcome open: the modification goes on towards its target, even
    when the claim asks for another class meanwhile; then the new class is applied."""
    gold = await s.vac({"iops": "1"})
    silver = await s.vac({"iops": "2"})
    claim, pv, _ = await s.claim_with_class(None)
    backend = MemoryModifier(s.driver)
    backend.errors = [ModifyError("deadline exceeded", code=GrpcCode.DEADLINE_EXCEEDED)]
    backend.gate = gate = _gate()
    async with running(controller(s.cluster, backend)):
        await s.set_class(claim, gold)
        await wait_for(lambda: _true(len(backend.calls) == 1), message="first call")
        gate.set()
        still = await s.wait_claim(
            claim, lambda c: "ModifyVolumeError" in conditions(c), "the error recorded"
        )
        assert modify_state(still)[:2] == ("InProgress", gold)
        assert conditions(still)["ModifyingVolume"]["message"] == (
            f'Modifying volume to "{gold}" is still in progress.'
        )
        await s.set_class(claim, silver)
        await s.wait_state(claim, (None, None, silver))
    assert [params for _, params in backend.calls] == [{"iops": "1"}, {"iops": "1"}, {"iops": "2"}]
    reasons = await s.reasons(claim)
    assert reasons.count("VolumeModifyFailed") == 1
    failed = next(e for e in await s.events(claim) if e["reason"] == "VolumeModifyFailed")
    assert failed["message"] == f"deadline exceeded. Still modifying to VAC {gold}"
    assert await s.pv_class(pv) == silver


async def test_a_final_error_is_retried_with_backoff(s: ModifyScenario) -> None:
    gold = await s.vac({"iops": "1"})
    claim, _, _ = await s.claim_with_class(None)
    backend = MemoryModifier(s.driver)
    backend.errors = [ModifyError("internal", code=GrpcCode.INTERNAL) for _ in range(3)]
    async with running(controller(s.cluster, backend)):
        await s.set_class(claim, gold)
        await s.wait_state(claim, (None, None, gold))
    # Retried with backoff until it succeeded, each time marked InProgress again.
    assert [params for _, params in backend.calls] == [{"iops": "1"}] * 4
    reasons = await s.reasons(claim)
    assert reasons.count("VolumeModifyFailed") >= 1
    assert reasons[-1] == "VolumeModifySuccessful"


async def test_a_missing_class_is_pending_until_it_is_created(s: ModifyScenario) -> None:
    claim, pv, handle = await s.claim_with_class(None)
    backend = MemoryModifier(s.driver)
    name = s.name("later")
    ctrl = controller(s.cluster, backend)
    async with running(ctrl):
        await s.set_class(claim, name)
        await s.wait_state(claim, ("Pending", None, None))
        event = await s.wait_event(claim, "VolumeModifyFailed")
        assert event["message"] == f'VAC "{name}" does not exist.'
        await settled(s, ctrl, claim)
        assert backend.calls == []
        # Created: the claim is looked at again at once (upstream waits for the resync).
        await s.vac({"iops": "7"}, name=name)
        await s.wait_state(claim, (None, None, name))
    assert backend.calls == [(handle, {"iops": "7"})]
    assert await s.pv_class(pv) == name


async def test_a_class_of_another_driver_is_infeasible_without_a_call(
    s: ModifyScenario,
) -> None:
    other = await s.vac({"iops": "1"}, driver="other.example.com")
    claim, _, _ = await s.claim_with_class(None)
    backend = MemoryModifier(s.driver)
    async with running(controller(s.cluster, backend, retry_interval_max=60.0)):
        await s.set_class(claim, other)
        failed = await s.wait_state(claim, ("Infeasible", other, None))
        event = await s.wait_event(claim, "VolumeModifyFailed")
    assert backend.calls == []
    assert 'is for CSI driver "other.example.com"' in event["message"]
    assert conditions(failed)["ModifyVolumeError"]["reason"] == "InvalidArgument"


async def test_nothing_is_modified_twice_when_recording_the_success_fails(
    kube_cluster: TestCluster, s: ModifyScenario
) -> None:
    kube_cluster.require_in_memory("fails the PV patch inside the API server")
    gold = await s.vac({"iops": "1"})
    claim, pv, handle = await s.claim_with_class(None)
    backend = MemoryModifier(s.driver)
    server = kube_cluster.server
    assert server is not None
    server.faults.fail(500, verb="patch", resource="persistentvolumes", name=pv, count=2)
    ctrl = controller(s.cluster, backend)
    async with running(ctrl):
        await s.set_class(claim, gold)
        await s.wait_state(claim, (None, None, gold))
        await settled(s, ctrl, claim)
    assert backend.calls == [(handle, {"iops": "1"})]
    assert await s.pv_class(pv) == gold
    assert (await s.reasons(claim)).count("VolumeModifySuccessful") == 1


async def test_a_restart_finishes_the_target_in_progress_first(s: ModifyScenario) -> None:
    """A claim found InProgress at start-up may still be modified by the driver: its target is
    applied first, whatever the spec says now (upstream's uncertain claims)."""
    gold = await s.vac({"iops": "1"})
    silver = await s.vac({"iops": "2"})
    claim, pv, _ = await s.claim_with_class(None)
    await s.set_class(claim, silver)
    await s.pvcs.patch(
        claim,
        {
            "status": {
                "modifyVolumeStatus": {
                    "status": "InProgress",
                    "targetVolumeAttributesClassName": gold,
                }
            }
        },
        namespace=s.namespace,
        subresource="status",
    )
    backend = MemoryModifier(s.driver)
    async with running(controller(s.cluster, backend)):
        await s.wait_state(claim, (None, None, silver))
    assert [params for _, params in backend.calls] == [{"iops": "1"}, {"iops": "2"}]
    assert await s.pv_class(pv) == silver


async def test_a_driver_that_cannot_modify_says_so(s: ModifyScenario) -> None:
    gold = await s.vac({"iops": "1"})
    claim, _, _ = await s.claim_with_class(None)
    same, _, _ = await s.claim_with_class(None)
    ctrl = controller(s.cluster, NotModifiable(s.driver, "no MODIFY_VOLUME"))
    async with running(ctrl):
        await s.set_class(claim, gold)
        event = await s.wait_event(claim, "VolumeModifyNotSupported")
        await settled(s, ctrl, claim, same)
    assert event["type"] == "Warning"
    assert event["message"] == (
        f'VolumeAttributesClass "{gold}" cannot be applied to volume {claim}: no MODIFY_VOLUME'
    )
    assert modify_state(await s.get_claim(claim)) == (None, None, None)
    assert await s.reasons(same) == []


async def test_volumes_of_other_drivers_are_left_alone(s: ModifyScenario) -> None:
    gold = await s.vac({"iops": "1"}, driver="other.example.com")
    claim, _, _ = await s.claim_with_class(None, driver="other.example.com")
    backend = MemoryModifier(s.driver)
    ctrl = controller(s.cluster, backend)
    async with running(ctrl):
        await s.set_class(claim, gold)
        await settled(s, ctrl, claim)
    assert backend.calls == []
    assert modify_state(await s.get_claim(claim)) == (None, None, None)
    assert await s.reasons(claim) == []

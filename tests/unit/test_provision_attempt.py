"""ProvisionAttempt: what the claim worker reads from one attempt (upstream's
``err == nil || state == ProvisioningFinished`` and its ``errStopProvision`` marker)."""

from __future__ import annotations

import pytest

from pyprovlib._provisioner import ProvisioningState
from pyprovlib.controller._provision.attempt import Outcome, ProvisionAttempt


@pytest.mark.parametrize("outcome", [Outcome.PROVISIONED, Outcome.VOLUME_EXISTS, Outcome.STOPPED])
def test_an_attempt_that_did_not_fail_is_finished_without_an_error(outcome: Outcome) -> None:
    attempt = ProvisionAttempt(outcome)
    assert attempt.finished
    assert attempt.error is None
    assert attempt.state is ProvisioningState.FINISHED


@pytest.mark.parametrize(
    ("state", "finished"),
    [
        (ProvisioningState.FINISHED, True),
        (ProvisioningState.IN_BACKGROUND, False),
        (ProvisioningState.NO_CHANGE, False),
    ],
)
def test_a_failure_is_finished_only_when_the_backend_is(
    state: ProvisioningState, finished: bool
) -> None:
    error = RuntimeError("backend down")
    attempt = ProvisionAttempt.failed(error, state)
    assert attempt.outcome is Outcome.FAILED
    assert attempt.error is error
    assert attempt.finished is finished


def test_only_a_saved_or_existing_volume_keeps_the_claim_protected() -> None:
    kept = {o for o in Outcome if ProvisionAttempt(o).left_volume}
    assert kept == {Outcome.PROVISIONED, Outcome.VOLUME_EXISTS}

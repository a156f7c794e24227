"""The outcome of one provisioning attempt: upstream's ``(ProvisioningState, error)`` pair and
its ``errStopProvision`` marker as one value, so the claim worker reads what happened instead of
comparing errors."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from pyprovlib._provisioner import ProvisioningState

__all__ = ["Outcome", "ProvisionAttempt"]


class Outcome(enum.Enum):
    """What one provisioning attempt did."""

    PROVISIONED = "provisioned"
    """The volume was created and its PV handed to the volume store."""
    VOLUME_EXISTS = "volume exists"
    """A previous attempt saved the claim's PV: nothing to do (upstream stops here too)."""
    STOPPED = "stopped"
    """Provisioning is impossible, refused, ignored or done without a volume: not retried."""
    FAILED = "failed"
    """The attempt failed with an error: the claim is retried."""


@dataclass(frozen=True, slots=True)
class ProvisionAttempt:
    """One provisioning attempt's outcome, the state the backend is in and, when it failed, the
    error to retry on."""

    outcome: Outcome
    state: ProvisioningState = ProvisioningState.FINISHED
    error: Exception | None = None

    @classmethod
    def failed(
        cls, error: Exception, state: ProvisioningState = ProvisioningState.FINISHED
    ) -> ProvisionAttempt:
        """A failure to retry on; ``state`` says whether the backend may still be at work."""
        return cls(Outcome.FAILED, state, error)

    @property
    def finished(self) -> bool:
        """Nothing can be being created for the claim in the background any more (upstream's
        ``err == nil || state == ProvisioningFinished``)."""
        return self.outcome is not Outcome.FAILED or self.state is ProvisioningState.FINISHED

    @property
    def left_volume(self) -> bool:
        """The claim's PV exists or is being saved: its finalizer stays until it is bound."""
        return self.outcome in (Outcome.PROVISIONED, Outcome.VOLUME_EXISTS)

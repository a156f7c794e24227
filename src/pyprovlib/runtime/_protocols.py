"""What the runtime needs from a controller: :class:`Controller` (run, stop, health) and the
optional :class:`LeaderElected` (a healthy standby, the leader-election health check).

Both are protocols, checked at run time with ``isinstance``: the controllers of
:mod:`pyprovlib.controller` and the CSI sidecars satisfy them without importing this module.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = ["Controller", "LeaderElected"]


@runtime_checkable
class Controller(Protocol):
    """What the runtime needs from a controller (``ProvisionController``, the attacher, ...).

    ``run()`` works until it is cancelled or :meth:`stop` is called. ``stop()`` is graceful
    and returns at once: it stops intake, lets in-flight operations finish, releases the
    leader-election Lease on the way out, and then ``run()`` returns. ``healthy()`` backs
    ``/healthz`` (the process is alive, workers are not stuck); ``ready()`` backs ``/readyz``
    (informers synced, and leading when leader election is on; a controller that is also
    :class:`LeaderElected` is ready as a standby too). Both must be cheap and must
    not block.
    """

    async def run(self) -> None:
        """Run until cancelled or stopped."""
        ...

    def stop(self) -> None:
        """Begin a graceful stop; ``run()`` returns once in-flight work is done."""
        ...

    def healthy(self) -> bool:
        """Liveness: false when the controller cannot make progress any more."""
        ...

    def ready(self) -> bool:
        """Readiness: true once caches are synced (and, with leader election, while leading)."""
        ...


@runtime_checkable
class LeaderElected(Protocol):
    """What a :class:`Controller` running under leader election may add so the runtime's
    health endpoints behave as upstream's (the controllers of :mod:`pyprovlib.controller`,
    :class:`~pyprovlib.runtime.CompositeController` and the CSI sidecars have both).

    ``standing_by()``: a healthy standby — it contends for the Lease and sees another replica
    hold it. ``/readyz`` counts it as ready, because leadership is not readiness: a Deployment
    whose new replicas must become Ready before old ones go (``maxUnavailable: 0``) could
    otherwise never finish a rollout. ``leader_election_check(timeout)``: client-go's
    leader-election health check behind ``/healthz/leader-election``, ``None`` unless this
    replica leads and has not renewed its Lease for the lease duration plus ``timeout``.
    """

    def standing_by(self) -> bool:
        """True while a healthy leader-election standby."""
        ...

    def leader_election_check(self, timeout: float) -> str | None:
        """``None`` when healthy, else why the leader's renewal is overdue."""
        ...

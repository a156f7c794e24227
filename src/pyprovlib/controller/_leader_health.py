"""client-go's leader-election health check (``HealthzAdaptor``), as csi-lib-utils serves it at
``/healthz/leader-election``: a leader is unhealthy once it has not renewed its Lease for the
lease duration plus a timeout (it should have stopped leading by then; a stuck renewal is the
case the check exists for)."""

from __future__ import annotations

from datetime import datetime

__all__ = ["leader_renewal_overdue"]


def leader_renewal_overdue(
    renew_time: str, now: datetime, tolerance: float, lease: str
) -> str | None:
    """The reason a leader is unhealthy when its last renewal (``renew_time``, the Lease's
    RFC 3339 ``renewTime`` this leader wrote with its own clock) is more than ``tolerance``
    seconds before ``now``; ``None`` otherwise."""
    try:
        renewed = datetime.fromisoformat(renew_time)
    except ValueError:
        return f"failed election to renew leadership on lease {lease}: no valid renewTime"
    overdue = (now - renewed).total_seconds()
    if overdue > tolerance:
        return f"failed election to renew leadership on lease {lease} ({overdue:.0f}s ago)"
    return None

"""What the options of the controllers behind the CSI sidecars share (attach, resize and modify,
as external-attacher and external-resizer do): csi-lib-utils' leader election
(:class:`SidecarControllerOptions`), the checks of the timing fields both have, and the work
queue their retry intervals shape."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol

from pyprovlib._errors import InvalidOptionsError

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from pyprovlib.kube._clock import Clock
    from pyprovlib.kube._workqueue import RateLimitingQueue

__all__ = [
    "DEFAULT_LEASE_DURATION",
    "DEFAULT_RENEW_DEADLINE",
    "DEFAULT_RETRY_PERIOD",
    "SidecarControllerOptions",
    "SidecarTimings",
    "check_sidecar_options",
    "retry_queue",
    "sanitize_driver_name",
]

DEFAULT_LEASE_DURATION: Final = 15.0
"""csi-lib-utils' leader election lease duration."""
DEFAULT_RENEW_DEADLINE: Final = 10.0
"""csi-lib-utils' leader election renew deadline."""
DEFAULT_RETRY_PERIOD: Final = 5.0
"""csi-lib-utils' leader election retry period."""

_NOT_NAME_CHAR = re.compile(r"[^a-zA-Z0-9-]")


def sanitize_driver_name(driver: str) -> str:
    """external-attacher's ``SanitizeDriverName`` (and csi-lib-utils' lease name rule): every
    character but ASCII letters, digits and ``-`` becomes ``-``; a trailing ``-`` gets an ``X``.
    The attacher's finalizer and every sidecar's Lease name are built with it."""
    if not driver:
        raise ValueError("the driver name must not be empty")
    name = _NOT_NAME_CHAR.sub("-", driver)
    return name + "X" if name.endswith("-") else name


@dataclass(frozen=True, kw_only=True)
class SidecarControllerOptions:
    """The options the attach and resize controllers share, keyword-only.

    With ``leader_election`` the control loops run only while holding the Lease ``lease``
    (default: the controller's lease name for its driver or resizer) in
    ``leader_election_namespace`` (default: the pod's), with csi-lib-utils' timings
    (``lease_duration``, ``renew_deadline``, ``retry_period``, seconds). Work queue metrics go
    to ``registry`` (prometheus_client's default when None).
    """

    leader_election: bool = False
    leader_election_namespace: str = ""
    lease: str | None = None
    lease_duration: float = DEFAULT_LEASE_DURATION
    renew_deadline: float = DEFAULT_RENEW_DEADLINE
    retry_period: float = DEFAULT_RETRY_PERIOD
    registry: CollectorRegistry | None = None


class SidecarTimings(Protocol):
    """The fields every sidecar controller's options have beside
    :class:`SidecarControllerOptions`' (the attach, resize and modify options each declare
    them, with their upstream's defaults)."""

    @property
    def workers(self) -> int: ...
    @property
    def timeout(self) -> float: ...
    @property
    def retry_interval_start(self) -> float: ...
    @property
    def retry_interval_max(self) -> float: ...
    @property
    def resync_period(self) -> float: ...
    @property
    def registry(self) -> CollectorRegistry | None: ...


def check_sidecar_options(
    options: SidecarTimings,
    error: type[InvalidOptionsError],
) -> None:
    """Raise ``error`` when the worker count, the call timeout, the retry intervals or the
    resync period of ``options`` is out of range."""
    if options.workers < 1:
        raise error(f"workers must be at least 1, got {options.workers}")
    if options.timeout <= 0:
        raise error(f"timeout must be positive, got {options.timeout}")
    if (
        options.retry_interval_start <= 0
        or options.retry_interval_max < options.retry_interval_start
    ):
        raise error(
            "retry intervals must satisfy 0 < retry_interval_start <= retry_interval_max, "
            f"got {options.retry_interval_start} and {options.retry_interval_max}"
        )
    if options.resync_period < 0:
        raise error(f"resync_period must not be negative, got {options.resync_period}")


def retry_queue(
    name: str,
    options: SidecarTimings,
    clock: Clock,
) -> RateLimitingQueue[str]:
    """The work queue ``name`` of a sidecar's controller: a failed key is retried after
    ``options.retry_interval_start``, doubling per failure up to ``retry_interval_max``
    (``--retry-interval-start``/``--retry-interval-max``); its metrics go to
    ``options.registry``."""
    # Imported here: the options modules stay light (no prometheus_client) for the CLIs.
    from pyprovlib.kube._workqueue import ItemExponentialFailureRateLimiter, RateLimitingQueue

    return RateLimitingQueue(
        name,
        ItemExponentialFailureRateLimiter(options.retry_interval_start, options.retry_interval_max),
        clock=clock,
        registry=options.registry,
    )

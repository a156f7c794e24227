"""Options of the :class:`~pyprovlib.ResizeController`, carrying
kubernetes-csi/external-resizer's flag defaults (``cmd/csi-resizer``) in one frozen dataclass.

Durations are seconds (floats).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from pyprovlib._errors import InvalidOptionsError
from pyprovlib.controller._sidecar_options import (
    DEFAULT_LEASE_DURATION,
    DEFAULT_RENEW_DEADLINE,
    DEFAULT_RETRY_PERIOD,
    SidecarControllerOptions,
    check_sidecar_options,
    sanitize_driver_name,
)

__all__ = [
    "DEFAULT_LEASE_DURATION",
    "DEFAULT_RENEW_DEADLINE",
    "DEFAULT_RESYNC",
    "DEFAULT_RETRY_INTERVAL_MAX",
    "DEFAULT_RETRY_INTERVAL_START",
    "DEFAULT_RETRY_PERIOD",
    "DEFAULT_TIMEOUT",
    "DEFAULT_WORKERS",
    "LEASE_NAME_PREFIX",
    "InvalidResizeOptionsError",
    "ResizeControllerOptions",
    "SidecarControllerOptions",
    "lease_name",
]

DEFAULT_RESYNC: Final = 10 * 60.0
"""Informer resync period (``--resync-period``): a claim whose request changed again while it
was being expanded is looked at again at the latest then."""
DEFAULT_TIMEOUT: Final = 10.0
"""How long one expand call may take (``--timeout``)."""
DEFAULT_WORKERS: Final = 10
"""Claims expanded concurrently (``--workers``)."""
DEFAULT_RETRY_INTERVAL_START: Final = 1.0
"""First retry delay of a failed expansion; it doubles per failure
(``--retry-interval-start``)."""
DEFAULT_RETRY_INTERVAL_MAX: Final = 5 * 60.0
"""Longest retry delay (``--retry-interval-max``); also how long an infeasible expansion
waits before it is tried again at the same size (upstream's slow set)."""
LEASE_NAME_PREFIX: Final = "external-resizer-"
"""The leader election Lease is ``external-resizer-<sanitized resizer name>``."""


def lease_name(resizer_name: str) -> str:
    """The leader election Lease name of the resizer ``resizer_name`` (upstream's
    ``"external-resizer-" + util.SanitizeName(resizerName)``)."""
    return LEASE_NAME_PREFIX + sanitize_driver_name(resizer_name)


class InvalidResizeOptionsError(InvalidOptionsError):
    """A :class:`ResizeControllerOptions` field is out of range."""


@dataclass(frozen=True)
class ResizeControllerOptions(SidecarControllerOptions):
    """How a :class:`~pyprovlib.ResizeController` runs.

    ``handle_volume_in_use_error`` (``--handle-volume-inuse-error``): after the backend said it
    can only expand an unused volume (FAILED_PRECONDITION), do not call it again while a pod
    uses the claim. The leader election fields and ``registry`` are the keyword-only fields of
    :class:`~pyprovlib.controller._attach.options.SidecarControllerOptions`; the default Lease
    is :func:`lease_name` of the resizer.
    """

    resync_period: float = DEFAULT_RESYNC
    timeout: float = DEFAULT_TIMEOUT
    workers: int = DEFAULT_WORKERS
    retry_interval_start: float = DEFAULT_RETRY_INTERVAL_START
    retry_interval_max: float = DEFAULT_RETRY_INTERVAL_MAX
    handle_volume_in_use_error: bool = True

    def __post_init__(self) -> None:
        check_sidecar_options(self, InvalidResizeOptionsError)

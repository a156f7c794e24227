"""Options of the :class:`~pyprovlib.ResizeController`, carrying
kubernetes-csi/external-resizer's flag defaults (``cmd/csi-resizer``) in one frozen dataclass.

Durations are seconds (floats).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Final

from pyprovlib._errors import InvalidOptionsError
from pyprovlib.controller._resize.errors import InvalidResizeOptionsError
from pyprovlib.controller._sidecar_options import (
    SidecarControllerOptions,
    check_sidecar_options,
    sanitize_driver_name,
)

__all__ = [
    "DEFAULT_RESYNC",
    "DEFAULT_RETRY_INTERVAL_MAX",
    "DEFAULT_RETRY_INTERVAL_START",
    "DEFAULT_TIMEOUT",
    "DEFAULT_WORKERS",
    "LEASE_NAME_PREFIX",
    "InvalidResizeOptionsError",
    "ResizeControllerOptions",
    "ResizerSidecarOptions",
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


@dataclass(frozen=True)
class ResizerSidecarOptions(SidecarControllerOptions):
    """The fields of external-resizer's flags that its resize and modify controllers both read
    (one ``--timeout``, ``--workers``, ``--retry-interval-*`` and ``--resync-period`` for
    both), with their defaults, checked once. ``invalid_error`` is what a subclass raises for
    a field out of range."""

    invalid_error: ClassVar[type[InvalidOptionsError]] = InvalidOptionsError

    resync_period: float = DEFAULT_RESYNC
    timeout: float = DEFAULT_TIMEOUT
    workers: int = DEFAULT_WORKERS
    retry_interval_start: float = DEFAULT_RETRY_INTERVAL_START
    retry_interval_max: float = DEFAULT_RETRY_INTERVAL_MAX

    def __post_init__(self) -> None:
        check_sidecar_options(self, self.invalid_error)


@dataclass(frozen=True)
class ResizeControllerOptions(ResizerSidecarOptions):
    """How a :class:`~pyprovlib.ResizeController` runs.

    ``handle_volume_in_use_error`` (``--handle-volume-inuse-error``): after the backend said it
    can only expand an unused volume (FAILED_PRECONDITION), do not call it again while a pod
    uses the claim. The timing fields are :class:`ResizerSidecarOptions`'; the leader election
    fields and ``registry`` are the keyword-only fields of
    :class:`~pyprovlib.controller._sidecar_options.SidecarControllerOptions`; the default Lease
    is :func:`lease_name` of the resizer.
    """

    invalid_error: ClassVar[type[InvalidOptionsError]] = InvalidResizeOptionsError

    handle_volume_in_use_error: bool = True

"""Options of the :class:`~pyprovlib.controller.attach.AttachController`, carrying
kubernetes-csi/external-attacher's flag defaults (``cmd/csi-attacher``) in one frozen dataclass.

Durations are seconds (floats).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from pyprovlib.controller._sidecar_options import (
    DEFAULT_LEASE_DURATION,
    DEFAULT_RENEW_DEADLINE,
    DEFAULT_RETRY_PERIOD,
    SidecarControllerOptions,
    check_sidecar_options,
)
from pyprovlib.errors import InvalidOptionsError

__all__ = [
    "DEFAULT_LEASE_DURATION",
    "DEFAULT_RECONCILE_SYNC",
    "DEFAULT_RENEW_DEADLINE",
    "DEFAULT_RESYNC",
    "DEFAULT_RETRY_INTERVAL_MAX",
    "DEFAULT_RETRY_INTERVAL_START",
    "DEFAULT_RETRY_PERIOD",
    "DEFAULT_TIMEOUT",
    "DEFAULT_WORKER_THREADS",
    "FINALIZER_PREFIX",
    "LEASE_NAME_PREFIX",
    "AttachControllerOptions",
    "InvalidAttachOptionsError",
    "SidecarControllerOptions",
    "finalizer_name",
    "lease_name",
    "sanitize_driver_name",
]

DEFAULT_RESYNC: Final = 10 * 60.0
"""Informer resync period (``--resync``)."""
DEFAULT_TIMEOUT: Final = 15.0
"""How long one attach or detach call may take (``--timeout``)."""
DEFAULT_WORKER_THREADS: Final = 10
"""VolumeAttachment workers, and as many PersistentVolume workers (``--worker-threads``)."""
DEFAULT_RETRY_INTERVAL_START: Final = 1.0
"""First retry delay of a failed item; it doubles per failure (``--retry-interval-start``)."""
DEFAULT_RETRY_INTERVAL_MAX: Final = 5 * 60.0
"""Longest retry delay (``--retry-interval-max``)."""
DEFAULT_RECONCILE_SYNC: Final = 60.0
"""How often attachments are compared with the backend's (``--reconcile-sync``)."""
FINALIZER_PREFIX: Final = "external-attacher/"
"""Finalizers are ``external-attacher/<sanitized driver name>``."""
LEASE_NAME_PREFIX: Final = "external-attacher-leader-"
"""The leader election Lease is ``external-attacher-leader-<sanitized driver name>``."""

_NOT_NAME_CHAR = re.compile(r"[^a-zA-Z0-9-]")


def sanitize_driver_name(driver: str) -> str:
    """external-attacher's ``SanitizeDriverName`` (and csi-lib-utils' lease name rule): every
    character but ASCII letters, digits and ``-`` becomes ``-``; a trailing ``-`` gets an ``X``."""
    if not driver:
        raise ValueError("the driver name must not be empty")
    name = _NOT_NAME_CHAR.sub("-", driver)
    return name + "X" if name.endswith("-") else name


def finalizer_name(driver: str) -> str:
    """The finalizer the attacher of ``driver`` puts on PVs and VolumeAttachments."""
    return FINALIZER_PREFIX + sanitize_driver_name(driver)


def lease_name(driver: str) -> str:
    """The leader election Lease name of the attacher of ``driver``."""
    return sanitize_driver_name(LEASE_NAME_PREFIX + driver)


class InvalidAttachOptionsError(InvalidOptionsError):
    """An :class:`AttachControllerOptions` field is out of range."""


@dataclass(frozen=True)
class AttachControllerOptions(SidecarControllerOptions):
    """How an :class:`~pyprovlib.controller.attach.AttachController` runs.

    ``reconcile``: compare attachments with the backend every ``reconcile_sync`` seconds;
    ``None`` means "when the attacher can list what it published". ``default_fs_type`` is used
    for volumes whose source names no file system type (``--default-fstype``). The leader
    election fields and ``registry`` are the keyword-only fields of
    :class:`SidecarControllerOptions`; the default Lease is :func:`lease_name` of the driver.
    """

    resync_period: float = DEFAULT_RESYNC
    timeout: float = DEFAULT_TIMEOUT
    worker_threads: int = DEFAULT_WORKER_THREADS
    retry_interval_start: float = DEFAULT_RETRY_INTERVAL_START
    retry_interval_max: float = DEFAULT_RETRY_INTERVAL_MAX
    reconcile_sync: float = DEFAULT_RECONCILE_SYNC
    reconcile: bool | None = None
    default_fs_type: str = ""

    def __post_init__(self) -> None:
        check_sidecar_options(self, "worker_threads", InvalidAttachOptionsError)
        if self.reconcile_sync <= 0:
            raise InvalidAttachOptionsError(
                f"reconcile_sync must be positive, got {self.reconcile_sync}"
            )

"""Options of the :class:`~pyprovlib.AttachController`, carrying
kubernetes-csi/external-attacher's flag defaults (``cmd/csi-attacher``) in one frozen dataclass.

Durations are seconds (floats).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from pyprovlib.controller._attach.errors import InvalidAttachOptionsError
from pyprovlib.controller._renamed import renamed_field
from pyprovlib.controller._sidecar_options import (
    SidecarControllerOptions,
    check_sidecar_options,
    sanitize_driver_name,
)

__all__ = [
    "DEFAULT_RECONCILE_SYNC",
    "DEFAULT_RESYNC",
    "DEFAULT_RETRY_INTERVAL_MAX",
    "DEFAULT_RETRY_INTERVAL_START",
    "DEFAULT_TIMEOUT",
    "DEFAULT_WORKERS",
    "DEFAULT_WORKER_THREADS",
    "FINALIZER_PREFIX",
    "LEASE_NAME_PREFIX",
    "AttachControllerOptions",
    "InvalidAttachOptionsError",
    "finalizer_name",
    "lease_name",
]

DEFAULT_RESYNC: Final = 10 * 60.0
"""Informer resync period (``--resync``)."""
DEFAULT_TIMEOUT: Final = 15.0
"""How long one attach or detach call may take (``--timeout``)."""
DEFAULT_WORKERS: Final = 10
"""VolumeAttachment workers, and as many PersistentVolume workers (``--worker-threads``)."""
DEFAULT_WORKER_THREADS: Final = DEFAULT_WORKERS
"""Deprecated name of :data:`DEFAULT_WORKERS`."""
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


def finalizer_name(driver: str) -> str:
    """The finalizer the attacher of ``driver`` puts on PVs and VolumeAttachments."""
    return FINALIZER_PREFIX + sanitize_driver_name(driver)


def lease_name(driver: str) -> str:
    """The leader election Lease name of the attacher of ``driver``."""
    return sanitize_driver_name(LEASE_NAME_PREFIX + driver)


@renamed_field("worker_threads", "workers")
@dataclass(frozen=True)
class AttachControllerOptions(SidecarControllerOptions):
    """How an :class:`~pyprovlib.AttachController` runs.

    ``reconcile``: compare attachments with the backend every ``reconcile_sync`` seconds;
    ``None`` means "when the attacher can list what it published". ``default_fs_type`` is used
    for volumes whose source names no file system type (``--default-fstype``). The leader
    election fields and ``registry`` are the keyword-only fields of
    :class:`SidecarControllerOptions`; the default Lease is :func:`lease_name` of the driver.
    ``workers`` (``--worker-threads``) was ``worker_threads``, which still works with a
    DeprecationWarning.
    """

    resync_period: float = DEFAULT_RESYNC
    timeout: float = DEFAULT_TIMEOUT
    workers: int = DEFAULT_WORKERS
    retry_interval_start: float = DEFAULT_RETRY_INTERVAL_START
    retry_interval_max: float = DEFAULT_RETRY_INTERVAL_MAX
    reconcile_sync: float = DEFAULT_RECONCILE_SYNC
    reconcile: bool | None = None
    default_fs_type: str = ""

    def __post_init__(self) -> None:
        check_sidecar_options(self, InvalidAttachOptionsError)
        if self.reconcile_sync <= 0:
            raise InvalidAttachOptionsError(
                f"reconcile_sync must be positive, got {self.reconcile_sync}"
            )

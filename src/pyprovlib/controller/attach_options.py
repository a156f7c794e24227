"""Deprecated: the old path of :mod:`pyprovlib.controller.attach.options`.

The attach controller became the package :mod:`pyprovlib.controller.attach`; import
``AttachControllerOptions`` and its helpers from there (the defaults from
``pyprovlib.controller.attach.options``). This module re-exports the same names and warns
on import; it goes away in the next release.
"""

from __future__ import annotations

import warnings

from pyprovlib.controller.attach.options import (
    DEFAULT_LEASE_DURATION,
    DEFAULT_RECONCILE_SYNC,
    DEFAULT_RENEW_DEADLINE,
    DEFAULT_RESYNC,
    DEFAULT_RETRY_INTERVAL_MAX,
    DEFAULT_RETRY_INTERVAL_START,
    DEFAULT_RETRY_PERIOD,
    DEFAULT_TIMEOUT,
    DEFAULT_WORKER_THREADS,
    DEFAULT_WORKERS,
    FINALIZER_PREFIX,
    LEASE_NAME_PREFIX,
    AttachControllerOptions,
    InvalidAttachOptionsError,
    SidecarControllerOptions,
    finalizer_name,
    lease_name,
    sanitize_driver_name,
)

__all__ = [
    "DEFAULT_LEASE_DURATION",
    "DEFAULT_RECONCILE_SYNC",
    "DEFAULT_RENEW_DEADLINE",
    "DEFAULT_RESYNC",
    "DEFAULT_RETRY_INTERVAL_MAX",
    "DEFAULT_RETRY_INTERVAL_START",
    "DEFAULT_RETRY_PERIOD",
    "DEFAULT_TIMEOUT",
    "DEFAULT_WORKERS",
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

warnings.warn(
    "pyprovlib.controller.attach_options is deprecated: import from pyprovlib.controller.attach"
    " (the defaults from pyprovlib.controller.attach.options)",
    DeprecationWarning,
    stacklevel=2,
)

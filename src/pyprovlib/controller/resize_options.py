"""Deprecated: the old path of :mod:`pyprovlib.controller.resize.options`.

The resize controller became the package :mod:`pyprovlib.controller.resize`; import
``ResizeControllerOptions`` and its helpers from there (the defaults from
``pyprovlib.controller.resize.options``). This module re-exports the same names and warns
on import; it goes away in the next release.
"""

from __future__ import annotations

import warnings

from pyprovlib.controller.resize.options import (
    DEFAULT_LEASE_DURATION,
    DEFAULT_RENEW_DEADLINE,
    DEFAULT_RESYNC,
    DEFAULT_RETRY_INTERVAL_MAX,
    DEFAULT_RETRY_INTERVAL_START,
    DEFAULT_RETRY_PERIOD,
    DEFAULT_TIMEOUT,
    DEFAULT_WORKERS,
    LEASE_NAME_PREFIX,
    InvalidResizeOptionsError,
    ResizeControllerOptions,
    SidecarControllerOptions,
    lease_name,
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

warnings.warn(
    "pyprovlib.controller.resize_options is deprecated: import from pyprovlib.controller.resize"
    " (the defaults from pyprovlib.controller.resize.options)",
    DeprecationWarning,
    stacklevel=2,
)

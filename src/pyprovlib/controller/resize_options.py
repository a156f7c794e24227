"""Deprecated: the old path of :mod:`pyprovlib.controller.resize.options`.

The resize controller became the package :mod:`pyprovlib.controller.resize`; import
``ResizeControllerOptions`` and its helpers from there (the defaults from
``pyprovlib.controller.resize.options``). This module re-exports the same names and warns
on import; it goes away in the next release.
"""

from __future__ import annotations

import warnings

from pyprovlib.controller.resize import options as _options
from pyprovlib.controller.resize.options import *  # noqa: F403 - the same names, re-exported

__all__ = list(_options.__all__)

warnings.warn(
    "pyprovlib.controller.resize_options is deprecated: import from pyprovlib.controller.resize"
    " (the defaults from pyprovlib.controller.resize.options)",
    DeprecationWarning,
    stacklevel=2,
)

"""Deprecated: the old path of :mod:`pyprovlib.controller.attach.options`.

The attach controller became the package :mod:`pyprovlib.controller.attach`; import
``AttachControllerOptions`` and its helpers from there (the defaults from
``pyprovlib.controller.attach.options``). This module re-exports the same names and warns
on import; it goes away in the next release.
"""

from __future__ import annotations

import warnings

from pyprovlib.controller.attach import options as _options
from pyprovlib.controller.attach.options import *  # noqa: F403 - the same names, re-exported

__all__ = list(_options.__all__)

warnings.warn(
    "pyprovlib.controller.attach_options is deprecated: import from pyprovlib.controller.attach"
    " (the defaults from pyprovlib.controller.attach.options)",
    DeprecationWarning,
    stacklevel=2,
)

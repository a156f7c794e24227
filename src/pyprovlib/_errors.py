"""The root of pyprovlib's exception hierarchy.

Every exception pyprovlib raises on purpose derives from :class:`PyprovlibError`, so an
application can catch "anything pyprovlib reported" in one clause; most also derive from the
built-in exception their meaning matches (``ValueError`` for bad options, ``LookupError`` for a
missing object), so code written against those keeps working.
"""

from __future__ import annotations

__all__ = ["InvalidOptionsError", "PyprovlibError"]


class PyprovlibError(Exception):
    """Base class of every error pyprovlib raises on purpose."""


class InvalidOptionsError(PyprovlibError, ValueError):
    """An option is out of range or two options contradict each other."""

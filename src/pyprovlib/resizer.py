"""Deprecated path of the resizer contract: import from :mod:`pyprovlib` instead."""

from pyprovlib._moved import forwarder

__getattr__ = forwarder(__name__)

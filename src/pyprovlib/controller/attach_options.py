"""Deprecated path of the attach controller's options: import from :mod:`pyprovlib` instead."""

from pyprovlib._moved import forwarder

__getattr__ = forwarder(__name__)

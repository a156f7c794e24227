"""Deprecated path of KubeletNode: import from :mod:`pyprovlib.testing` instead."""

from pyprovlib._moved import forwarder

__getattr__ = forwarder(__name__)

"""Deprecated path of the CSI server kit: import from :mod:`pyprovlib.csi` instead."""

from pyprovlib._moved import forwarder

__getattr__ = forwarder(__name__)

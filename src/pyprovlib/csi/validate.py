"""Deprecated path of the CSI request checks: import from :mod:`pyprovlib.csi` instead."""

from pyprovlib._moved import forwarder

__getattr__ = forwarder(__name__)

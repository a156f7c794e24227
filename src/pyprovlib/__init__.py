"""pyprovlib: write Kubernetes storage controllers (provisioners, attachers, resizers) in Python.

This module only re-exports the public API; see the documentation for the tour.
"""

from pyprovlib._version import __version__

__all__ = ["__version__"]

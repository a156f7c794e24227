"""The package version, read by the build backend and by ``pyprovlib.__version__``."""

__version__ = "0.1.0"
"""pyprovlib's version (PEP 440); also the ``pyprovlib/<version>`` user agent."""

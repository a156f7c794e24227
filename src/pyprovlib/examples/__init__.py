"""Example backends built only on pyprovlib's public API, runnable with ``python -m``."""

"""Example backends built only on pyprovlib's public API, runnable with ``python -m``."""

# Nothing of its own: each backend is a subpackage with its own ``__all__``.
__all__: list[str] = []

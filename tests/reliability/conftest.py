"""The reliability suite. Its heavier variants (``@pytest.mark.slow``: the issue's full scale)
run only with ``-m slow``; tests/conftest.py skips them otherwise, for the whole suite."""

"""Shared test configuration. Fixtures for the API server come from pyprovlib.testing's pytest
plugin (``apiserver``, ``apiserver_with_binder``, ``kube_client``, ``kube_cluster``)."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=100, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Heavier variants (``@pytest.mark.slow``) run only when ``-m`` names ``slow``, so the
    default run stays within CI's budget."""
    if "slow" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="full-scale variant: run with -m slow")
    for item in items:
        if item.get_closest_marker("slow") is not None:
            item.add_marker(skip)

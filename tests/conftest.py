"""Shared test configuration. Fixtures for the API server come from pyprovlib.testing's pytest
plugin (``apiserver``, ``apiserver_with_binder``, ``kube_client``, ``kube_cluster``)."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=100, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")

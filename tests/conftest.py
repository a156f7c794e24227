"""Shared test configuration. Fixtures for the API server come from pyprovlib.testing's pytest
plugin (``apiserver``, ``apiserver_with_binder``, ``kube_client``, ``kube_cluster``); the
logging fixtures (``restore_logging``, ``logs``) are here."""

from __future__ import annotations

import asyncio
import io
import logging
import os
from collections.abc import Iterator

import pytest
import structlog
from hypothesis import HealthCheck, settings
from inventory_support import inventory, left_behind
from kubernetes_asyncio.client import ApiClient, Configuration
from kubernetes_asyncio.config import load_kube_config

from pyprovlib.runtime import _logging as runtime_logging
from pyprovlib.testing._cluster import ENV_KUBECONFIG
from pyprovlib.testing._controlplane import assets_from_environment, shared_control_plane

# The suite is a gate: the same examples every run (derandomize: a seed from each test's
# own code), so a red run is reproducible and a green one is not luck. New examples come
# from HYPOTHESIS_PROFILE=explore (random, more of them); a failure it finds becomes an
# @example in the test.
settings.register_profile(
    "ci",
    max_examples=200,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", max_examples=100, deadline=None, derandomize=True)
settings.register_profile(
    "explore", max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev")
)


_OPT_IN = {
    "slow": "full-scale variant: run with -m slow",
    "heavy": "heavy test (processes, docs build, bench smoke): run with -m heavy, as CI does",
    "node": "needs a real node (root, kubelet, containerd): run with -m node, as CI does",
    "conformance": (
        "Kubernetes' storage e2e suite for three stacks (~30 min): run with -m conformance, "
        "as CI does"
    ),
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Heavier variants (``@pytest.mark.slow``) and heavy tests (``@pytest.mark.heavy``) run
    only when ``-m`` names their marker, so the default run stays fast; CI runs ``-m heavy``
    as a step of its own."""
    markexpr = config.getoption("markexpr") or ""
    skips = {
        name: pytest.mark.skip(reason=reason)
        for name, reason in _OPT_IN.items()
        if name not in markexpr
    }
    for item in items:
        for name, skip in skips.items():
            if item.get_closest_marker(name) is not None:
                item.add_marker(skip)
                break


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """Leave logging as the test found it: root handlers and level, pyprovlib's installed
    handler, structlog's configuration and context variables."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    if runtime_logging._installed is not None:
        root.removeHandler(runtime_logging._installed)
        runtime_logging._installed = None
    root.handlers[:] = handlers
    root.setLevel(level)
    structlog.reset_defaults()
    structlog.contextvars.clear_contextvars()


@pytest.fixture
def logs(restore_logging: None) -> io.StringIO:
    """Everything logged during the test, as the ``python -m`` entry points write it: JSON
    lines at debug level."""
    stream = io.StringIO()
    runtime_logging.configure_logging("json", "debug", stream=stream)
    return stream


@pytest.fixture(scope="session", autouse=True)
def _nothing_left_in_real_cluster(request: pytest.FixtureRequest) -> Iterator[None]:
    """On a real cluster (``PYPROVLIB_E2E_KUBECONFIG``, or the shared control plane of
    ``PYPROVLIB_KUBE_ASSETS``) with e2e tests selected: an inventory of the cluster before
    the first test and after the last, failing the run if anything the tests made is still
    there (a suite pointed at a shared cluster must leave nothing behind)."""
    kubeconfig = os.environ.get(ENV_KUBECONFIG)
    assets = assets_from_environment()
    selected = any(item.get_closest_marker("e2e") for item in request.session.items)
    if not selected or not (kubeconfig or assets):
        yield
        return

    async def client() -> ApiClient:
        if kubeconfig:
            configuration = Configuration()
            await load_kube_config(config_file=kubeconfig, client_configuration=configuration)
            return ApiClient(configuration=configuration)
        plane = await shared_control_plane()
        return plane.api_client()

    async def take() -> set[str]:
        async with await client() as api:
            return await inventory(api)

    async def remaining(before: set[str]) -> list[str]:
        async with await client() as api:
            return await left_behind(api, before)

    before = asyncio.run(take())
    yield
    left = asyncio.run(remaining(before))
    if left:
        pytest.fail("the tests left objects in the cluster:\n  " + "\n  ".join(left))

"""pytest fixtures for testing controllers against :mod:`pyprovlib.testing`.

Registered as a pytest plugin (entry point ``pytest11``) when pyprovlib is installed:

- ``apiserver``: a fresh in-memory API server (no PV binder), stopped after the test;
- ``apiserver_with_binder``: the same with the PV binder playing kube-controller-manager;
- ``kube_client``: a kubernetes-asyncio ``ApiClient`` talking to ``apiserver``;
- ``kube_cluster``: a :class:`pyprovlib.testing.TestCluster` — the in-memory server with
  its binder, the real cluster named by ``PYPROVLIB_E2E_KUBECONFIG``, or a real control plane
  started from the assets directory named by ``PYPROVLIB_KUBE_ASSETS`` (or
  ``KUBEBUILDER_ASSETS``), one per test session — with a unique namespace that is deleted
  afterwards. End-to-end tests written against it run in every place.

The fixtures need pytest-asyncio; without it this plugin defines nothing.
"""

from __future__ import annotations

import importlib.util
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING

_HAVE_PYTEST_ASYNCIO = importlib.util.find_spec("pytest_asyncio") is not None

if TYPE_CHECKING:
    from kubernetes_asyncio.client import ApiClient

    from pyprovlib.testing._cluster import TestCluster
    from pyprovlib.testing._server import ApiServer

if _HAVE_PYTEST_ASYNCIO:
    import pytest_asyncio

    @pytest_asyncio.fixture
    async def apiserver() -> AsyncIterator[ApiServer]:
        from pyprovlib.testing._server import ApiServer

        async with ApiServer() as server:
            yield server

    @pytest_asyncio.fixture
    async def apiserver_with_binder() -> AsyncIterator[ApiServer]:
        from pyprovlib.testing._server import ApiServer

        async with ApiServer(binder=True) as server:
            yield server

    @pytest_asyncio.fixture
    async def kube_client(apiserver: ApiServer) -> AsyncIterator[ApiClient]:
        async with apiserver.api_client() as client:
            yield client

    import pytest

    @pytest.fixture(scope="session")
    def _pyprovlib_session_control_plane() -> Iterator[None]:
        """Stops the session's shared control plane (started by the first ``kube_cluster``
        that needs it, on that test's event loop) when the session ends."""
        yield
        from pyprovlib.testing._controlplane import stop_shared_control_plane

        stop_shared_control_plane()

    @pytest_asyncio.fixture
    async def kube_cluster(_pyprovlib_session_control_plane: None) -> AsyncIterator[TestCluster]:
        from pyprovlib.testing._cluster import TestCluster

        async with TestCluster.from_environment() as cluster:
            yield cluster

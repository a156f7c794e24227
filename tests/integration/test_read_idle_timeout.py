"""Requests and watches on a connection that went silently dead fail after the read-idle
timeout instead of hanging (pyprovlib.kube._config.READ_IDLE_TIMEOUT, 45 s; shortened here).

The connection goes through pyprovlib.testing._netproxy.TcpProxy, whose blackhole mode
swallows bytes both ways without a reset: a partition a NAT or load balancer forgot.
tests/reliability/test_partition.py checks a whole controller recovering (-m slow).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import aiohttp
import pytest
from kubernetes_asyncio.client import ApiClient

import pyprovlib.kube._config as kube_config
import pyprovlib.kube._rest as kube_rest
from pyprovlib.kube._resources import NAMESPACES
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.testing._netproxy import TcpProxy
from pyprovlib.testing._server import ApiServer

IDLE = 0.5


@pytest.fixture
def short_idle_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kube_config, "READ_IDLE_TIMEOUT", IDLE)
    monkeypatch.setattr(kube_rest, "READ_IDLE_TIMEOUT", IDLE)


@pytest.fixture
async def proxied(
    apiserver: ApiServer, short_idle_timeout: None
) -> AsyncIterator[tuple[TcpProxy, ResourceClient]]:
    """The server's namespaces, read through a TCP proxy a test can partition."""
    async with TcpProxy("127.0.0.1", apiserver.port) as proxy:
        config = apiserver.configuration()
        config.host = proxy.url
        async with ApiClient(configuration=config) as api:
            yield proxy, ResourceClient(api, NAMESPACES)


async def test_a_request_on_a_dead_connection_times_out(
    proxied: tuple[TcpProxy, ResourceClient],
) -> None:
    proxy, namespaces = proxied
    await namespaces.get("default")  # a pooled keep-alive connection now exists
    proxy.partition("blackhole")
    started = time.monotonic()
    with pytest.raises(aiohttp.ServerTimeoutError):
        await namespaces.get("default")
    assert time.monotonic() - started < IDLE + 5
    proxy.heal()
    assert (await namespaces.get("default"))["metadata"]["name"] == "default"


async def test_a_watch_on_a_dead_connection_ends_with_a_transport_error(
    proxied: tuple[TcpProxy, ResourceClient],
) -> None:
    proxy, namespaces = proxied
    listed = await namespaces.list()
    stream = namespaces.watch(
        resource_version=listed["metadata"]["resourceVersion"], allow_bookmarks=False
    )
    async with stream:
        proxy.partition("blackhole")
        started = time.monotonic()
        # aiohttp.ClientError: what the informer takes as a broken stream and resumes.
        with pytest.raises(aiohttp.ClientError):
            async for _ in stream:
                pass
        assert time.monotonic() - started < IDLE + 5

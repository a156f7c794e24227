"""One diagnostics server for the library and the runtime (issue 20): the endpoint a
ProvisionController serves itself (``metrics_port``) and the one ``pyprovlib.runtime`` serves
(``--http-endpoint``) are the same :class:`EndpointServer`, answering /metrics, /healthz,
/healthz/leader-election and /readyz alike."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import aiohttp
import pytest
from prometheus_client import CollectorRegistry, Counter

from pyprovlib.controller._endpoint import EndpointServer, controller_checks
from pyprovlib.runtime._http import HttpServer
from pyprovlib.runtime._http import controller_checks as runtime_checks


class ElectedController:
    """A controller under leader election whose state the test sets."""

    def __init__(self) -> None:
        self.is_healthy = True
        self.is_ready = False
        self.is_standby = False
        self.renewal_problem: str | None = None

    def healthy(self) -> bool:
        return self.is_healthy

    def ready(self) -> bool:
        return self.is_ready

    def standing_by(self) -> bool:
        return self.is_standby

    def leader_election_check(self, timeout: float) -> str | None:
        assert timeout > 0
        return self.renewal_problem


def _library(registry: CollectorRegistry, controller: ElectedController) -> EndpointServer:
    healthz, readyz = controller_checks(controller)
    return EndpointServer(
        "127.0.0.1", 0, registry=registry, metrics_path="/m", healthz=healthz, readyz=readyz
    )


def _runtime(registry: CollectorRegistry, controller: ElectedController) -> EndpointServer:
    healthz, readyz = runtime_checks(controller)
    return HttpServer(
        "127.0.0.1:0", registry=registry, metrics_path="/m", healthz=healthz, readyz=readyz
    )


@pytest.fixture
def registry() -> CollectorRegistry:
    reg = CollectorRegistry()
    Counter("pyprovlib_test_endpoint_total", "A counter", registry=reg).inc(2)
    return reg


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def _get(session: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    async with session.get(url) as resp:
        return resp.status, await resp.text()


def test_the_runtime_server_is_the_library_server() -> None:
    assert issubclass(HttpServer, EndpointServer)
    assert runtime_checks is controller_checks


@pytest.mark.parametrize("make", [_library, _runtime], ids=["library", "runtime"])
async def test_both_paths_serve_metrics_and_health_alike(
    make: Callable[[CollectorRegistry, ElectedController], EndpointServer],
    registry: CollectorRegistry,
    session: aiohttp.ClientSession,
) -> None:
    controller = ElectedController()
    async with make(registry, controller) as server:
        status, body = await _get(session, f"{server.url}/m")
        assert status == 200
        assert "pyprovlib_test_endpoint_total 2.0" in body

        assert await _get(session, f"{server.url}/healthz") == (200, "ok")
        assert await _get(session, f"{server.url}/healthz/leader-election") == (200, "ok")
        status, body = await _get(session, f"{server.url}/readyz")
        assert status == 503
        assert "[-]controller failed" in body

        # A healthy standby is ready (leadership is not readiness).
        controller.is_standby = True
        assert await _get(session, f"{server.url}/readyz") == (200, "ok")

        # A leader that stopped renewing fails the leader-election check, alone and in /healthz.
        controller.renewal_problem = "failed election to renew leadership on lease ns/l"
        status, body = await _get(session, f"{server.url}/healthz/leader-election")
        assert status == 500
        assert "[-]leader-election failed: failed election to renew" in body
        assert "[+]controller" not in body
        status, body = await _get(session, f"{server.url}/healthz")
        assert status == 500
        assert "[+]controller ok" in body
    with pytest.raises(aiohttp.ClientConnectionError):
        await _get(session, f"{server.url}/healthz")

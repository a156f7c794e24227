"""The diagnostics HTTP server: /metrics, /healthz, /readyz over real HTTP."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from prometheus_client import CollectorRegistry, Counter

from pyprovlib.runtime import Controller
from pyprovlib.runtime._http import HttpServer, controller_checks


class FakeController:
    """A controller whose health the test sets; the runtime protocol is ours to fake."""

    def __init__(self) -> None:
        self.is_healthy = True
        self.is_ready = False

    async def run(self) -> None:
        return None

    def stop(self) -> None:
        return None

    def healthy(self) -> bool:
        return self.is_healthy

    def ready(self) -> bool:
        return self.is_ready


@pytest.fixture
def registry() -> CollectorRegistry:
    reg = CollectorRegistry()
    counter = Counter(
        "controller_persistentvolumeclaim_provision_total",
        "Claims provisioned",
        ["class"],
        registry=reg,
    )
    counter.labels("fast").inc(3)
    return reg


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def fetch(session: aiohttp.ClientSession, url: str, **kw: object) -> tuple[int, str, str]:
    async with session.get(url, **kw) as resp:  # type: ignore[arg-type]
        return resp.status, resp.headers.get("Content-Type", ""), await resp.text()


def test_fake_controller_satisfies_the_protocol() -> None:
    assert isinstance(FakeController(), Controller)


async def test_metrics_health_and_readiness(
    registry: CollectorRegistry, session: aiohttp.ClientSession
) -> None:
    controller = FakeController()
    healthz, readyz = controller_checks(controller)
    async with HttpServer("127.0.0.1:0", registry=registry, healthz=healthz, readyz=readyz) as srv:
        assert srv.port > 0
        status, ctype, body = await fetch(session, f"{srv.url}/metrics")
        assert status == 200
        assert ctype.startswith("text/plain; version=0.0.4")
        assert 'controller_persistentvolumeclaim_provision_total{class="fast"} 3.0' in body

        assert await fetch(session, f"{srv.url}/healthz") == (
            200,
            "text/plain; charset=utf-8",
            "ok",
        )
        status, _, body = await fetch(session, f"{srv.url}/readyz")
        assert status == 503
        assert "[-]controller failed: controller not ready" in body
        assert body.rstrip().endswith("readyz check failed")

        controller.is_ready = True
        assert (await fetch(session, f"{srv.url}/readyz"))[0::2] == (200, "ok")
        controller.is_healthy = False
        status, _, body = await fetch(session, f"{srv.url}/healthz")
        assert status == 500
        assert "[-]controller failed: controller reports unhealthy" in body


async def test_verbose_lists_every_check(session: aiohttp.ClientSession) -> None:
    checks = {"ping": lambda: None, "informer-sync": lambda: None}
    async with HttpServer("127.0.0.1:0", healthz=checks, readyz=checks) as srv:
        status, _, body = await fetch(session, f"{srv.url}/readyz?verbose")
    assert status == 200
    assert body.splitlines() == ["[+]ping ok", "[+]informer-sync ok", "readyz check passed"]


async def test_failing_and_raising_checks_are_reported(session: aiohttp.ClientSession) -> None:
    def boom() -> str | None:
        raise RuntimeError("token=abc123 expired")

    checks = {"ok": lambda: None, "leader": lambda: "not leading", "boom": boom}
    async with HttpServer("127.0.0.1:0", healthz=checks) as srv:
        status, _, body = await fetch(session, f"{srv.url}/healthz")
    assert status == 500
    lines = body.splitlines()
    assert lines[0] == "[+]ok ok"
    assert lines[1] == "[-]leader failed: not leading"
    assert lines[2].startswith("[-]boom failed: check raised RuntimeError")
    assert "abc123" not in body
    assert lines[3] == "healthz check failed"


async def test_metrics_only_mode(
    registry: CollectorRegistry, session: aiohttp.ClientSession
) -> None:
    async with HttpServer("127.0.0.1:0", registry=registry, metrics_path="/custom") as srv:
        assert (await fetch(session, f"{srv.url}/custom"))[0] == 200
        assert (await fetch(session, f"{srv.url}/metrics"))[0] == 404
        assert (await fetch(session, f"{srv.url}/healthz"))[0] == 404
        assert (await fetch(session, f"{srv.url}/readyz"))[0] == 404


async def test_openmetrics_negotiation(
    registry: CollectorRegistry, session: aiohttp.ClientSession
) -> None:
    async with HttpServer("127.0.0.1:0", registry=registry) as srv:
        status, ctype, body = await fetch(
            session,
            f"{srv.url}/metrics",
            headers={"Accept": "application/openmetrics-text; version=1.0.0"},
        )
    assert status == 200
    assert ctype.startswith("application/openmetrics-text")
    assert body.rstrip().endswith("# EOF")


async def test_all_interfaces_bind_has_one_port(session: aiohttp.ClientSession) -> None:
    async with HttpServer(":0", healthz={}) as srv:
        assert srv.address.host is None
        assert srv.url == f"http://127.0.0.1:{srv.port}"
        assert (await fetch(session, f"{srv.url}/healthz"))[0::2] == (200, "ok")


async def test_stop_releases_the_port(session: aiohttp.ClientSession) -> None:
    srv = HttpServer("127.0.0.1:0", healthz={})
    await srv.start()
    url = f"{srv.url}/healthz"
    assert (await fetch(session, url))[0] == 200
    await srv.stop()
    await srv.stop()  # idempotent
    with pytest.raises(aiohttp.ClientConnectionError):
        await fetch(session, url)


async def test_port_in_use_raises_oserror() -> None:
    async with HttpServer("127.0.0.1:0") as first:
        second = HttpServer(f"127.0.0.1:{first.port}")
        with pytest.raises(OSError, match="in use"):
            await second.start()


def test_port_before_start_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="not started"):
        _ = HttpServer("127.0.0.1:0").port


async def test_leader_election_path_answers_ok_without_leader_election(
    session: aiohttp.ClientSession,
) -> None:
    # Upstream manifests probe /healthz/leader-election for liveness; a controller without
    # leader election passes it rather than 404ing into a restart loop.
    controller = FakeController()
    healthz, readyz = controller_checks(controller)
    async with HttpServer("127.0.0.1:0", healthz=healthz, readyz=readyz) as srv:
        assert await fetch(session, f"{srv.url}/healthz/leader-election") == (
            200,
            "text/plain; charset=utf-8",
            "ok",
        )
        controller.is_healthy = False  # the controller's own check is not part of this path
        assert (await fetch(session, f"{srv.url}/healthz/leader-election"))[0] == 200
        assert (await fetch(session, f"{srv.url}/healthz"))[0] == 500


class StandbyController(FakeController):
    """A controller under leader election; the test sets whether it stands by or is overdue."""

    def __init__(self) -> None:
        super().__init__()
        self.standby = False
        self.overdue: str | None = None

    def standing_by(self) -> bool:
        return self.standby

    def leader_election_check(self, timeout: float) -> str | None:
        assert timeout == 20.0  # csi-lib-utils' DefaultHealthCheckTimeout
        return self.overdue


async def test_a_standby_is_ready_and_an_overdue_leader_is_not_live(
    session: aiohttp.ClientSession,
) -> None:
    from pyprovlib.runtime import CompositeController, LeaderElected

    controller = StandbyController()
    assert isinstance(controller, LeaderElected)
    healthz, readyz = controller_checks(controller)
    async with HttpServer("127.0.0.1:0", healthz=healthz, readyz=readyz) as srv:
        assert (await fetch(session, f"{srv.url}/readyz"))[0] == 503
        controller.standby = True
        assert (await fetch(session, f"{srv.url}/readyz"))[0::2] == (200, "ok")
        controller.overdue = "failed election to renew leadership on lease ns/x"
        status, _, body = await fetch(session, f"{srv.url}/healthz/leader-election")
        assert status == 500
        assert body.splitlines()[0] == (
            "[-]leader-election failed: failed election to renew leadership on lease ns/x"
        )
        assert (await fetch(session, f"{srv.url}/healthz"))[0] == 500

    # Several controllers: a standby as a whole when each is ready or standing by.
    other = StandbyController()
    composite = CompositeController(controller, other)
    other.is_ready = True
    assert composite.standing_by()
    other.is_ready = False
    assert not composite.standing_by()
    assert composite.leader_election_check(20.0) == controller.overdue

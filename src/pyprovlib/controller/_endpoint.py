"""The one diagnostics HTTP server of pyprovlib, on aiohttp: Prometheus metrics and the
Kubernetes-style health endpoints — ``/healthz`` (liveness), ``/healthz/leader-election``
(upstream sidecars' liveness path) and ``/readyz`` (readiness).

A controller used as a library serves it itself (``ProvisionControllerOptions.metrics_port``,
upstream's ``MetricsPort``); :mod:`pyprovlib.runtime` serves the same server for every entry
point (``--http-endpoint``), so both answer alike.

Health responses follow the Kubernetes components' convention: ``ok`` when every check
passes, otherwise one ``[+]name ok`` / ``[-]name failed: reason`` line per check (all lines
are also shown on success with ``?verbose``).
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final, Protocol, Self, runtime_checkable

from prometheus_client import REGISTRY
from prometheus_client.exposition import choose_encoder

from pyprovlib._logging import get_logger
from pyprovlib._redaction import scrub_text

if TYPE_CHECKING:
    # aiohttp's server side (~2 MB of modules) is imported when a server starts, not when a
    # controller module is: most sidecar processes serve no HTTP endpoint (issue 19's RSS).
    from aiohttp import web
    from prometheus_client.registry import CollectorRegistry

__all__ = [
    "LEADER_ELECTION_CHECK",
    "LEADER_ELECTION_HEALTH_TIMEOUT",
    "LEADER_ELECTION_PATH",
    "Check",
    "EndpointServer",
    "HealthReporting",
    "LeaderElectionHealth",
    "controller_checks",
]

Check = Callable[[], str | None]
"""A health check: returns ``None`` when passing, else the reason it fails."""

LEADER_ELECTION_PATH: Final = "/healthz/leader-election"
"""Where csi-lib-utils' leader election serves its health check, the liveness path of the
upstream sidecars' manifests."""
LEADER_ELECTION_CHECK: Final = "leader-election"
"""The name of the leader-election check in ``/healthz`` (and alone at
:data:`LEADER_ELECTION_PATH`)."""
LEADER_ELECTION_HEALTH_TIMEOUT: Final = 20.0
"""How long past the lease duration a leader may go without renewing before the check fails
(csi-lib-utils' ``DefaultHealthCheckTimeout``)."""

log = get_logger(__name__)


class HealthReporting(Protocol):
    """What the health endpoints read from a controller: ``healthy()`` backs ``/healthz``,
    ``ready()`` backs ``/readyz``; both cheap and non-blocking."""

    def healthy(self) -> bool: ...
    def ready(self) -> bool: ...


@runtime_checkable
class LeaderElectionHealth(Protocol):
    """What a controller under leader election adds (the shape of
    :class:`pyprovlib.runtime.LeaderElected`): a healthy standby counts as ready, and a leader
    that stopped renewing its Lease fails ``/healthz/leader-election``."""

    def standing_by(self) -> bool: ...
    def leader_election_check(self, timeout: float) -> str | None: ...


def controller_checks(controller: HealthReporting) -> tuple[dict[str, Check], dict[str, Check]]:
    """The ``/healthz`` and ``/readyz`` checks of a controller.

    ``/healthz``: its ``healthy()``, and the leader-election check (always passing for a
    controller without ``leader_election_check``). ``/readyz``: its ``ready()``, or a healthy
    leader-election standby (``standing_by()``).
    """
    elected = controller if isinstance(controller, LeaderElectionHealth) else None

    def healthy() -> str | None:
        if controller.healthy():
            return None
        return "controller reports unhealthy (stopped, or workers stuck)"

    def leader_election() -> str | None:
        if elected is None:
            return None
        return elected.leader_election_check(LEADER_ELECTION_HEALTH_TIMEOUT)

    def ready() -> str | None:
        if controller.ready():
            return None
        if elected is not None and elected.standing_by():
            return None
        return "controller not ready (caches not synced, or neither leading nor standing by)"

    return (
        {"controller": healthy, LEADER_ELECTION_CHECK: leader_election},
        {"controller": ready},
    )


def _bind(host: str | None, port: int) -> socket.socket:
    # One socket even for all interfaces so port 0 yields one port, not one per address family.
    if host is None or host == "":
        if socket.has_dualstack_ipv6():
            return socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True)
        return socket.create_server(("", port))
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family)


class EndpointServer:
    """Serves metrics, and health checks when given any, on ``host``:``port``.

    ``host`` None (or '') listens on every interface; ``port`` 0 picks a free port
    (:attr:`port` tells which). ``healthz``/``readyz`` map a check name to a :data:`Check`;
    when ``None`` the endpoint is not served. Use as ``async with EndpointServer(...)`` or call
    :meth:`start` and :meth:`stop`.
    """

    def __init__(
        self,
        host: str | None,
        port: int,
        *,
        registry: CollectorRegistry | None = None,
        metrics_path: str = "/metrics",
        healthz: Mapping[str, Check] | None = None,
        readyz: Mapping[str, Check] | None = None,
    ) -> None:
        self.host = host or None
        self.requested_port = port
        self.registry: CollectorRegistry = registry if registry is not None else REGISTRY
        self.metrics_path = metrics_path
        self.healthz = dict(healthz) if healthz is not None else None
        self.readyz = dict(readyz) if readyz is not None else None
        self._runner: web.AppRunner | None = None
        self._port: int | None = None

    @property
    def port(self) -> int:
        """The TCP port the server listens on."""
        if self._port is None:
            raise RuntimeError("the HTTP server is not started")
        return self._port

    @property
    def url(self) -> str:
        """A URL reaching the server from this host (loopback for an all-interfaces bind)."""
        host = self.host or "127.0.0.1"
        if host in ("0.0.0.0", "::"):  # noqa: S104 - comparing, not binding
            host = "127.0.0.1"
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    def _describe_address(self) -> str:
        return f"{self.host or ''}:{self.requested_port}"

    def _app(self) -> web.Application:
        from aiohttp import web  # imported here: see the TYPE_CHECKING import

        app = web.Application()
        app.router.add_get(self.metrics_path, self._metrics)
        if self.healthz is not None:
            app.router.add_get("/healthz", self._make_health("healthz", self.healthz, 500))
            # As upstream: the leader-election check alone, with an "ok" even when the process
            # runs without leader election, so an upstream manifest's liveness probe passes.
            election = {
                name: check for name, check in self.healthz.items() if name == LEADER_ELECTION_CHECK
            }
            app.router.add_get(LEADER_ELECTION_PATH, self._make_health("healthz", election, 500))
        if self.readyz is not None:
            app.router.add_get("/readyz", self._make_health("readyz", self.readyz, 503))
        return app

    async def start(self) -> None:
        """Bind and start serving. Raises :class:`OSError` when the address is unusable."""
        if self._runner is not None:
            raise RuntimeError("the HTTP server is already started")
        from aiohttp import web  # imported here: see the TYPE_CHECKING import

        sock = _bind(self.host, self.requested_port)
        # No access log: Prometheus and kubelet probes would drown the controller's own lines.
        runner = web.AppRunner(self._app(), access_log=None, handle_signals=False)
        await runner.setup()
        try:
            site = web.SockSite(runner, sock)
            await site.start()
        except BaseException:
            await runner.cleanup()
            sock.close()
            raise
        self._runner = runner
        self._port = sock.getsockname()[1]
        log.info(
            "HTTP server listening",
            address=self._describe_address(),
            port=self._port,
            metrics_path=self.metrics_path,
            health=self.healthz is not None,
        )

    async def stop(self) -> None:
        """Stop serving and release the socket; safe to call more than once."""
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def _metrics(self, request: web.Request) -> web.Response:
        from aiohttp import web  # already loaded by start()

        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        body = encoder(self.registry)
        return web.Response(body=body, headers={"Content-Type": content_type})

    def _make_health(
        self, name: str, checks: Mapping[str, Check], fail_status: int
    ) -> Callable[[web.Request], Any]:
        from aiohttp import web  # imported here: see the TYPE_CHECKING import

        async def handler(request: web.Request) -> web.Response:
            lines: list[str] = []
            failed = False
            for check_name, check in checks.items():
                try:
                    reason = check()
                except Exception as err:
                    reason = f"check raised {type(err).__name__}: {err}"
                if reason is None:
                    lines.append(f"[+]{check_name} ok")
                else:
                    failed = True
                    lines.append(f"[-]{check_name} failed: {scrub_text(reason)}")
            if failed:
                lines.append(f"{name} check failed")
                return web.Response(status=fail_status, text="\n".join(lines) + "\n")
            if "verbose" in request.query:
                lines.append(f"{name} check passed")
                return web.Response(text="\n".join(lines) + "\n")
            return web.Response(text="ok")

        return handler

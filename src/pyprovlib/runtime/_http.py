"""The diagnostics HTTP server of every entry point: Prometheus ``/metrics``, ``/healthz``
(liveness), ``/healthz/leader-election`` (upstream sidecars' liveness path) and ``/readyz``
(readiness).

The server itself is :class:`pyprovlib.controller.EndpointServer`, the one a
controller used as a library serves too; this module adds what an entry point needs on top:
the address as the ``--http-endpoint`` flag spells it (``host:port``, ``:port``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyprovlib.controller._endpoint import Check, EndpointServer, controller_checks
from pyprovlib.runtime._flags import HttpAddress, parse_http_address

if TYPE_CHECKING:
    from collections.abc import Mapping

    from prometheus_client.registry import CollectorRegistry

# Check and controller_checks stay importable from here (the entry points' server); the
# leader-election health constants live in pyprovlib.controller._endpoint.
__all__ = ["Check", "HttpServer", "controller_checks"]


class HttpServer(EndpointServer):
    """Serves metrics, and health checks when given any, on ``address`` (an
    :class:`~pyprovlib.runtime._flags.HttpAddress` or its flag form, ``host:port`` or
    ``:port``).

    ``healthz``/``readyz`` map a check name to a :data:`Check`; when ``None`` the endpoint is
    not served (``--metrics-address`` mode). Use as ``async with HttpServer(...) as server``
    or call :meth:`start` and :meth:`stop`; :attr:`port` is the bound port (useful with
    port 0). The checks of a controller come from :func:`controller_checks`.
    """

    def __init__(
        self,
        address: HttpAddress | str,
        *,
        registry: CollectorRegistry | None = None,
        metrics_path: str = "/metrics",
        healthz: Mapping[str, Check] | None = None,
        readyz: Mapping[str, Check] | None = None,
    ) -> None:
        self.address = parse_http_address(address) if isinstance(address, str) else address
        super().__init__(
            self.address.host,
            self.address.port,
            registry=registry,
            metrics_path=metrics_path,
            healthz=healthz,
            readyz=readyz,
        )

    def _describe_address(self) -> str:
        return str(self.address)

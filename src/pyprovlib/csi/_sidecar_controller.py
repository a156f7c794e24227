"""What every CSI sidecar runs: a controller together with the CSI connection it depends on,
as the runtime's Controller (``run``/``stop``/``healthy``/``ready``). Shared by the
attacher, resizer and provisioner sidecars, which only differ in the controller they build
(and, for the provisioner, the background tasks run beside it).

Kept beside the sidecar packages rather than inside :mod:`pyprovlib.csi.provisioner`, which
would load the whole provisioning stack into the attacher and resizer processes."""

from __future__ import annotations

import asyncio
from typing import Any, Generic, Protocol, TypeVar

from prometheus_client import REGISTRY

from pyprovlib.csi._connection import (
    ConnectionOptions,
    CSIConnection,
    CSIMetrics,
    default_csi_metrics,
    parse_endpoint,
)
from pyprovlib.runtime._app import LeaderElected, RuntimeContext, StartupError

__all__ = ["SidecarController", "check_csi_address", "open_driver"]


def check_csi_address(address: str) -> None:
    """Refuse, with one line, a ``--csi-address`` that can never work: malformed, or naming an
    existing file that is not a unix socket (a regular file, a directory), which the wait for
    the driver's socket would otherwise wait on forever. A missing path is fine: the driver
    creates the socket when it starts."""
    try:
        endpoint = parse_endpoint(address)
    except ValueError as err:
        raise StartupError(f"--csi-address: {err}") from None
    path = endpoint.path
    if path is None or not path.exists() or path.is_socket():
        return
    kind = "a directory" if path.is_dir() else "a regular file" if path.is_file() else "a file"
    raise StartupError(
        f"--csi-address {address}: {path} is {kind}, not a unix socket; point --csi-address "
        "at the socket the CSI driver listens on (or remove the file so the driver can create it)"
    )


async def open_driver(ctx: RuntimeContext, **options: Any) -> CSIConnection:
    """A sidecar's connection to its driver, from the parsed flags: ``--csi-address``
    checked, then waited for as upstream does, calls timed out after ``--timeout``, metrics
    in the context's registry. ``options`` are further
    :class:`~pyprovlib.csi.ConnectionOptions` fields."""
    args = ctx.args
    check_csi_address(args.csi_address)
    metrics = default_csi_metrics() if ctx.registry is REGISTRY else CSIMetrics(ctx.registry)
    return await CSIConnection.open(
        args.csi_address, ConnectionOptions(timeout=args.timeout, **options), metrics=metrics
    )


class _Controller(Protocol):
    async def run(self) -> None: ...
    def stop(self) -> None: ...
    def healthy(self) -> bool: ...
    def ready(self) -> bool: ...


C = TypeVar("C", bound=_Controller)


class SidecarController(Generic[C]):
    """Runs ``controller`` and watches ``connection`` (its monitor) until the controller
    returns. A lost connection ends :meth:`run` with
    :class:`~pyprovlib.csi.CSIConnectionLost` (upstream exits so that the pod
    restarts it); the connection is closed when :meth:`run` returns."""

    def __init__(self, connection: CSIConnection, controller: C) -> None:
        self.connection = connection
        self.controller = controller

    async def run(self) -> None:
        """Run the controller and watch the connection until stopped or the connection dies."""
        try:
            async with asyncio.TaskGroup() as tg:
                background = [
                    tg.create_task(self.connection.monitor(), name="csi-monitor"),
                    *self._start_background(tg),
                ]
                await self.controller.run()
                for task in background:
                    task.cancel()
        finally:
            self.connection.close()

    def _start_background(self, tg: asyncio.TaskGroup) -> list[asyncio.Task[None]]:
        """Tasks run beside the controller and cancelled when it returns (none by default)."""
        return []

    def stop(self) -> None:
        """Stop the controller gracefully (operations in flight finish)."""
        self.controller.stop()

    def healthy(self) -> bool:
        """False when the controller failed or the driver connection is lost."""
        return self.controller.healthy() and not self.connection.lost

    def ready(self) -> bool:
        """True while the controller is ready (synced, and leading with leader election)."""
        return self.controller.ready()

    def standing_by(self) -> bool:
        """True while the controller is a healthy leader-election standby."""
        controller: object = self.controller  # the protocol above does not name it
        return (
            isinstance(controller, LeaderElected)
            and controller.standing_by()
            and not self.connection.lost
        )

    def leader_election_check(self, timeout: float) -> str | None:
        """The controller's leader-election health check (healthy when it has none)."""
        controller: object = self.controller
        if isinstance(controller, LeaderElected):
            return controller.leader_election_check(timeout)
        return None

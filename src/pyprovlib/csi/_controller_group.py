"""Several controllers run as one: built without leader election of their own on one shared
informer factory, they run together under one Lease, as one process of upstream runs its
controllers (external-resizer's resize and modify controllers; ``python -m pyprovlib.csi``'s
provisioner, attacher, resizer and modify controllers). Kept beside the sidecar packages, light:
it loads no controller.

:class:`ControllerGroup` is the runtime's Controller for them: while leading (or always, without
leader election) it starts the shared informers, runs ``background`` tasks beside the
controllers and runs the controllers as a :class:`~pyprovlib.runtime.CompositeController`.

Readiness: a standby (leader election on, another replica seen holding the Lease) is ready — it
runs and can take over; the leader is ready once every controller's caches synced.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubernetes_asyncio.client import ApiClient

from pyprovlib.controller._lifecycle import ControllerLifecycle
from pyprovlib.kube._informer import SharedInformerFactory
from pyprovlib.runtime._composite import CompositeController
from pyprovlib.runtime._protocols import Controller

__all__ = ["ControllerGroup", "GroupOptions"]


@dataclass(frozen=True)
class GroupOptions:
    """What the one Lease and the shared informers need (the lifecycle's options)."""

    resync_period: float
    leader_election: bool = False
    leader_election_namespace: str | None = None
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0


class ControllerGroup(ControllerLifecycle):
    """``controllers`` (each built without leader election, on ``informer_factory``) run
    together under the Lease ``lease`` (when ``options.leader_election``), with ``background``
    tasks beside them; ``role`` names the group in logs and the lost-Lease message."""

    def __init__(
        self,
        client: ApiClient,
        informer_factory: SharedInformerFactory,
        controllers: Mapping[str, Controller],
        options: GroupOptions,
        *,
        role: str,
        lease: str,
        log: Any,
        background: Sequence[Callable[[], Awaitable[None]]] = (),
    ) -> None:
        super().__init__(
            client,
            options,
            role=role,
            lease_name=lease,
            log=log,
            informer_factory=informer_factory,
        )
        self.controllers: dict[str, Controller] = dict(controllers)
        self.lease = lease
        self._composite = CompositeController(*self.controllers.values())
        self._background = tuple(background)

    def idle(self, *, count_delayed: bool = False) -> bool:
        """Every controller is idle (see :meth:`ControllerLifecycle.idle`)."""
        return all(
            controller.idle(count_delayed=count_delayed)
            for controller in self.controllers.values()
            if isinstance(controller, ControllerLifecycle)
        )

    async def run(self) -> None:
        """Run until stopped, or the Lease is lost."""
        with self._running():
            self._log.info(
                f"starting {self._role}",
                controllers=list(self.controllers),
                lease=self.lease if self._lifecycle_options.leader_election else None,
            )
            await self._run_elected()
        self._log.info(f"{self._role} stopped")

    async def _run_controller(self) -> None:
        """Informers, background tasks and the controllers, until they return."""
        async with asyncio.TaskGroup() as tg:
            informers = tg.create_task(self._run_shared_informers(), name="informers")
            extra = [
                tg.create_task(_call(work), name="group-background") for work in self._background
            ]
            try:
                self._synced = True
                await self._composite.run()
            finally:
                self._synced = False
                for task in (informers, *extra):
                    task.cancel()

    async def _run_shared_informers(self) -> None:
        async with asyncio.TaskGroup() as tg:
            self.informer_factory.start(tg)
            await asyncio.Event().wait()  # until cancelled with the controllers

    def stop(self) -> None:
        """Stop every controller gracefully (operations in flight finish), then release the
        Lease."""
        super().stop()
        self._composite.stop()

    def healthy(self) -> bool:
        """False when a controller failed or the Lease was lost."""
        return super().healthy() and self._composite.healthy()

    def ready(self) -> bool:
        """A standby is ready; the leader (or a group without leader election) once every
        controller's caches synced."""
        if self._stop_requested.is_set() or self._failed:
            return False
        elector = self._elector
        if self._lifecycle_options.leader_election and (elector is None or not elector.is_leader()):
            # A standby: contending, and another replica is seen holding the Lease.
            return elector is not None and elector.leader not in (None, elector.identity)
        return self._synced and self._composite.ready()

    def is_leader(self) -> bool:
        """True while this process holds the Lease (always, without leader election, once
        running)."""
        if not self._lifecycle_options.leader_election:
            return self._synced
        return self._elector is not None and self._elector.is_leader()


async def _call(work: Callable[[], Awaitable[None]]) -> None:
    await work()

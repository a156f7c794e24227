"""Several controllers run as one: what the runtime's single-controller :func:`run` needs when
a process hosts more than one control loop (e.g. a provisioner beside a resizer)::

    def make_controller(ctx: RuntimeContext) -> CompositeController:
        return CompositeController(
            ProvisionController(ctx.api_client, name, provisioner, options),
            ResizeController(ctx.api_client, resizer, resize_options),
        )
"""

from __future__ import annotations

import asyncio

from pyprovlib.runtime._protocols import Controller, LeaderElected

__all__ = ["CompositeController"]


class CompositeController:
    """Runs ``controllers`` side by side, and is itself a
    :class:`~pyprovlib.runtime.Controller`.

    :meth:`run` runs every controller's ``run()`` in its own task group: when one fails, the
    others are stopped and then cancelled, and the first error propagates as is (not as an
    ``ExceptionGroup``). A controller whose ``run()`` returns without error while no stop was
    requested stops the others as well (the process cannot be half running). :meth:`stop`
    stops all; :meth:`healthy` and :meth:`ready` are true only when they are for all.
    """

    def __init__(self, *controllers: Controller) -> None:
        if not controllers:
            raise ValueError("a CompositeController needs at least one controller")
        self.controllers: tuple[Controller, ...] = controllers
        self._stopping = False

    async def run(self) -> None:
        """Run every controller until all have returned; the first failure stops the rest and
        is re-raised."""
        failures: list[BaseException] = []

        async def one(controller: Controller) -> None:
            try:
                await controller.run()
            except asyncio.CancelledError:
                raise
            except Exception as err:
                failures.append(err)
                self.stop()  # the task group cancels the others right after this
                raise
            if not self._stopping:
                # Returned on its own: take the others down with it.
                self.stop()

        try:
            async with asyncio.TaskGroup() as tg:
                for index, controller in enumerate(self.controllers):
                    tg.create_task(
                        one(controller), name=f"controller-{index}-{type(controller).__name__}"
                    )
        except BaseExceptionGroup:
            if failures:
                raise failures[0] from None
            raise

    def stop(self) -> None:
        """Begin a graceful stop of every controller."""
        self._stopping = True
        for controller in self.controllers:
            controller.stop()

    def healthy(self) -> bool:
        """Every controller is healthy."""
        return all(controller.healthy() for controller in self.controllers)

    def ready(self) -> bool:
        """Every controller is ready."""
        return all(controller.ready() for controller in self.controllers)

    def standing_by(self) -> bool:
        """Every controller is ready or a healthy leader-election standby, and at least one
        is a standby."""
        standby = [_standing_by(controller) for controller in self.controllers]
        return any(standby) and all(
            ready or controller.ready()
            for ready, controller in zip(standby, self.controllers, strict=True)
        )

    def leader_election_check(self, timeout: float) -> str | None:
        """The first failing leader-election check of the controllers, if any."""
        for controller in self.controllers:
            if isinstance(controller, LeaderElected):
                reason = controller.leader_election_check(timeout)
                if reason is not None:
                    return reason
        return None


def _standing_by(controller: Controller) -> bool:
    return isinstance(controller, LeaderElected) and controller.standing_by()

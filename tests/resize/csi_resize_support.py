"""The scenarios of the CSI resizer's and modifier's tests: a Python CSI driver
(:class:`~csi_resize_driver.ResizeDriver`) named like the scenario's driver on a unix socket,
connected to or run with the resizer sidecar, over the resize or the modify scenario's
objects."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, TypeVar

from csi_resize_driver import MODIFY_CAPS, ResizeDriver, ResizeDriverState
from modify_support import ModifyScenario
from prometheus_client import CollectorRegistry
from resize_support import GI, Scenario
from sidecar_support import DriverSidecar

from pyprovlib.controller._resize import ResizeController
from pyprovlib.csi.resizer._main import ResizerSidecar, build
from pyprovlib.csi.resizer._options import parser
from pyprovlib.testing._cluster import TestCluster

S = TypeVar("S", bound="CSIScenario")


class CSIScenario(Scenario, DriverSidecar):
    """A Python CSI driver named like the scenario's driver, on a unix socket (``driver``:
    the driver's options)."""

    sidecar_module = "pyprovlib.csi.resizer"

    def __init__(self, cluster: TestCluster, socket: Path, **driver: Any) -> None:
        super().__init__(cluster)
        self.driver_process = ResizeDriver(self.driver, socket, **driver)
        self.endpoint = self.driver_process.endpoint
        self.registry = CollectorRegistry()
        self.controller: ResizeController[Any] | None = None  # set by the ``resizing`` fixture

    @property
    def state(self) -> ResizeDriverState:
        return self.driver_process.state

    async def volume(
        self, storage_class: str | None = None, /, **kwargs: Any
    ) -> tuple[str, str, str]:
        """:meth:`bound_claim`, its volume 1Gi in the driver."""
        return self.in_driver(await self.bound_claim(storage_class, **kwargs))

    def in_driver(self, volume: tuple[str, str, str]) -> tuple[str, str, str]:
        """``volume`` (claim, pv, handle), its handle made a 1Gi volume of the driver."""
        self.state.sizes[volume[2]] = GI
        return volume

    async def build_sidecar(self, *argv: str) -> ResizerSidecar:
        """The sidecar ``python -m pyprovlib.csi.resizer`` builds on this driver (running),
        ``argv`` added to its flags."""
        sidecar = await build(self.context(parser(), *argv))
        assert isinstance(sidecar, ResizerSidecar)
        return sidecar


class CSIModifyScenario(ModifyScenario, CSIScenario):
    """:class:`CSIScenario` (a driver that can modify volumes unless ``capabilities`` say
    otherwise) with the modify scenario's classes and claims."""

    def __init__(self, cluster: TestCluster, socket: Path, **driver: Any) -> None:
        driver.setdefault("capabilities", MODIFY_CAPS)
        super().__init__(cluster, socket, **driver)

    async def volume(self, vac: str | None = None, /, **kwargs: Any) -> tuple[str, str, str]:
        """:meth:`claim_with_class`, its volume 1Gi in the driver."""
        return self.in_driver(await self.claim_with_class(vac, **kwargs))


@contextlib.asynccontextmanager
async def serving(
    kind: type[S], cluster: TestCluster, sock_dir: Path, **driver: Any
) -> AsyncIterator[S]:
    """A ``kind`` scenario with its driver serving on ``sock_dir/csi.sock`` for the block."""
    scenario = kind(cluster, sock_dir / "csi.sock", **driver)
    async with scenario.driver_process:
        yield scenario

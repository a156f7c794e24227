"""Shared pieces of the modify controller tests: an in-Python Modifier backend, class and claim
builders, and the claim's modification state at a glance. Objects get unique names so the tests
also run against a real cluster."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

from kubernetes_asyncio.client import V1PersistentVolume
from resize_support import Scenario, status
from sidecar_support import fast_values, running

from pyprovlib._attacher import GrpcCode
from pyprovlib._modifier import Modifier, ModifyError
from pyprovlib.controller._modify import ModifyController, ModifyControllerOptions
from pyprovlib.kube._objects import Obj
from pyprovlib.kube._resources import (
    VOLUME_ATTRIBUTES_CLASSES,
)
from pyprovlib.kube._rest import ResourceClient


class MemoryModifier(Modifier):
    """A backend keeping each volume's attributes in a dict. ``errors`` are raised (one per
    call, in order); ``gate``, when set, holds every call until it is opened."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.attributes: dict[str, dict[str, str]] = {}
        self.calls: list[tuple[str, dict[str, str]]] = []
        self.errors: list[BaseException] = []
        self.gate: asyncio.Event | None = None

    def can_support(self, pv: V1PersistentVolume) -> bool:
        csi = pv.spec.csi if pv.spec else None
        return csi is not None and csi.driver == self.name

    async def modify(self, pv: V1PersistentVolume, parameters: Mapping[str, str]) -> None:
        handle = pv.spec.csi.volume_handle
        self.calls.append((handle, dict(parameters)))
        if self.gate is not None:
            await self.gate.wait()
        if self.errors:
            raise self.errors.pop(0)
        self.attributes.setdefault(handle, {}).update(parameters)


def fast_options(**kwargs: Any) -> ModifyControllerOptions:
    """Options for tests: millisecond retries, a private metrics registry."""
    return ModifyControllerOptions(**fast_values(0.3, kwargs))


def controller(cluster: Any, modifier: Modifier, **options: Any) -> ModifyController[Any]:
    return ModifyController(cluster.api_client, modifier, fast_options(**options))


def modify_state(pvc: Mapping[str, Any]) -> tuple[str | None, str | None, str | None]:
    """(``modifyVolumeStatus.status``, its target, ``currentVolumeAttributesClassName``)."""
    st = status(pvc)
    mvs = st.get("modifyVolumeStatus") or {}
    return (
        mvs.get("status"),
        mvs.get("targetVolumeAttributesClassName"),
        st.get("currentVolumeAttributesClassName"),
    )


def condition_types(pvc: Mapping[str, Any]) -> list[str]:
    return sorted(str(c.get("type")) for c in status(pvc).get("conditions") or [])


class ModifyScenario(Scenario):
    """A driver name, classes and bound claims for one test (``args`` go on to the next
    class of a subclass's bases)."""

    def __init__(self, cluster: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(cluster, *args, **kwargs)
        self.vacs = ResourceClient(cluster.api_client, VOLUME_ATTRIBUTES_CLASSES)

    async def vac(
        self, parameters: Mapping[str, str], *, driver: str | None = None, name: str = ""
    ) -> str:
        name = name or self.name("vac")
        self.cluster.track(VOLUME_ATTRIBUTES_CLASSES, name)
        await self.vacs.create(
            {
                "apiVersion": "storage.k8s.io/v1",
                "kind": "VolumeAttributesClass",
                "metadata": {"name": name},
                "driverName": driver or self.driver,
                "parameters": dict(parameters),
            }
        )
        return name

    async def claim_with_class(
        self,
        vac: str | None,
        *,
        driver: str | None = None,
        handle: str | None = None,
        annotations: Mapping[str, str] | None = None,
        csi_extra: Mapping[str, Any] | None = None,
    ) -> tuple[str, str, str]:
        """A statically provisioned CSI volume of class ``vac`` pre-bound to a claim of the same
        class, both Bound (the PV controller copies the class into the claim's status).
        Returns (claim, pv, volume handle)."""
        spec_extra = {"volumeAttributesClassName": vac} if vac else {}
        return await self.bound_claim(
            "pyprovlib-modify-static",
            driver=driver,
            handle=handle,
            annotations=annotations,
            csi_extra=csi_extra,
            spec_extra=spec_extra,
        )

    async def set_class(self, claim: str, vac: str | None) -> Obj:
        """The user's edit of the claim's class."""
        return await self.pvcs.patch(
            claim, {"spec": {"volumeAttributesClassName": vac}}, namespace=self.namespace
        )

    async def wait_state(
        self, claim: str, state: tuple[str | None, str | None, str | None], timeout: float = 15.0
    ) -> Obj:
        return await self.wait_claim(
            claim, lambda c: modify_state(c) == state, f"claim {claim} at {state}", timeout
        )

    async def pv_class(self, pv: str) -> str | None:
        value = ((await self.get_pv(pv)).get("spec") or {}).get("volumeAttributesClassName")
        return value if isinstance(value, str) else None


@contextlib.asynccontextmanager
async def made_infeasible(
    s: ModifyScenario, claim: str, bad: str, current: str | None
) -> AsyncIterator[tuple[ModifyController[Any], MemoryModifier]]:
    """A modify controller (retrying slowly) over a backend that refuses its first call as
    InvalidArgument, running for the block from when ``claim``, of class ``current``, asked
    for ``bad``, is Infeasible."""
    backend = MemoryModifier(s.driver)
    backend.errors = [ModifyError("invalid", code=GrpcCode.INVALID_ARGUMENT)]
    ctrl = controller(s.cluster, backend, retry_interval_max=60.0)
    async with running(ctrl):
        await s.set_class(claim, bad)
        await s.wait_state(claim, ("Infeasible", bad, current))
        yield ctrl, backend

"""Shared pieces of the resizer tests: an in-Python Resizer backend, object builders, polling
and event helpers. Objects get unique names so the tests also run against a real cluster."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from kubernetes_asyncio.client import V1PersistentVolume
from kubernetes_asyncio.client.exceptions import ApiException
from sidecar_support import fast_values, wait_for

from pyprovlib import testing
from pyprovlib._resizer import ExpansionResult, Resizer
from pyprovlib.controller._resize import ResizeController
from pyprovlib.controller._resize.options import ResizeControllerOptions
from pyprovlib.kube._objects import Obj
from pyprovlib.kube._resources import (
    EVENTS,
    PERSISTENT_VOLUME_CLAIMS,
    PERSISTENT_VOLUMES,
    PODS,
    SECRETS,
    STORAGE_CLASSES,
)
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.testing._cluster import TestCluster

T = TypeVar("T")

GI = 1024**3


class MemoryResizer(Resizer):
    """A backend keeping sizes in a dict. ``errors`` are raised (one per call, in order);
    ``node_expansion_required`` is returned with each success."""

    def __init__(self, name: str, *, node_expansion_required: bool = False) -> None:
        self.name = name
        self.sizes: dict[str, int] = {}
        self.calls: list[tuple[str, int]] = []
        self.errors: list[BaseException] = []
        self.node_expansion_required = node_expansion_required
        self.gate: asyncio.Event | None = None

    def can_support(self, pv: V1PersistentVolume) -> bool:
        csi = pv.spec.csi if pv.spec else None
        return csi is not None and csi.driver == self.name

    async def expand(self, pv: V1PersistentVolume, new_size: int) -> ExpansionResult:
        handle = pv.spec.csi.volume_handle
        self.calls.append((handle, new_size))
        if self.gate is not None:
            await self.gate.wait()
        if self.errors:
            raise self.errors.pop(0)
        self.sizes[handle] = max(self.sizes.get(handle, 0), new_size)
        return ExpansionResult(self.sizes[handle], self.node_expansion_required)


def fast_options(**kwargs: Any) -> ResizeControllerOptions:
    """Options for tests: millisecond retries, a private metrics registry."""
    return ResizeControllerOptions(**fast_values(0.2, kwargs))


def status(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    value = obj.get("status")
    return value if isinstance(value, Mapping) else {}


def conditions(pvc: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {str(c.get("type")): c for c in status(pvc).get("conditions") or []}


def capacity(pvc: Mapping[str, Any]) -> str | None:
    """``status.capacity.storage`` of a claim."""
    value = (status(pvc).get("capacity") or {}).get("storage")
    return value if isinstance(value, str) else None


class Scenario:
    """A driver name and object helpers for one test."""

    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster
        self.namespace = cluster.namespace
        self.driver = f"{cluster.unique_name('resize')}.test.pyprovlib.io"
        api = cluster.api_client
        self.classes = ResourceClient(api, STORAGE_CLASSES)
        self.pvs = ResourceClient(api, PERSISTENT_VOLUMES)
        self.pvcs = ResourceClient(api, PERSISTENT_VOLUME_CLAIMS)
        self.secrets = ResourceClient(api, SECRETS)
        self.events_client = ResourceClient(api, EVENTS)
        self.pods = ResourceClient(api, PODS)

    def name(self, prefix: str) -> str:
        return str(self.cluster.unique_name(prefix))

    async def storage_class(
        self,
        *,
        allow_expansion: bool | None = True,
        provisioner: str | None = None,
        parameters: Mapping[str, str] | None = None,
    ) -> str:
        name = self.name("sc")
        body: Obj = {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": name},
            "provisioner": provisioner or self.driver,
            "reclaimPolicy": "Retain",
            "volumeBindingMode": "Immediate",
        }
        if allow_expansion is not None:
            body["allowVolumeExpansion"] = allow_expansion
        if parameters:
            body["parameters"] = dict(parameters)
        self.cluster.track(STORAGE_CLASSES, name)
        await self.classes.create(body)
        return name

    async def secret(self, name: str, data: Mapping[str, str]) -> None:
        await self.secrets.create(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": name, "namespace": self.namespace},
                "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
            }
        )

    async def bound_claim(
        self,
        storage_class: str | None = None,
        *,
        size: str = "1Gi",
        handle: str | None = None,
        driver: str | None = None,
        csi_extra: Mapping[str, Any] | None = None,
        bind: bool = False,
        volume_mode: str = "Filesystem",
        annotations: Mapping[str, str] | None = None,
        spec_extra: Mapping[str, Any] | None = None,
    ) -> tuple[str, str, str]:
        """A statically provisioned CSI PV pre-bound to a claim, both Bound (by the in-memory
        binder or the real PV controller; by this method itself with ``bind``, as the PV
        controller would); ``annotations`` on the PV, ``spec_extra`` in both specs. Returns
        (claim, pv, volume handle). Of ``storage_class``, by default a new class of the driver
        that allows expansion."""
        if storage_class is None:
            storage_class = await self.storage_class()
        claim, pv = self.name("claim"), self.name("pv")
        handle = handle or self.name("vol")
        csi: Obj = {"driver": driver or self.driver, "volumeHandle": handle}
        csi.update(csi_extra or {})
        self.cluster.track(PERSISTENT_VOLUMES, pv)
        await self.pvs.create(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": pv, "annotations": dict(annotations or {})},
                "spec": {
                    "capacity": {"storage": size},
                    "accessModes": ["ReadWriteOnce"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "storageClassName": storage_class,
                    "volumeMode": volume_mode,
                    "claimRef": {"namespace": self.namespace, "name": claim},
                    "csi": csi,
                    **(spec_extra or {}),
                },
            }
        )
        await self.pvcs.create(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": claim, "namespace": self.namespace},
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": size}},
                    "storageClassName": storage_class,
                    "volumeMode": volume_mode,
                    "volumeName": pv,
                    **(spec_extra or {}),
                },
            }
        )
        if bind:
            c = await self.get_claim(claim)
            v = await self.get_pv(pv)
            v["spec"]["claimRef"]["uid"] = c["metadata"]["uid"]
            v = await self.pvs.replace(v)
            v["status"] = {"phase": "Bound"}
            await self.pvs.replace_status(v)
            c["status"] = {
                "phase": "Bound",
                "accessModes": ["ReadWriteOnce"],
                "capacity": {"storage": size},
            }
            await self.pvcs.replace_status(c)

        async def bound() -> bool:
            c = await self.get_claim(claim)
            return status(c).get("phase") == "Bound" and capacity(c) is not None

        await wait_for(bound, 30, f"claim {claim} Bound")
        return claim, pv, handle

    async def settled(self, ctrl: Any, *claims: str) -> None:
        """Wait until ``ctrl`` has seen ``claims`` as they are now (and their PVs) and has no
        work left — and so has the in-memory server's PV binder, playing the PV controller:
        the point for asserting that neither did anything more."""
        seen: list[Obj] = []
        for name in claims:
            claim = await self.get_claim(name)
            seen.append(claim)
            if pv := (claim.get("spec") or {}).get("volumeName"):
                seen.append(await self.get_pv(pv))
        await testing.wait_idle(ctrl, *seen)
        server = getattr(self.cluster, "server", None)
        if server is not None and server.binder is not None:
            await testing.wait_idle(server.binder, *seen)

    async def get_claim(self, name: str) -> Obj:
        return await self.pvcs.get(name, self.namespace)

    async def get_pv(self, name: str) -> Obj:
        return await self.pvs.get(name)

    async def request(self, claim: str, size: str) -> None:
        """Change the claim's storage request (the user's edit)."""
        await self.pvcs.patch(
            claim,
            {"spec": {"resources": {"requests": {"storage": size}}}},
            namespace=self.namespace,
        )

    async def expand(self, claim: str, size: str, timeout: float = 15.0) -> Obj:
        """Request ``size`` for ``claim`` (the user's edit); the claim once its capacity is
        ``size``."""
        await self.request(claim, size)
        return await self.wait_claim(
            claim, lambda c: capacity(c) == size, f"claim {claim} expanded to {size}", timeout
        )

    async def events(self, claim: str) -> list[Obj]:
        """The claim's events, oldest first."""
        items = (await self.events_client.list(self.namespace)).get("items") or []
        mine = [e for e in items if (e.get("involvedObject") or {}).get("name") == claim]
        return sorted(mine, key=lambda e: str(e.get("firstTimestamp") or ""))

    async def leaks(self, claim: str, secret: str, *objects: Obj) -> list[str]:
        """The messages of ``claim``'s events, and ``objects`` as text, that show ``secret``."""
        texts = [str(e.get("message")) for e in await self.events(claim)]
        return [t for t in texts + [str(o) for o in objects] if secret in t]

    async def reasons(self, claim: str) -> list[str]:
        return [str(e.get("reason")) for e in await self.events(claim)]

    async def wait_event(self, claim: str, reason: str, timeout: float = 15.0) -> Obj:
        async def find() -> Obj | None:
            for event in await self.events(claim):
                if event.get("reason") == reason:
                    return event
            return None

        return await wait_for(find, timeout, f"event {reason} on {claim}")

    async def wait_claim(
        self, claim: str, check: Callable[[Obj], bool], message: str, timeout: float = 15.0
    ) -> Obj:
        async def probe() -> Obj | None:
            c = await self.get_claim(claim)
            return c if check(c) else None

        return await wait_for(probe, timeout, message)


async def get_or_none(
    client: ResourceClient, name: str, namespace: str | None = None
) -> Obj | None:
    try:
        return await client.get(name, namespace)
    except ApiException as err:
        if err.status == 404:
            return None
        raise


def controller(cluster: Any, resizer: Resizer, **options: Any) -> ResizeController:
    return ResizeController(cluster.api_client, resizer, fast_options(**options))


class BinderlessCluster:
    """The in-memory API server without its PV binder, for the steps where the binder's
    claim-status updates would differ from Kubernetes' PV controller; the test binds the pair
    itself (:meth:`Scenario.bound_claim` with ``bind=True``). Same attributes as TestCluster."""

    is_real = False

    def __init__(self) -> None:
        from pyprovlib.testing._server import ApiServer

        self.server = ApiServer(binder=False)
        self.namespace = TestCluster.unique_name("pyprovlib-resize")
        self._client: Any = None

    @property
    def api_client(self) -> Any:
        return self._client

    unique_name = staticmethod(TestCluster.unique_name)

    def track(self, resource: object, name: str) -> None:
        """Nothing to clean up: the server goes away with the test."""

    def require_in_memory(self, reason: str) -> None:
        """Always in memory."""

    async def __aenter__(self) -> BinderlessCluster:
        await self.server.start()
        self._client = self.server.api_client()
        from pyprovlib.kube._resources import NAMESPACES

        await ResourceClient(self._client, NAMESPACES).create(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.namespace}}
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._client.close()
        await self.server.stop()

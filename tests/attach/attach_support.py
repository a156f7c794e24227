"""Shared pieces of the attacher tests: an in-Python Attacher backend, object builders and
polling helpers. Objects get unique names so the tests also run against a real cluster."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException
from sidecar_support import fast_values, wait_for

from pyprovlib._attacher import Attacher, AttachNode, AttachVolume
from pyprovlib.controller._attach import AttachController
from pyprovlib.controller._attach.options import AttachControllerOptions, finalizer_name
from pyprovlib.kube._objects import Obj
from pyprovlib.kube._resources import (
    CSINODES,
    PERSISTENT_VOLUMES,
    SECRETS,
    VOLUME_ATTACHMENTS,
)
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.testing._cluster import TestCluster

T = TypeVar("T")


@dataclass
class Call:
    """One call the backend received."""

    op: str
    volume: AttachVolume
    node: AttachNode
    readonly: bool = False
    context: Mapping[str, str] = field(default_factory=dict)


class MemoryAttacher(Attacher):
    """A backend keeping attachments in a set. ``attach_errors``/``detach_errors`` are raised
    (one per call, in order) before anything happens; ``attach_gate`` (when set) makes attach
    wait for it, to play a slow backend. ``publish_context`` is returned by attach."""

    def __init__(self, publish_context: Mapping[str, str] | None = None) -> None:
        self.attached: set[tuple[str, str]] = set()
        self.calls: list[Call] = []
        self.attach_errors: list[BaseException] = []
        self.detach_errors: list[BaseException] = []
        self.attach_gate: asyncio.Event | None = None
        self.publish_context = dict(publish_context or {"device": "/dev/fake0"})

    def count(self, op: str) -> int:
        return sum(1 for c in self.calls if c.op == op)

    async def attach(
        self,
        volume: AttachVolume,
        node: AttachNode,
        readonly: bool,
        context: Mapping[str, str],
    ) -> Mapping[str, str]:
        self.calls.append(Call("attach", volume, node, readonly, dict(context)))
        if self.attach_errors:
            raise self.attach_errors.pop(0)
        if self.attach_gate is not None:
            await self.attach_gate.wait()
        self.attached.add((volume.volume_id, node.node_id))
        return self.publish_context

    async def detach(self, volume: AttachVolume, node: AttachNode) -> None:
        self.calls.append(Call("detach", volume, node))
        if self.detach_errors:
            raise self.detach_errors.pop(0)
        self.attached.discard((volume.volume_id, node.node_id))


class ListingAttacher(MemoryAttacher):
    """A :class:`MemoryAttacher` that can list what it published (turns the reconciler on)."""

    async def list_published(self) -> Mapping[str, Sequence[str]]:
        published: dict[str, list[str]] = {}
        for volume_id, node_id in self.attached:
            published.setdefault(volume_id, []).append(node_id)
        return published


def fast_options(**kwargs: Any) -> AttachControllerOptions:
    """Options for tests: millisecond retries, a private metrics registry."""
    return AttachControllerOptions(**fast_values(0.1, kwargs))


def driver_name(cluster: TestCluster) -> str:
    """A driver name unique to the test (with characters the finalizer name sanitizes)."""
    return f"{cluster.unique_name('attach')}.test.pyprovlib.io"


class Objects:
    """Builds and reads the objects of one test (cluster-scoped ones are tracked for
    cleanup on a real cluster)."""

    def __init__(self, cluster: TestCluster, driver: str) -> None:
        self.cluster = cluster
        self.driver = driver
        api: ApiClient = cluster.api_client
        self.vas = ResourceClient(api, VOLUME_ATTACHMENTS)
        self.pvs = ResourceClient(api, PERSISTENT_VOLUMES)
        self.csinodes = ResourceClient(api, CSINODES)
        self.secrets = ResourceClient(api, SECRETS)

    async def csinode(self, node: str, node_id: str) -> None:
        self.cluster.track(CSINODES, node)
        await self.csinodes.create(
            {
                "apiVersion": "storage.k8s.io/v1",
                "kind": "CSINode",
                "metadata": {"name": node},
                "spec": {"drivers": [{"name": self.driver, "nodeID": node_id}]},
            }
        )

    async def secret(self, name: str, data: Mapping[str, str]) -> None:
        await self.secrets.create(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": name, "namespace": self.cluster.namespace},
                "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
            }
        )

    async def pv(
        self,
        name: str,
        handle: str,
        *,
        secret: str | None = None,
        attributes: Mapping[str, str] | None = None,
        read_only: bool = False,
        access_modes: Sequence[str] = ("ReadWriteOnce",),
        volume_mode: str = "Filesystem",
        fs_type: str | None = None,
        finalizers: Sequence[str] = (),
    ) -> Obj:
        csi: Obj = {"driver": self.driver, "volumeHandle": handle}
        if attributes:
            csi["volumeAttributes"] = dict(attributes)
        if read_only:
            csi["readOnly"] = True
        if fs_type:
            csi["fsType"] = fs_type
        if secret:
            csi["controllerPublishSecretRef"] = {
                "name": secret,
                "namespace": self.cluster.namespace,
            }
        metadata: Obj = {"name": name}
        if finalizers:
            metadata["finalizers"] = list(finalizers)
        self.cluster.track(PERSISTENT_VOLUMES, name)
        return await self.pvs.create(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": metadata,
                "spec": {
                    "capacity": {"storage": "1Gi"},
                    "accessModes": list(access_modes),
                    "persistentVolumeReclaimPolicy": "Retain",
                    "volumeMode": volume_mode,
                    "csi": csi,
                },
            }
        )

    async def va(
        self,
        name: str,
        node: str,
        *,
        pv: str | None = None,
        inline: Obj | None = None,
        attacher: str | None = None,
    ) -> Obj:
        source: Obj = {"persistentVolumeName": pv} if pv else {"inlineVolumeSpec": inline}
        self.cluster.track(VOLUME_ATTACHMENTS, name)
        return await self.vas.create(
            {
                "apiVersion": "storage.k8s.io/v1",
                "kind": "VolumeAttachment",
                "metadata": {"name": name},
                "spec": {
                    "attacher": attacher or self.driver,
                    "nodeName": node,
                    "source": source,
                },
            }
        )

    async def get_va(self, name: str) -> Obj | None:
        return await _get(self.vas, name)

    async def get_pv(self, name: str) -> Obj | None:
        return await _get(self.pvs, name)

    async def wait_va(
        self, name: str, check: Callable[[Obj], bool], message: str, timeout: float = 15.0
    ) -> Obj:
        async def probe() -> Obj | None:
            va = await self.get_va(name)
            return va if va is not None and check(va) else None

        return await wait_for(probe, timeout, message)

    async def wait_error(self, name: str, field: str = "attachError") -> Obj:
        """The VolumeAttachment ``name`` once its status has ``field`` (``attachError`` or
        ``detachError``)."""
        return await self.wait_va(name, lambda v: field in status(v), f"{field} recorded")

    async def wait_va_gone(self, name: str) -> None:
        async def gone() -> bool:
            return await self.get_va(name) is None

        await wait_for(gone, message=f"VolumeAttachment {name} gone")

    async def wait_pv_gone(self, name: str) -> None:
        async def gone() -> bool:
            return await self.get_pv(name) is None

        await wait_for(gone, message=f"PersistentVolume {name} gone")


async def _get(client: ResourceClient, name: str) -> Obj | None:
    try:
        return await client.get(name)
    except ApiException as err:
        if err.status == 404:
            return None
        raise


def status(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    value = obj.get("status")
    return value if isinstance(value, Mapping) else {}


def finalizers(obj: Mapping[str, Any]) -> list[str]:
    return list((obj.get("metadata") or {}).get("finalizers") or [])


def is_attached(va: Mapping[str, Any]) -> bool:
    return status(va).get("attached") is True


class Scenario:
    """A driver name, a node with a CSINode, and object helpers for one test."""

    def __init__(self, cluster: TestCluster) -> None:
        self.cluster = cluster
        self.driver = driver_name(cluster)
        self.finalizer = finalizer_name(self.driver)
        self.objects = Objects(cluster, self.driver)
        self.node = cluster.unique_name("node")
        self.node_id = f"id-of-{self.node}"

    def name(self, prefix: str) -> str:
        return self.cluster.unique_name(prefix)

    async def setup_node(self) -> None:
        await self.objects.csinode(self.node, self.node_id)

    def controller(self, attacher: MemoryAttacher | None, **options: Any) -> AttachController:
        return AttachController(
            self.cluster.api_client, self.driver, attacher, fast_options(**options)
        )

    async def attached_va(self, va_name: str) -> dict[str, Any]:
        return await self.objects.wait_va(va_name, is_attached, f"{va_name} attached")

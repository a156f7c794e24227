"""What the modules of the CSI provisioner share: the error for a request that could not be
built, and reads through the sidecar's informer caches."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from kubernetes_asyncio.client import ApiClient

from pyprovlib._provisioner import ProvisioningError, ProvisioningState
from pyprovlib.kube._errors import ApiException
from pyprovlib.kube._informer import SharedInformerFactory
from pyprovlib.kube._objects import Obj
from pyprovlib.kube._resources import Resource
from pyprovlib.kube._rest import ResourceClient

__all__ = ["CachedReader", "ObjectReader", "PreparationError", "StaticReader"]


class PreparationError(ProvisioningError):
    """The request could not be built: nothing was sent to the driver (NO_CHANGE)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, ProvisioningState.NO_CHANGE)


class ObjectReader(Protocol):
    """Reads one cluster-scoped resource."""

    async def get(self, name: str) -> Obj:
        """The object (ApiException 404 when it does not exist)."""
        ...

    async def list(self) -> list[Obj]:
        """Every object."""
        ...


class StaticReader:
    """Fixed objects instead of a watch (upstream's node deployment: this node's Node and
    CSINode as its driver describes them, so no instance watches every Node)."""

    def __init__(self, objects: Iterable[Obj]) -> None:
        self._objects = {str((o.get("metadata") or {}).get("name")): o for o in objects}

    async def get(self, name: str) -> Obj:
        """The object (ApiException 404 when it is not one of them)."""
        try:
            return self._objects[name]
        except KeyError:
            raise ApiException(status=404, reason="Not Found") from None

    async def list(self) -> list[Obj]:
        """Every object."""
        return list(self._objects.values())


class CachedReader:
    """Reads one cluster-scoped resource from an informer's cache once it has synced (like
    upstream's listers), else from the API server."""

    def __init__(
        self, client: ApiClient, resource: Resource, factory: SharedInformerFactory | None
    ) -> None:
        self.rest = ResourceClient(client, resource)
        self.informer = factory.informer_for(resource) if factory is not None else None

    async def get(self, name: str) -> Obj:
        """The object (ApiException 404 when it does not exist)."""
        if self.informer is not None and self.informer.has_synced():
            cached = self.informer.store.get_by_key(name)
            if cached is not None:
                return cached
            # A miss may be a cache behind the API server (a Node that just registered):
            # ask the server before acting on it, e.g. rescheduling the claim.
        return await self.rest.get(name)

    async def list(self) -> list[Obj]:
        """Every object."""
        if self.informer is not None and self.informer.has_synced():
            return self.informer.store.list()
        items: list[Obj] = (await self.rest.list()).get("items") or []
        return items

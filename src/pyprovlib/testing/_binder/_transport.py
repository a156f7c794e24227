"""How the PV binder reaches the API server: raw JSON requests and watch streams, over HTTP
(a kubernetes-asyncio ``ApiClient``) or over the in-memory server's in-process transport, and
the :class:`~pyprovlib.kube._informer.ListerWatcher` that lets the library's informers run on
the latter."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

import aiohttp
from kubernetes_asyncio.client import ApiClient

from pyprovlib.kube._config import check_status, request_json, send_request
from pyprovlib.kube._objects import Obj
from pyprovlib.kube._resources import PERSISTENT_VOLUME_CLAIMS, Resource
from pyprovlib.kube._rest import check_watch_event, list_query, watch_query
from pyprovlib.testing._binder._objects import ANN_SELECTED_NODE

__all__ = ["BinderTransport", "HttpTransport", "TransportListerWatcher", "set_selected_node"]


class BinderTransport(Protocol):
    """How the binder talks to the API server: JSON requests and watch streams. Errors are
    kubernetes-asyncio ``ApiException``s (status, body, headers), as over HTTP."""

    async def json(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> Obj:
        """Send one request; the JSON object of a 2xx answer, else raise ApiException."""
        ...

    def stream(
        self, path: str, *, query: Mapping[str, Any] | None = None
    ) -> AbstractAsyncContextManager[AsyncIterator[bytes]]:
        """Open a watch: its bytes (newline-separated JSON events) until the server ends it."""
        ...


class HttpTransport:
    """:class:`BinderTransport` over a kubernetes-asyncio ApiClient (the production request
    path of :func:`pyprovlib.kube._config.send_request`)."""

    def __init__(self, api_client: ApiClient) -> None:
        self.api = api_client

    async def json(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> Obj:
        """Send one request; the JSON object of a 2xx answer, else raise ApiException."""
        return await request_json(
            self.api, method, path, body=body, content_type=content_type, query=_pairs(query)
        )

    @contextlib.asynccontextmanager
    async def stream(
        self, path: str, *, query: Mapping[str, Any] | None = None
    ) -> AsyncIterator[AsyncIterator[bytes]]:
        """Open a watch: its bytes until the server ends it."""
        resp = await send_request(
            self.api,
            "GET",
            path,
            query=_pairs(query),
            request_timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=None),
        )
        await check_status(resp)
        try:
            yield resp.content.iter_any()
        finally:
            resp.close()


def _pairs(query: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    return [(k, str(v)) for k, v in (query or {}).items()]


class TransportListerWatcher:
    """A :class:`~pyprovlib.kube._informer.ListerWatcher` of one cluster-wide collection over a
    :class:`BinderTransport`, so a :class:`~pyprovlib.kube.SharedInformer` can run on
    the in-memory server's in-process transport."""

    def __init__(self, transport: BinderTransport, resource: Resource) -> None:
        self.transport = transport
        self.resource = resource

    async def list(
        self, *, resource_version: str | None, limit: int | None, continue_: str | None
    ) -> Obj:
        """One LIST page."""
        query = list_query(limit=limit, continue_=continue_, resource_version=resource_version)
        return await self.transport.json("GET", self.resource.path(), query=dict(query))

    @contextlib.asynccontextmanager
    async def watch(
        self, *, resource_version: str, timeout_seconds: int | None, allow_bookmarks: bool
    ) -> AsyncIterator[AsyncIterator[Obj]]:
        """One WATCH: its events, ERROR events raised as ``WatchExpiredError``/``WatchError``."""
        query = watch_query(
            resource_version=resource_version or None,
            timeout_seconds=timeout_seconds,
            allow_bookmarks=allow_bookmarks,
        )
        async with self.transport.stream(self.resource.path(), query=dict(query)) as chunks:
            events = _events(chunks)
            try:
                yield events
            finally:
                await events.aclose()


async def _events(chunks: AsyncIterator[bytes]) -> AsyncGenerator[Obj, None]:
    buf = b""
    async for chunk in chunks:
        # Split each chunk once: a chunk may hold a whole backlog of events.
        lines = (buf + chunk).split(b"\n")
        buf = lines.pop()
        for line in lines:
            if not line.strip():
                continue
            event = json.loads(line)
            if not isinstance(event, dict):
                continue
            yield check_watch_event(event)


async def set_selected_node(
    api_client: ApiClient, namespace: str, claim_name: str, node_name: str
) -> Obj:
    """Annotate a claim with ``volume.kubernetes.io/selected-node`` (merge patch), as the
    scheduler does when it places the first pod using a ``WaitForFirstConsumer`` claim.
    Returns the patched claim."""
    patch = {"metadata": {"annotations": {ANN_SELECTED_NODE: node_name}}}
    return await HttpTransport(api_client).json(
        "PATCH",
        PERSISTENT_VOLUME_CLAIMS.path(namespace, claim_name),
        body=patch,
        content_type="application/merge-patch+json",
    )

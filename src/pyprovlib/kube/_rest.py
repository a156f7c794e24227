"""REST access to one Kubernetes resource over plain JSON dicts.

:class:`ResourceClient` rides on kubernetes-asyncio's ``ApiClient`` (so host, TLS, bearer tokens,
exec plugins, user agent and default headers from a kubeconfig all apply) but reads raw bytes and
``json.loads`` them instead of deserializing into models, which is ~18x cheaper. Errors surface
as kubernetes-asyncio's ``ApiException`` so :mod:`pyprovlib.kube._errors` classifies them.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any, Literal, Self

import aiohttp
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException

from pyprovlib._errors import PyprovlibError
from pyprovlib._logging import get_logger
from pyprovlib.kube._config import READ_IDLE_TIMEOUT, check_status, request_json, send_request
from pyprovlib.kube._objects import Obj, name_of, namespace_of
from pyprovlib.kube._resources import Resource

__all__ = [
    "PATCH_CONTENT_TYPES",
    "PatchType",
    "ResourceClient",
    "WatchError",
    "WatchExpiredError",
    "WatchStream",
    "check_watch_event",
    "iterate_pages",
    "list_query",
    "watch_query",
]

log = get_logger(__name__)

PatchType = Literal["merge", "json", "strategic"]
"""How a patch body is interpreted: JSON merge patch, JSON patch (RFC 6902), strategic merge."""

PATCH_CONTENT_TYPES: Mapping[str, str] = {
    "merge": "application/merge-patch+json",
    "json": "application/json-patch+json",
    "strategic": "application/strategic-merge-patch+json",
}
"""The Content-Type sent for each :data:`PatchType`."""

# Seconds added to a watch's server-side timeoutSeconds for the client-side deadline, so the
# server always ends the stream first and a normal end is never mistaken for a failure.
WATCH_CLIENT_TIMEOUT_MARGIN = 30.0


def list_query(
    *,
    label_selector: str | None = None,
    field_selector: str | None = None,
    limit: int | None = None,
    continue_: str | None = None,
    resource_version: str | None = None,
) -> list[tuple[str, str]]:
    """The query parameters of a LIST, each only when set: ``limit`` 0 means no limit, and
    ``resource_version`` is sent whenever it is not None ('' reads as unset on the server)."""
    query: list[tuple[str, str]] = []
    if label_selector:
        query.append(("labelSelector", label_selector))
    if field_selector:
        query.append(("fieldSelector", field_selector))
    if limit:
        query.append(("limit", str(limit)))
    if continue_:
        query.append(("continue", continue_))
    if resource_version is not None:
        query.append(("resourceVersion", resource_version))
    return query


def watch_query(
    *,
    resource_version: str | None = None,
    label_selector: str | None = None,
    field_selector: str | None = None,
    timeout_seconds: int | None = None,
    allow_bookmarks: bool = True,
) -> list[tuple[str, str]]:
    """The query parameters of a WATCH (``watch=true`` and each other one only when set)."""
    query: list[tuple[str, str]] = [("watch", "true")]
    if resource_version is not None:
        query.append(("resourceVersion", resource_version))
    if label_selector:
        query.append(("labelSelector", label_selector))
    if field_selector:
        query.append(("fieldSelector", field_selector))
    if timeout_seconds is not None:
        query.append(("timeoutSeconds", str(timeout_seconds)))
    if allow_bookmarks:
        query.append(("allowWatchBookmarks", "true"))
    return query


class WatchError(PyprovlibError, ApiException):
    """A watch stream delivered an ERROR event; ``status_object`` is the ``Status`` it carried.

    It is an ``ApiException`` with the Status's ``code`` as ``status`` and the Status as ``body``,
    so :mod:`pyprovlib.kube._errors` classifies it like an HTTP error.
    """

    def __init__(self, status_object: Mapping[str, Any]) -> None:
        code = status_object.get("code")
        super().__init__(
            status=code if isinstance(code, int) else 500,
            reason=str(status_object.get("reason") or status_object.get("message") or ""),
        )
        self.status_object: dict[str, Any] = dict(status_object)
        # Same shape as an HTTP error's body so status_reason()/retry_after_seconds() work.
        self.body = json.dumps(self.status_object)  # type: ignore[assignment]

    def __str__(self) -> str:
        message = self.status_object.get("message") or ""
        return f"watch error {self.status} {self.reason}: {message}"


class WatchExpiredError(WatchError):
    """The watch's resourceVersion is too old (Status code 410 Gone/Expired): relist."""


def check_watch_event(event: Obj) -> Obj:
    """``event`` as it is, unless it is an ERROR event: then raise what its ``Status`` says,
    :class:`WatchExpiredError` for code 410, else :class:`WatchError`."""
    if event.get("type") != "ERROR":
        return event
    status = event.get("object") or {}
    if not isinstance(status, dict):
        status = {"message": str(status)}
    if status.get("code") == 410:
        raise WatchExpiredError(status)
    raise WatchError(status)


class WatchStream:
    """The events of one watch request: an async iterator of ``{"type", "object"}`` dicts.

    Use it as ``async with client.watch(...) as events: async for event in events: ...``; leaving
    the block closes the HTTP response (iterating to the end or hitting an error closes it too).
    An ERROR event raises :class:`WatchExpiredError` (code 410) or :class:`WatchError`; the
    server ending the stream (its ``timeoutSeconds``) ends the iteration normally.
    """

    def __init__(
        self, client: ResourceClient, path: str, query: list[tuple[str, str]], timeout: float | None
    ) -> None:
        self._client = client
        self._path = path
        self._query = query
        self._timeout = timeout
        self._response: aiohttp.ClientResponse | None = None
        self._closed = False

    async def __aenter__(self) -> Self:
        await self._open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __aiter__(self) -> Self:
        return self

    async def _open(self) -> aiohttp.ClientResponse:
        if self._closed:
            raise RuntimeError("watch stream already closed")
        if self._response is None:
            timeout = aiohttp.ClientTimeout(
                total=None if self._timeout is None else self._timeout,
                sock_connect=30.0,
                # A watch silent this long sits on a dead connection (see READ_IDLE_TIMEOUT):
                # the read fails, and the informer resumes from its last resourceVersion.
                sock_read=READ_IDLE_TIMEOUT,
            )
            self._response = await self._client._stream(self._path, self._query, timeout)
        return self._response

    async def __anext__(self) -> Obj:
        response = self._response
        if response is None:
            response = await self._open()
        try:
            while True:
                line = await response.content.readline()
                if not line:
                    raise StopAsyncIteration
                if line.isspace():
                    continue
                if not line.endswith(b"\n"):
                    # The connection closed mid-event: the stream is over (client-go's
                    # StreamWatcher treats an unexpected EOF the same way).
                    log.debug("watch stream truncated", path=self._path, tail_bytes=len(line))
                    raise StopAsyncIteration
                # UTF-8 by the API's contract: decoding first skips json's encoding sniffing.
                return check_watch_event(json.loads(line.decode("utf-8")))
        except BaseException:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        """Close the HTTP response; further iteration is an error."""
        self._closed = True
        response, self._response = self._response, None
        if response is not None:
            # close(), not release(): an unfinished chunked stream cannot go back to the pool.
            response.close()


class ResourceClient:
    """CRUD, patch, list and watch of one :class:`Resource` over JSON dicts.

    ``api_client`` is a kubernetes-asyncio ``ApiClient`` (its configuration supplies host, TLS and
    credentials). Returned dicts are fresh from ``json.loads``; nothing is converted to models.
    """

    def __init__(self, api_client: ApiClient, resource: Resource) -> None:
        self.api_client = api_client
        self.resource = resource
        self._log = log.bind(resource=resource.plural)

    def __repr__(self) -> str:
        return f"ResourceClient({self.resource.api_version}/{self.resource.plural})"

    # -- transport ---------------------------------------------------------------------------

    async def _stream(
        self, path: str, query: list[tuple[str, str]], client_timeout: aiohttp.ClientTimeout
    ) -> aiohttp.ClientResponse:
        """GET whose body the caller reads as it arrives (a watch): the open response on 2xx,
        ``ApiException`` otherwise. Requests answered whole go through
        :func:`~pyprovlib.kube._config.request_json`."""
        return await check_status(
            await send_request(
                self.api_client, "GET", path, query=query, request_timeout=client_timeout
            )
        )

    def _namespace(self, namespace: str | None) -> str | None:
        return namespace if self.resource.namespaced else None

    # -- reads -------------------------------------------------------------------------------

    async def get(self, name: str, namespace: str | None = None) -> Obj:
        """GET one object."""
        path = self.resource.path(self._namespace(namespace), name)
        return await request_json(self.api_client, "GET", path)

    async def list(
        self,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int | None = None,
        continue_: str | None = None,
        resource_version: str | None = None,
    ) -> Obj:
        """LIST (one page when ``limit`` is given); returns the List object as decoded."""
        query = list_query(
            label_selector=label_selector,
            field_selector=field_selector,
            limit=limit,
            continue_=continue_,
            resource_version=resource_version,
        )
        path = self.resource.path(self._namespace(namespace))
        return await request_json(self.api_client, "GET", path, query=query)

    def watch(
        self,
        namespace: str | None = None,
        *,
        resource_version: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        timeout_seconds: int | None = None,
        allow_bookmarks: bool = True,
    ) -> WatchStream:
        """WATCH the collection: a :class:`WatchStream` to use with ``async with``.

        The client-side deadline is the server's ``timeout_seconds`` plus a margin, so the server
        ends the stream first; without ``timeout_seconds`` there is no client-side deadline.
        """
        query = watch_query(
            resource_version=resource_version,
            label_selector=label_selector,
            field_selector=field_selector,
            timeout_seconds=timeout_seconds,
            allow_bookmarks=allow_bookmarks,
        )
        client_timeout = (
            None if timeout_seconds is None else timeout_seconds + WATCH_CLIENT_TIMEOUT_MARGIN
        )
        return WatchStream(
            self, self.resource.path(self._namespace(namespace)), query, client_timeout
        )

    # -- writes ------------------------------------------------------------------------------

    async def create(self, obj: Obj, namespace: str | None = None) -> Obj:
        """POST ``obj`` to its collection (namespace from the argument or ``obj``'s metadata)."""
        ns = self._namespace(namespace or namespace_of(obj))
        return await request_json(self.api_client, "POST", self.resource.path(ns), body=obj)

    def _object_path(self, obj: Obj, subresource: str | None = None) -> str:
        name = name_of(obj)
        if not name:
            raise ValueError(f"{self.resource.kind} has no metadata.name; cannot address it")
        return self.resource.path(self._namespace(namespace_of(obj)), name, subresource)

    async def replace(self, obj: Obj) -> Obj:
        """PUT ``obj`` (optimistic concurrency through its ``metadata.resourceVersion``)."""
        return await request_json(self.api_client, "PUT", self._object_path(obj), body=obj)

    async def replace_status(self, obj: Obj) -> Obj:
        """PUT ``obj`` to its ``status`` subresource."""
        path = self._object_path(obj, "status")
        return await request_json(self.api_client, "PUT", path, body=obj)

    async def patch(
        self,
        name: str,
        body: Any,
        *,
        namespace: str | None = None,
        patch_type: PatchType = "merge",
        subresource: str | None = None,
    ) -> Obj:
        """PATCH an object (or its subresource) with a merge, JSON or strategic merge patch."""
        try:
            content_type = PATCH_CONTENT_TYPES[patch_type]
        except KeyError:
            raise ValueError(f"unknown patch type {patch_type!r}") from None
        path = self.resource.path(self._namespace(namespace), name, subresource)
        return await request_json(
            self.api_client, "PATCH", path, body=body, content_type=content_type
        )

    async def delete(
        self,
        name: str,
        namespace: str | None = None,
        *,
        preconditions: Mapping[str, str] | None = None,
        propagation_policy: str | None = None,
        grace_period_seconds: int | None = None,
    ) -> Obj | None:
        """DELETE an object. Returns the object as the server last reported it (still present
        while finalizers hold it), or None when the server answered with a bare Status."""
        options: Obj = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if preconditions:
            options["preconditions"] = dict(preconditions)
        if propagation_policy:
            options["propagationPolicy"] = propagation_policy
        if grace_period_seconds is not None:
            options["gracePeriodSeconds"] = grace_period_seconds
        path = self.resource.path(self._namespace(namespace), name)
        result = await request_json(self.api_client, "DELETE", path, body=options)
        if not result or result.get("kind") == "Status":
            return None
        return result


async def iterate_pages(
    client: ResourceClient,
    namespace: str | None = None,
    *,
    label_selector: str | None = None,
    field_selector: str | None = None,
    limit: int = 500,
) -> AsyncIterator[Obj]:
    """Every object of a collection, fetched ``limit`` at a time with continue tokens."""
    continue_: str | None = None
    while True:
        page = await client.list(
            namespace,
            label_selector=label_selector,
            field_selector=field_selector,
            limit=limit,
            continue_=continue_,
        )
        for item in page.get("items") or ():
            yield item
        continue_ = (page.get("metadata") or {}).get("continue") or None
        if not continue_:
            return

"""The in-memory API server's in-process transport: how the PV binder it runs reaches it without
TCP and HTTP, through the same request pipeline."""

from __future__ import annotations

import asyncio
import contextlib
import http
import json
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException
from multidict import CIMultiDict, CIMultiDictProxy, MultiDict

from pyprovlib.kube._objects import Obj
from pyprovlib.testing._http import Reply, Stream, WireRequest
from pyprovlib.testing._storage import dumps

if TYPE_CHECKING:
    from pyprovlib.testing._server import ApiServer

__all__ = ["InProcessTransport"]

_JSON = "application/json"


class InProcessTransport:
    """How the PV binder started by :class:`ApiServer` reaches that server: every request goes
    through the same pipeline as an HTTP one — request counters, injected faults and latency,
    decoding, validation, the registry, watch streams with their bookmarks and 410s — and
    comes back as the same bytes; only TCP and HTTP framing are skipped, whose client and
    server sides cost more CPU than the request itself. Requests fail with a connection error
    while the server is not listening (during :meth:`ApiServer.restart`), as over HTTP.

    Implements :class:`pyprovlib.testing._binder.BinderTransport`.
    """

    def __init__(self, server: ApiServer, user_agent: str) -> None:
        self._server = server
        self._user_agent = user_agent

    async def _send(
        self,
        method: str,
        path: str,
        query: Mapping[str, Any] | None,
        body: Any,
        content_type: str,
    ) -> Reply | Stream:
        # A request is a trip through the event loop, as over a socket: a binder sync of
        # several writes must not hold the loop (and every other client) for all of them.
        await asyncio.sleep(0)
        if not self._server.listening:
            raise aiohttp.ClientConnectionError(
                f"cannot connect to the API server at {self._server.url}: not listening"
            )
        raw = b"" if body is None else dumps(body)
        headers = {"Content-Type": content_type, "Accept": _JSON, "User-Agent": self._user_agent}
        request = WireRequest(
            method,
            path,
            query=MultiDict((k, str(v)) for k, v in (query or {}).items()),
            headers=headers,
            content_type=content_type,
            body=raw,
        )
        return await self._server._serve(request)

    @staticmethod
    def _raise(reply: Reply) -> None:
        try:
            reason = http.HTTPStatus(reply.status).phrase
        except ValueError:
            reason = ""
        err = ApiException(status=reply.status, reason=reason)
        err.body = reply.body
        err.headers = CIMultiDictProxy(CIMultiDict(reply.headers))
        raise err

    async def json(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = _JSON,
    ) -> Obj:
        """Send one request; the decoded JSON object of a 2xx answer, else ApiException."""
        reply = await self._send(method, path, query, body, content_type)
        if isinstance(reply, Stream):
            await reply.chunks.aclose()
            raise RuntimeError(f"{method} {path} answered with a stream")
        if not 200 <= reply.status <= 299:
            self._raise(reply)
        out = json.loads(reply.body)
        return out if isinstance(out, dict) else {}

    @contextlib.asynccontextmanager
    async def stream(
        self, path: str, *, query: Mapping[str, Any] | None = None
    ) -> AsyncIterator[AsyncIterator[bytes]]:
        """Open a watch: the stream's bytes until it ends (ApiException when refused)."""
        reply = await self._send("GET", path, query, None, _JSON)
        if isinstance(reply, Reply):
            if not 200 <= reply.status <= 299:
                self._raise(reply)

            async def one() -> AsyncIterator[bytes]:
                yield reply.body

            yield one()
            return
        async with contextlib.aclosing(reply.chunks) as chunks:
            yield chunks

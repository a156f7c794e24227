"""What the tests of the in-memory API server's HTTP surface share."""

from __future__ import annotations

from typing import Any

import aiohttp

from pyprovlib.testing._server import ApiServer


async def get_json(server: ApiServer, path: str, accept: str = "application/json") -> Any:
    """GET ``path`` from ``server`` (plain HTTP, no client library), expecting 200; the body."""
    async with (
        aiohttp.ClientSession() as session,
        session.get(server.url + path, headers={"Accept": accept}) as resp,
    ):
        assert resp.status == 200, path
        return await resp.json()

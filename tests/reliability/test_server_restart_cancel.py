"""Regression: ``ApiServer.restart()`` cancelled half-way (as a chaos task is, when a test ends)
used to leave the old site bound with ``_runner`` cleared, or nothing listening: every later
restart failed with EADDRINUSE and every client got "connection refused" for good — a whole
fault scenario then timed out with hundreds of claims unprovisioned."""

from __future__ import annotations

import asyncio
import contextlib

from kubernetes_asyncio.client import CoreV1Api

from pyprovlib.testing._server import ApiServer


async def test_a_cancelled_restart_still_completes() -> None:
    async with ApiServer() as server, server.api_client() as client:
        port = server.port
        for steps in range(25):  # cancel at every await point of close + listen
            task = asyncio.create_task(server.restart())
            for _ in range(steps):
                await asyncio.sleep(0)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            assert server.port == port
            namespaces = await CoreV1Api(client).list_namespace()
            assert namespaces.items is not None, f"server down after a restart cancelled at {steps}"
        await server.restart()  # and a plain restart still binds the port
        await CoreV1Api(client).list_namespace()

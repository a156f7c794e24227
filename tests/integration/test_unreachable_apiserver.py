"""An API server that cannot be reached is logged as one clear line: ``host:port`` and the
error, not a ``repr()`` of aiohttp's connection internals (issue 18)."""

from __future__ import annotations

import asyncio
import socket

import structlog
from kubernetes_asyncio.client import Configuration

from pyprovlib.kube._config import LimitedApiClient, describe_transport_error
from pyprovlib.kube._informer import SharedInformerFactory
from pyprovlib.kube._ratelimit import TokenBucket
from pyprovlib.kube._resources import CONFIGMAPS


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def test_an_unreachable_api_server_is_one_clear_log_line() -> None:
    port = closed_port()
    configuration = Configuration(host=f"http://127.0.0.1:{port}")
    async with LimitedApiClient(configuration, limiter=TokenBucket(0, 0), environ={}) as api:
        factory = SharedInformerFactory(api, backoff_initial=0.01, backoff_cap=0.05)
        informer = factory.informer_for(CONFIGMAPS)
        with structlog.testing.capture_logs() as logs:
            task = asyncio.create_task(informer.run())
            try:
                async with asyncio.timeout(10):
                    while not any(e["event"] == "list/watch failed" for e in logs):
                        await asyncio.sleep(0.01)
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
    failed = next(e for e in logs if e["event"] == "list/watch failed")
    error = failed["error"]
    assert error.startswith(f"cannot connect to 127.0.0.1:{port}: "), error
    assert "\n" not in error
    assert "ConnectionKey" not in error
    assert "Connect" in error  # the cause: asyncio's "Connect call failed ..."


def test_other_transport_errors_name_their_type_and_message() -> None:
    assert describe_transport_error(ConnectionResetError(104, "reset")) == (
        "ConnectionResetError: [Errno 104] reset"
    )
    assert describe_transport_error(TimeoutError()) == "TimeoutError"

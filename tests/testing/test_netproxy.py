"""pyprovlib.testing._netproxy.TcpProxy: forwarding, both partition modes, heal, counters,
shutdown — over raw sockets against an echo server, and with the real kubernetes-asyncio
client against the in-memory API server."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

import aiohttp
import pytest
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException

from pyprovlib import testing
from pyprovlib.kube._resources import NAMESPACES
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.testing._netproxy import TcpProxy
from pyprovlib.testing._server import ApiServer


class EchoServer:
    """Echoes every byte back; counts what it received and the connections it saw."""

    def __init__(self) -> None:
        self.received = 0
        self.connections = 0
        self.eofs = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        try:
            while data := await reader.read(65536):
                self.received += len(data)
                writer.write(data)
                await writer.drain()
            self.eofs += 1
        except ConnectionError:
            pass
        finally:
            self._tasks.discard(task)
            writer.close()

    async def __aenter__(self) -> EchoServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()


@contextlib.asynccontextmanager
async def echo_and_proxy() -> AsyncIterator[tuple[EchoServer, TcpProxy]]:
    async with EchoServer() as echo, TcpProxy("127.0.0.1", echo.port) as proxy:
        yield echo, proxy


async def connect(proxy: TcpProxy) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", proxy.port)


async def round_trip(
    proxy: TcpProxy, data: bytes
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A new connection through ``proxy`` that echoed ``data`` back."""
    reader, writer = await connect(proxy)
    writer.write(data)
    assert await reader.readexactly(len(data)) == data
    return reader, writer


async def poll(check: Callable[[], bool], timeout: float = 5.0, what: str = "condition") -> None:
    await testing.eventually(check, timeout=timeout, message=what)


async def read_is_reset(reader: asyncio.StreamReader) -> bool:
    """True when the connection was reset (ECONNRESET, or closed without data)."""
    try:
        async with asyncio.timeout(5):
            data = await reader.read(100)
    except ConnectionResetError:
        return True
    return data == b""


async def test_forwards_both_ways_and_counts() -> None:
    async with echo_and_proxy() as (echo, proxy):
        assert proxy.url == f"http://127.0.0.1:{proxy.port}"
        reader, writer = await connect(proxy)
        writer.write(b"hello")
        await writer.drain()
        assert await reader.readexactly(5) == b"hello"
        big = bytes(range(256)) * 1024  # more than one chunk
        writer.write(big)
        await writer.drain()
        assert await reader.readexactly(len(big)) == big
        # A half-close is passed on: the echo server sees the end and closes its side.
        writer.write_eof()
        assert await reader.read() == b""
        writer.close()
        await poll(lambda: proxy.open_connections == 0, what="connection closed")
        assert echo.eofs == 1
        assert proxy.stats.accepted == proxy.stats.forwarded == 1
        assert proxy.stats.bytes_to_target == proxy.stats.bytes_to_client == 5 + len(big)
        assert proxy.stats.bytes_dropped == proxy.stats.reset == 0


async def test_reset_partition_cuts_open_connections_and_refuses_new_ones() -> None:
    async with echo_and_proxy() as (echo, proxy):
        reader, writer = await round_trip(proxy, b"ping")

        proxy.partition("reset")
        assert proxy.partitioned == "reset"
        assert await read_is_reset(reader)
        writer.close()
        assert proxy.stats.reset == 1

        # A new connection is accepted by the kernel, then reset before anything flows.
        reader2, writer2 = await connect(proxy)
        writer2.write(b"lost")
        with contextlib.suppress(ConnectionError):
            await writer2.drain()
        assert await read_is_reset(reader2)
        writer2.close()
        await poll(lambda: proxy.stats.refused == 1, what="refused counted")
        assert echo.connections == 1  # the target never saw the second connection
        assert echo.received == 4

        proxy.heal()
        assert proxy.partitioned is None
        _, writer3 = await round_trip(proxy, b"back")
        writer3.close()
        assert echo.connections == 2


async def test_blackhole_swallows_bytes_then_heal_resets_and_forwards_again() -> None:
    async with echo_and_proxy() as (echo, proxy):
        reader, writer = await round_trip(proxy, b"one")

        proxy.partition("blackhole")
        writer.write(b"two")
        await writer.drain()  # accepted: writes succeed
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.3):
                await reader.read(100)
        # A new connection is accepted too and swallows what it gets.
        reader2, writer2 = await connect(proxy)
        writer2.write(b"three")
        await writer2.drain()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.3):
                await reader2.read(100)
        await poll(lambda: proxy.stats.bytes_dropped == 3 + 5, what="dropped bytes counted")
        assert echo.connections == 1  # never forwarded to the target
        assert proxy.stats.blackholed == 2
        # The echo server got what was sent before the partition, nothing since.
        assert echo.received == 3

        proxy.heal()
        # The swallowed connections cannot carry on (bytes were lost): they are reset.
        assert await read_is_reset(reader)
        assert await read_is_reset(reader2)
        writer.close()
        writer2.close()
        assert proxy.stats.reset == 2
        _, writer3 = await round_trip(proxy, b"four")
        writer3.close()


async def test_heal_can_leave_blackholed_connections_half_open() -> None:
    async with echo_and_proxy() as (_echo, proxy):
        reader, writer = await round_trip(proxy, b"one")
        proxy.partition("blackhole")
        proxy.heal(reset_blackholed=False)
        # The old connection stays dead, silently; a new one works.
        writer.write(b"lost")
        await writer.drain()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.3):
                await reader.read(100)
        assert proxy.open_connections == 1
        assert proxy.stats.reset == 0
        _, writer2 = await round_trip(proxy, b"two")
        writer.close()
        writer2.close()


async def test_unreachable_target_resets_the_client() -> None:
    async with EchoServer() as echo:
        port = echo.port
    async with TcpProxy("127.0.0.1", port) as proxy:
        reader, writer = await connect(proxy)
        assert await read_is_reset(reader)
        writer.close()
        await poll(lambda: proxy.stats.refused == 1, what="refused counted")
        assert proxy.stats.forwarded == 0


async def test_stop_ends_every_connection() -> None:
    async with EchoServer() as echo:
        proxy = TcpProxy("127.0.0.1", echo.port)
        await proxy.start()
        readers = []
        for _ in range(3):
            reader, writer = await round_trip(proxy, b"x")
            readers.append((reader, writer))
        proxy.partition("blackhole")
        reader, writer = await connect(proxy)  # a blackholed newcomer
        readers.append((reader, writer))
        await poll(lambda: proxy.open_connections == 4, what="4 connections open")
        await proxy.stop()
        assert proxy.open_connections == 0
        for reader, writer in readers:
            assert await read_is_reset(reader)
            writer.close()
        with pytest.raises(ConnectionRefusedError):
            await connect(proxy)


async def test_rejects_unknown_mode_and_double_start() -> None:
    async with echo_and_proxy() as (_echo, proxy):
        with pytest.raises(ValueError, match="reset"):
            proxy.partition("drop")  # type: ignore[arg-type]
        assert proxy.partitioned is None
        with pytest.raises(RuntimeError):
            await proxy.start()


# -- with the real client and the in-memory API server ------------------------------------------


@contextlib.asynccontextmanager
async def proxied_client() -> AsyncIterator[tuple[ApiServer, TcpProxy, ApiClient, ApiClient]]:
    """The API server, a proxy to it, a client through the proxy and one direct."""
    async with ApiServer() as server, TcpProxy("127.0.0.1", server.port) as proxy:
        config = server.configuration()
        config.host = proxy.url
        async with ApiClient(configuration=config) as through, server.api_client() as direct:
            yield server, proxy, through, direct


async def test_kubernetes_client_through_a_reset_partition() -> None:
    async with proxied_client() as (_server, proxy, through, direct):
        namespaces = ResourceClient(through, NAMESPACES)
        await namespaces.list()
        proxy.partition("reset")
        with pytest.raises((aiohttp.ClientError, ConnectionError)):
            async with asyncio.timeout(5):
                await namespaces.list()
        # Only this client is cut off.
        await ResourceClient(direct, NAMESPACES).list()
        proxy.heal()
        listed = await namespaces.list()
        assert any(n["metadata"]["name"] == "default" for n in listed["items"])


async def test_kubernetes_client_hangs_in_a_blackhole_and_recovers() -> None:
    async with proxied_client() as (server, proxy, through, direct):
        namespaces = ResourceClient(through, NAMESPACES)
        await namespaces.list()
        before = server.requests.count("list", "namespaces")
        proxy.partition("blackhole")
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.5):
                await namespaces.list()
        assert server.requests.count("list", "namespaces") == before  # never arrived
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "direct"}}
        await ResourceClient(direct, NAMESPACES).create(body)
        proxy.heal()
        listed = await namespaces.list()
        assert "direct" in {n["metadata"]["name"] for n in listed["items"]}


async def test_watch_through_the_proxy_is_cut_by_a_partition() -> None:
    async with proxied_client() as (_server, proxy, through, direct):
        namespaces = ResourceClient(through, NAMESPACES)
        rv = (await namespaces.list())["metadata"]["resourceVersion"]
        seen: list[str] = []

        async def watch() -> None:
            async with namespaces.watch(resource_version=rv, timeout_seconds=60) as stream:
                async for event in stream:
                    seen.append(event["object"]["metadata"]["name"])

        task = asyncio.create_task(watch())
        try:
            body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "before"}}
            await ResourceClient(direct, NAMESPACES).create(body)
            await poll(lambda: seen == ["before"], what="watch event")
            proxy.partition("reset")
            with pytest.raises((aiohttp.ClientError, ConnectionError, ApiException)):
                async with asyncio.timeout(5):
                    await task
        finally:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task

"""A TCP proxy that can cut one client off from a server: network partitions in tests.

Point one client (say, one controller replica) at the proxy instead of the API server, and
:meth:`TcpProxy.partition` cuts that client alone off while every other client keeps talking
to the server directly::

    async with ApiServer() as server, TcpProxy("127.0.0.1", server.port) as proxy:
        config = server.configuration()
        config.host = proxy.url
        async with ApiClient(configuration=config) as client:
            ...
            proxy.partition("blackhole")  # requests now hang
            ...
            proxy.heal()

Two kinds of partition:

- ``"reset"``: every open connection is aborted with a TCP reset, and new connections are
  accepted and reset at once — a peer that is down, or a firewall rejecting packets. Clients
  see errors immediately.
- ``"blackhole"``: nothing is forwarded any more in either direction; bytes are still accepted
  (so writes succeed) and thrown away, and new connections are accepted and then ignored — a
  firewall dropping packets, or a hung network. Clients see requests that never answer, and
  only their own timeouts get them out.

:meth:`TcpProxy.heal` forwards new connections again. Connections that were blackholed are
reset then: bytes were lost on them, so they could never carry a consistent stream again (a
real TCP stack would eventually time them out the same way) — or, with
``heal(reset_blackholed=False)``, left hanging for good: half-open connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from dataclasses import dataclass
from typing import Literal

from pyprovlib._logging import get_logger
from pyprovlib.testing._lifecycle import Listener

__all__ = ["PartitionMode", "ProxyStats", "TcpProxy"]

log = get_logger(__name__)

PartitionMode = Literal["reset", "blackhole"]
"""How :meth:`TcpProxy.partition` cuts the client off (see the module documentation)."""

_CHUNK = 64 * 1024
_MODES: frozenset[str] = frozenset({"reset", "blackhole"})


@dataclass
class ProxyStats:
    """Counters of a :class:`TcpProxy` since it was created."""

    accepted: int = 0
    """Client connections accepted (forwarded, refused or blackholed)."""
    forwarded: int = 0
    """Client connections joined to a connection to the target."""
    refused: int = 0
    """New connections reset at once during a ``"reset"`` partition (or when the target could
    not be reached)."""
    blackholed: int = 0
    """Connections that fell into a ``"blackhole"`` partition: new ones accepted during it and
    open ones it caught."""
    reset: int = 0
    """Open connections aborted by :meth:`TcpProxy.partition` ``("reset")`` or, for
    blackholed ones, by :meth:`TcpProxy.heal`."""
    bytes_to_target: int = 0
    """Bytes forwarded from clients to the target."""
    bytes_to_client: int = 0
    """Bytes forwarded from the target to clients."""
    bytes_dropped: int = 0
    """Bytes accepted from either side and thrown away during a ``"blackhole"`` partition."""
    partitions: int = 0
    """Calls of :meth:`TcpProxy.partition`."""


def _abort(writer: asyncio.StreamWriter | None) -> None:
    """Close ``writer``'s connection with a TCP reset (RST) rather than an orderly FIN, so the
    peer sees ``ECONNRESET`` as it would when a network path is torn down."""
    if writer is None:
        return
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            # SO_LINGER on with a zero timeout: close() sends RST and drops unsent data.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class _Connection:
    """One client connection and, when forwarded, its connection to the target."""

    __slots__ = ("blackholed", "client", "done", "task", "upstream")

    def __init__(self, client: asyncio.StreamWriter, task: asyncio.Task[None]) -> None:
        self.client = client
        self.upstream: asyncio.StreamWriter | None = None
        self.task = task
        # Set once the connection fell into a blackhole: nothing is forwarded on it any more.
        self.blackholed = False
        self.done = False

    def reset(self) -> None:
        """Abort both sides with a reset and end the connection's task."""
        self.done = True
        _abort(self.client)
        _abort(self.upstream)
        self.task.cancel()


class TcpProxy(Listener):
    """An asyncio TCP proxy to ``target_host:target_port`` that can be partitioned and healed.

    It listens on ``host`` (default loopback) and ``port`` (default: any free port); use it as
    an async context manager or call :meth:`start` / :meth:`stop`. :attr:`url` is
    ``http://host:port`` for an HTTP target. Every connection's task belongs to the proxy and
    is cancelled and awaited by :meth:`stop`.
    """

    def __init__(
        self,
        target_host: str,
        target_port: int,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        super().__init__(host, port)
        self.target_host = target_host
        self.target_port = target_port
        self.stats = ProxyStats()
        """Counters (connections, bytes) since the proxy was created."""
        self._mode: PartitionMode | None = None
        self._server: asyncio.Server | None = None
        self._connections: set[_Connection] = set()
        self._log = log.bind(target=f"{target_host}:{target_port}")

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Listen for connections."""
        if self._server is not None:
            raise RuntimeError("the proxy is already started")
        self._server = await asyncio.start_server(self._serve, self.host, self._port)
        self._port = int(self._server.sockets[0].getsockname()[1])
        self._log.debug("proxy listening", port=self._port)

    async def stop(self) -> None:
        """Stop listening, abort every connection and wait for their tasks to end."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        connections = list(self._connections)
        for connection in connections:
            connection.reset()
        await asyncio.gather(*(c.task for c in connections), return_exceptions=True)
        if server is not None:
            await server.wait_closed()

    # -- partitions ----------------------------------------------------------------------------

    @property
    def partitioned(self) -> PartitionMode | None:
        """The current partition mode, or None while forwarding."""
        return self._mode

    @property
    def open_connections(self) -> int:
        """Client connections currently open (forwarded or blackholed)."""
        return sum(1 for c in self._connections if not c.done)

    def partition(self, mode: PartitionMode = "reset") -> None:
        """Cut the clients of this proxy off from the target, at once.

        ``"reset"``: abort every open connection with a TCP reset and reset new ones as they
        come. ``"blackhole"``: forward nothing more on open connections (what arrives is read
        and dropped) and accept new connections without ever forwarding them.
        """
        if mode not in _MODES:
            raise ValueError(f'partition mode must be "reset" or "blackhole", got {mode!r}')
        self.stats.partitions += 1
        self._mode = mode
        for connection in list(self._connections):
            if connection.done:
                continue
            if mode == "reset":
                self.stats.reset += 1
                connection.reset()
            elif not connection.blackholed:
                self.stats.blackholed += 1
                connection.blackholed = True
        self._log.info("proxy partitioned", mode=mode, port=self._port)

    def heal(self, *, reset_blackholed: bool = True) -> None:
        """Forward new connections again and reset the connections a blackhole swallowed.

        With ``reset_blackholed=False`` those connections stay swallowed for good, without a
        reset: half-open connections whose peer is gone, as after a NAT or load balancer
        forgot them, which only a client-side timeout or health check can notice.
        """
        self._mode = None
        if reset_blackholed:
            for connection in list(self._connections):
                if connection.blackholed and not connection.done:
                    self.stats.reset += 1
                    connection.reset()
        self._log.info("proxy healed", port=self._port, reset_blackholed=reset_blackholed)

    # -- connections ---------------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        connection = _Connection(writer, task)
        self._connections.add(connection)
        self.stats.accepted += 1
        try:
            await self._handle(connection, reader)
        except asyncio.CancelledError:
            # Cancelled by reset()/stop(): the connection is over, nothing to propagate to
            # asyncio's server machinery (which owns this callback's task).
            if not connection.done:
                raise
        except (ConnectionError, OSError) as err:
            self._log.debug("proxied connection failed", error=type(err).__name__)
        finally:
            connection.done = True
            self._connections.discard(connection)
            for side in (connection.client, connection.upstream):
                if side is not None and not side.transport.is_closing():
                    side.transport.close()

    async def _handle(self, connection: _Connection, reader: asyncio.StreamReader) -> None:
        if self._mode == "reset":
            self.stats.refused += 1
            connection.done = True
            _abort(connection.client)
            return
        if self._mode == "blackhole":
            self.stats.blackholed += 1
            connection.blackholed = True
            await self._drain_forever(reader)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(self.target_host, self.target_port)
        except OSError as err:
            self._log.debug("target unreachable", error=type(err).__name__)
            self.stats.refused += 1
            connection.done = True
            _abort(connection.client)
            return
        connection.upstream = up_writer
        mode = self.partitioned  # it may have changed while connecting
        if mode is not None:
            if mode == "reset":
                self.stats.refused += 1
                connection.done = True
                _abort(connection.client)
                _abort(up_writer)
                return
            self.stats.blackholed += 1
            connection.blackholed = True
        self.stats.forwarded += 1
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._pump(connection, reader, up_writer, to_target=True))
            tg.create_task(self._pump(connection, up_reader, connection.client, to_target=False))

    async def _drain_forever(self, reader: asyncio.StreamReader) -> None:
        """Read and drop what the client sends until it goes away (or the proxy heals and
        resets the connection)."""
        while data := await reader.read(_CHUNK):
            self.stats.bytes_dropped += len(data)

    async def _pump(
        self,
        connection: _Connection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        to_target: bool,
    ) -> None:
        """Copy one direction until end of stream (passed on as a half-close), dropping what
        arrives while the connection is blackholed. A failure on either side resets both, as
        a broken path would."""
        try:
            while data := await reader.read(_CHUNK):
                if connection.blackholed:
                    self.stats.bytes_dropped += len(data)
                    continue
                writer.write(data)
                if to_target:
                    self.stats.bytes_to_target += len(data)
                else:
                    self.stats.bytes_to_client += len(data)
                await writer.drain()
            if connection.blackholed:
                # A blackhole does not pass a close on either; wait for heal() or stop().
                await asyncio.Event().wait()
            if writer.can_write_eof() and not writer.transport.is_closing():
                writer.write_eof()
        except (ConnectionError, OSError) as err:
            self._log.debug("proxied connection broke", error=type(err).__name__)
            connection.reset()

"""The ``async with`` form shared by the testing package's services: entering starts the
service, leaving stops it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Self

__all__ = ["Listener", "StartStop"]


class StartStop(ABC):
    """A service with ``start()`` and ``stop()``; ``async with service:`` starts it and stops it
    on the way out, whatever ends the block."""

    @abstractmethod
    async def start(self) -> None:
        """Start the service."""

    @abstractmethod
    async def stop(self) -> None:
        """Stop the service."""

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()


class Listener(StartStop):
    """A :class:`StartStop` service listening on ``host`` and ``port``, where port 0 asks for
    any free port and ``start()`` records the one it got."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self._port = port

    @property
    def port(self) -> int:
        """The port listened on (the real one once started, even when 0 was asked for)."""
        return self._port

    @property
    def url(self) -> str:
        """``http://<host>:<port>``."""
        return f"http://{self.host}:{self._port}"

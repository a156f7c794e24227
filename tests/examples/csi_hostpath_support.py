"""The example CSI driver served in-process on a unix socket, for the tests that talk to it over
gRPC: the driver and the capability they create volumes with."""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
from collections.abc import AsyncIterator
from typing import Any

from grpclib.client import Channel

from pyprovlib.csi._proto.csi import v1
from pyprovlib.examples.csi_hostpath._cli import serve
from pyprovlib.examples.csi_hostpath._driver import DriverOptions

MOUNT = v1.VolumeCapability(
    mount=v1.VolumeCapabilityMountVolume(),
    access_mode=v1.VolumeCapabilityAccessMode(
        mode=v1.VolumeCapabilityAccessModeMode.SINGLE_NODE_WRITER
    ),
)


@contextlib.asynccontextmanager
async def serving(directory: pathlib.Path, **overrides: Any) -> AsyncIterator[Channel]:
    """The driver as node ``node-1`` with its state under ``directory/state`` (and ``overrides``
    of its :class:`DriverOptions`), and a channel to its socket; stopped on exit."""
    options = DriverOptions(nodeid="node-1", statedir=str(directory / "state"), **overrides)
    socket = directory / "csi.sock"
    stop = asyncio.Event()
    task = asyncio.create_task(serve(options, f"unix://{socket}", stop))
    try:
        async with asyncio.timeout(10):
            while not socket.exists():
                await asyncio.sleep(0.01)
        channel = Channel(path=str(socket))
        try:
            yield channel
        finally:
            channel.close()
    finally:
        stop.set()
        await task

"""A fault-injecting CSI driver for the reliability suite, served with pyprovlib's server kit.

The driver fronts a :class:`Backend` (the storage system) that outlives it: the driver can be
stopped (socket gone, client connections dropped) and started again on the same path while the
backend keeps its volumes and finishes the operations it had begun, as a real array does while
its driver container restarts. Every method can be told, per volume name, to fail with a gRPC
status, to fail after a delay, or to *hang*: the backend operation takes that long and completes
whatever the caller does meanwhile (a CreateVolume whose client gave up at its deadline still
creates the volume, later). While an operation on a volume runs, other calls about the same
volume are answered ABORTED ("operation pending for volume", as the CSI spec suggests), so a
retry never starts a second creation.

The backend counts creations and deletions per volume name and calls an optional observer on
each deletion, so tests can check "one volume per name, ever" and "never a PV deleted while its
volume exists".
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import pathlib
import random
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

from grpclib.const import Status

from pyprovlib.csi._proto.csi import v1
from pyprovlib.csi._server import ControllerService, CSIError, CSIServer, IdentityService

T = TypeVar("T")

DRIVER_NAME = "faults.csi.pyprovlib.io"
TOPOLOGY_KEY = "topology.faults.csi/zone"

Caps = v1.ControllerServiceCapabilityRpcType
Plugin = v1.PluginCapabilityServiceType

CREATE = "CreateVolume"
DELETE = "DeleteVolume"
PUBLISH = "ControllerPublishVolume"
UNPUBLISH = "ControllerUnpublishVolume"
EXPAND = "ControllerExpandVolume"
METHODS = (CREATE, DELETE, PUBLISH, UNPUBLISH, EXPAND)

UNTIL_CLEARED = -1
"""``Fault.times`` for a fault that applies until :meth:`Backend.clear` removes it."""


@dataclass
class Fault:
    """What the next ``times`` calls of a method (about one of ``names``, or any volume when
    None) do instead of answering at once.

    ``status`` set: wait ``delay`` seconds, then fail with it (nothing is done). ``status``
    None: the operation takes ``delay`` seconds in the backend and completes then, even if the
    caller has given up (a hang past the caller's deadline).
    """

    status: Status | None = None
    message: str = "injected failure"
    delay: float = 0.0
    times: int = 1
    names: frozenset[str] | None = None

    def matches(self, name: str) -> bool:
        return self.names is None or name in self.names


@dataclass
class Volume:
    """A volume of the backend."""

    volume_id: str
    name: str
    capacity: int
    topology: dict[str, str] | None = None


@dataclass(frozen=True)
class Call:
    """One call the driver answered: the method, the volume name it was about ('' when the
    volume is unknown) and the status the driver produced (OK also for an operation that
    completed after its caller gave up)."""

    method: str
    name: str
    status: Status
    at: float
    """When it was answered (time.monotonic())."""


@dataclass
class Backend:
    """The storage system behind the driver; survives driver restarts."""

    volumes: dict[str, Volume] = field(default_factory=dict)
    published: dict[str, set[str]] = field(default_factory=dict)
    creations: Counter[str] = field(default_factory=Counter)
    deletions: Counter[str] = field(default_factory=Counter)
    calls: list[Call] = field(default_factory=list)
    faults: dict[str, list[Fault]] = field(default_factory=dict)
    on_delete: Callable[[Volume], None] | None = None
    """Called (synchronously) right after a volume is removed."""
    latency: tuple[float, float] = (0.0, 0.0)
    """Every operation that changes something takes between these many seconds (uniformly),
    on top of any injected delay: a window in which a restart or a deadline can cut the call."""
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    _pending: dict[str, asyncio.Task[object]] = field(default_factory=dict)
    _tasks: set[asyncio.Task[object]] = field(default_factory=set)

    # -- faults ---------------------------------------------------------------------------

    def fail(self, method: str, fault: Fault) -> None:
        """Queue ``fault`` for ``method``."""
        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}")
        self.faults.setdefault(method, []).append(fault)

    def clear(self, method: str | None = None) -> None:
        """Drop the queued faults of ``method`` (of every method when None)."""
        if method is None:
            self.faults.clear()
        else:
            self.faults.pop(method, None)

    def _take(self, method: str, name: str, *, changes: bool) -> Fault | None:
        # A hang is the backend being slow at its work: it applies only to calls with work to
        # do (not to a retry finding the volume already created), so it cannot repeat forever.
        queue = self.faults.get(method) or []
        for index, fault in enumerate(queue):
            if fault.matches(name) and (fault.status is not None or changes):
                if fault.times != UNTIL_CLEARED:
                    fault.times -= 1
                    if fault.times <= 0:
                        del queue[index]
                return fault
        return None

    # -- queries --------------------------------------------------------------------------

    def by_id(self, volume_id: str) -> Volume | None:
        """The volume with ``volume_id``."""
        for volume in self.volumes.values():
            if volume.volume_id == volume_id:
                return volume
        return None

    def count(self, method: str, name: str | None = None, status: Status | None = None) -> int:
        """Calls of ``method`` (about ``name``) answered with ``status`` (any when None)."""
        return sum(
            1
            for c in self.calls
            if c.method == method
            and (name is None or c.name == name)
            and (status is None or c.status is status)
        )

    @property
    def busy(self) -> frozenset[str]:
        """Names of the volumes with an operation running."""
        return frozenset(self._pending)

    # -- operations -----------------------------------------------------------------------

    async def call(
        self,
        method: str,
        name: str,
        operation: Callable[[], Awaitable[T]],
        *,
        changes: bool = True,
    ) -> T:
        """Run ``operation`` for volume ``name`` under the method's faults, recording the call.
        ``changes``: the operation has work to do (else it answers at once, no hang)."""
        try:
            if name in self._pending:
                raise CSIError(Status.ABORTED, f"an operation for volume {name} is in progress")
            fault = self._take(method, name, changes=changes) if name else None
            if fault is not None and fault.status is not None:
                if fault.delay:
                    await asyncio.sleep(fault.delay)
                raise CSIError(fault.status, fault.message)
            delay = fault.delay if fault is not None else 0.0
            if changes and self.latency[1] > 0:
                delay += random.uniform(*self.latency)
            result = await self._run(name, delay, operation)
        except CSIError as err:
            self.calls.append(Call(method, name, err.status, time.monotonic()))
            raise
        self.calls.append(Call(method, name, Status.OK, time.monotonic()))
        return result

    async def _run(self, name: str, delay: float, operation: Callable[[], Awaitable[T]]) -> T:
        if not delay or not name:
            return await operation()

        async def slow() -> T:
            await asyncio.sleep(delay)
            return await operation()

        # The backend finishes what it began even when the caller's deadline passes, the
        # connection drops or the driver restarts: the task belongs to the backend.
        task: asyncio.Task[T] = asyncio.create_task(slow(), name=f"backend-{name}")
        self._tasks.add(task)
        self._pending[name] = task

        def done(t: asyncio.Task[T]) -> None:
            self._tasks.discard(t)
            if self._pending.get(name) is t:
                del self._pending[name]

        task.add_done_callback(done)
        return await asyncio.shield(task)

    def new_volume(self, name: str, capacity: int, topology: dict[str, str] | None) -> Volume:
        """Create volume ``name`` (counted)."""
        volume = Volume(f"id-{next(self._ids)}-{name}", name, capacity, topology)
        self.volumes[name] = volume
        self.creations[name] += 1
        return volume

    def remove(self, volume: Volume) -> None:
        """Delete ``volume`` (counted, observed)."""
        if self.volumes.get(volume.name) is not volume:
            return
        del self.volumes[volume.name]
        self.published.pop(volume.volume_id, None)
        self.deletions[volume.name] += 1
        if self.on_delete is not None:
            self.on_delete(volume)

    async def close(self) -> None:
        """Cancel the operations still running (end of test)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


class FaultIdentity(IdentityService):
    """Identity of the fault driver."""

    def __init__(self, name: str, *, topology: bool) -> None:
        services = [Plugin.CONTROLLER_SERVICE]
        if topology:
            services.append(Plugin.VOLUME_ACCESSIBILITY_CONSTRAINTS)
        super().__init__(name, "1.0.0", services=services)


class FaultController(ControllerService):
    """Create/delete, publish/unpublish and expand over a :class:`Backend`."""

    def __init__(self, backend: Backend, *, topology: bool) -> None:
        super().__init__(
            [Caps.CREATE_DELETE_VOLUME, Caps.PUBLISH_UNPUBLISH_VOLUME, Caps.EXPAND_VOLUME]
        )
        self.backend = backend
        self.topology = topology

    async def create_volume(self, message: v1.CreateVolumeRequest) -> v1.CreateVolumeResponse:
        """Idempotent by name: an existing volume is returned, never created twice."""
        if not message.name:
            raise CSIError(Status.INVALID_ARGUMENT, "name missing")
        if not message.volume_capabilities:
            raise CSIError(Status.INVALID_ARGUMENT, "volume capabilities missing")
        required = message.capacity_range.required_bytes if message.capacity_range else 0

        async def create() -> Volume:
            existing = self.backend.volumes.get(message.name)
            if existing is not None:
                return existing
            return self.backend.new_volume(
                message.name, max(required, 1 << 20), self._topology(message)
            )

        volume = await self.backend.call(
            CREATE, message.name, create, changes=message.name not in self.backend.volumes
        )
        return v1.CreateVolumeResponse(
            volume=v1.Volume(
                volume_id=volume.volume_id,
                capacity_bytes=volume.capacity,
                accessible_topology=(
                    [v1.Topology(segments=volume.topology)] if volume.topology else []
                ),
            )
        )

    def _existing(self, volume_id: str) -> Volume:
        """The volume ``volume_id``; NOT_FOUND (as a driver answers) when there is none."""
        volume = self.backend.by_id(volume_id)
        if volume is None:
            raise CSIError(Status.NOT_FOUND, f"volume {volume_id} not found")
        return volume

    def _topology(self, message: v1.CreateVolumeRequest) -> dict[str, str] | None:
        if not self.topology:
            return None
        requirement = message.accessibility_requirements
        if requirement is not None and requirement.preferred:
            return dict(requirement.preferred[0].segments)
        if requirement is not None and requirement.requisite:
            return dict(requirement.requisite[0].segments)
        return {TOPOLOGY_KEY: "zone-default"}

    async def delete_volume(self, message: v1.DeleteVolumeRequest) -> v1.DeleteVolumeResponse:
        """Idempotent: an unknown volume id is already deleted."""
        volume = self.backend.by_id(message.volume_id)
        if volume is None:
            self.backend.calls.append(Call(DELETE, "", Status.OK, time.monotonic()))
            return v1.DeleteVolumeResponse()
        found = volume

        async def delete() -> None:
            self.backend.remove(found)

        await self.backend.call(DELETE, volume.name, delete)
        return v1.DeleteVolumeResponse()

    async def controller_publish_volume(
        self, message: v1.ControllerPublishVolumeRequest
    ) -> v1.ControllerPublishVolumeResponse:
        """Publish to the node (idempotent)."""
        volume = self._existing(message.volume_id)

        async def publish() -> None:
            self.backend.published.setdefault(volume.volume_id, set()).add(message.node_id)

        await self.backend.call(
            PUBLISH,
            volume.name,
            publish,
            changes=message.node_id not in self.backend.published.get(volume.volume_id, set()),
        )
        return v1.ControllerPublishVolumeResponse(
            publish_context={"devicePath": f"/dev/disk/{volume.volume_id}"}
        )

    async def controller_unpublish_volume(
        self, message: v1.ControllerUnpublishVolumeRequest
    ) -> v1.ControllerUnpublishVolumeResponse:
        """Unpublish from the node (idempotent, also for an unknown volume)."""
        volume = self.backend.by_id(message.volume_id)
        name = volume.name if volume is not None else ""

        async def unpublish() -> None:
            nodes = self.backend.published.get(message.volume_id)
            if nodes is not None:
                nodes.discard(message.node_id)
                if not nodes:
                    del self.backend.published[message.volume_id]

        await self.backend.call(
            UNPUBLISH,
            name,
            unpublish,
            changes=message.node_id in self.backend.published.get(message.volume_id, set()),
        )
        return v1.ControllerUnpublishVolumeResponse()

    async def controller_expand_volume(
        self, message: v1.ControllerExpandVolumeRequest
    ) -> v1.ControllerExpandVolumeResponse:
        """Grow the volume to at least the required bytes (never shrink)."""
        volume = self._existing(message.volume_id)
        required = message.capacity_range.required_bytes if message.capacity_range else 0

        async def expand() -> int:
            volume.capacity = max(volume.capacity, required)
            return volume.capacity

        capacity = await self.backend.call(
            EXPAND, volume.name, expand, changes=required > volume.capacity
        )
        return v1.ControllerExpandVolumeResponse(
            capacity_bytes=capacity, node_expansion_required=False
        )


class FaultDriver:
    """The driver process over a :class:`Backend`: :meth:`start`, :meth:`stop` (socket removed,
    connections dropped) and :meth:`restart`; the backend survives all of them."""

    def __init__(
        self,
        socket: pathlib.Path,
        *,
        name: str = DRIVER_NAME,
        topology: bool = False,
        backend: Backend | None = None,
    ) -> None:
        self.socket = socket
        self.name = name
        self.backend = backend or Backend()
        self.identity = FaultIdentity(name, topology=topology)
        self.controller = FaultController(self.backend, topology=topology)
        self.restarts = 0
        self._server: CSIServer | None = None

    @property
    def endpoint(self) -> str:
        """``unix://`` address of the socket."""
        return f"unix://{self.socket}"

    @property
    def running(self) -> bool:
        """The driver is serving."""
        return self._server is not None

    async def start(self) -> None:
        """Serve on the socket."""
        server = CSIServer([self.identity, self.controller], self.endpoint)
        await server.start()
        self._server = server

    async def stop(self) -> None:
        """Stop serving: the socket disappears and client connections drop."""
        server, self._server = self._server, None
        if server is not None:
            await server.stop()

    async def restart(self, down_for: float = 0.0) -> None:
        """Stop, stay down ``down_for`` seconds, start again on the same path."""
        await self.stop()
        if down_for:
            await asyncio.sleep(down_for)
        await self.start()
        self.restarts += 1

    async def __aenter__(self) -> FaultDriver:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
        await self.backend.close()


@contextlib.contextmanager
def socket_dir() -> Iterator[pathlib.Path]:
    """A fresh directory whose path is short enough for a unix socket (108 bytes)."""
    directory = pathlib.Path(tempfile.mkdtemp(prefix="pcf-", dir="/tmp"))
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def names_of(volumes: Iterable[Volume]) -> list[str]:
    """Volume names, for the suite's invariants (which call them assets)."""
    return [v.name for v in volumes]

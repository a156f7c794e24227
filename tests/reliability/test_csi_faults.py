"""CSI driver faults (issue 11, "CSI driver faults"): a ProvisionController running the
CSIProvisioner against a Python CSI driver on a unix socket (tests/reliability/csi_fault_driver.py),
with the in-memory API server and its PV binder; the attacher and the resizer likewise.

Scenarios: the driver restarting again and again (the connection reconnecting, or the sidecar
exiting and being restarted as upstream does), CreateVolume/DeleteVolume hanging past the call
timeout (the backend finishing the operation after the caller gave up, and the claim deleted
meanwhile), and every gRPC status code from CreateVolume, DeleteVolume, ControllerPublish/
Unpublish and ControllerExpandVolume before the fault clears.

Every provisioning scenario ends with the suite's invariants: each live claim Bound exactly once
to its PV; each PV has exactly one driver volume (its volumeHandle); no driver volume without a
PV; deleted claims leave nothing; no volume name was ever created twice; and, checked all along,
no PV disappeared while its volume still existed.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pytest
from claim_support import attachment_body
from csi_fault_driver import (
    CREATE,
    DELETE,
    DRIVER_NAME,
    EXPAND,
    PUBLISH,
    TOPOLOGY_KEY,
    UNPUBLISH,
    UNTIL_CLEARED,
    Backend,
    Fault,
    FaultDriver,
    Volume,
    socket_dir,
)
from grpclib.const import Status
from kubernetes_asyncio.client import ApiClient
from prometheus_client import CollectorRegistry
from rel_support import (
    all_bound,
    check_invariants,
    create_claims,
    create_class,
    create_namespace,
    delete_claims,
    fast_options,
    our_claims,
    our_volumes,
    unbound_report,
    unique,
    wait_until,
)
from task_support import background
from topology_support import create_driver_node

from pyprovlib._attacher import IN_PROGRESS_CODES
from pyprovlib._resizer import INFEASIBLE_CODES
from pyprovlib.controller._attach import AttachController
from pyprovlib.controller._attach.options import AttachControllerOptions, finalizer_name
from pyprovlib.controller._provision import ANN_SELECTED_NODE, ProvisionController
from pyprovlib.controller._resize import ResizeController
from pyprovlib.controller._resize.options import ResizeControllerOptions
from pyprovlib.csi._connection import (
    GO_STATUS_NAMES,
    ConnectionOptions,
    CSIConnection,
    CSIConnectionLost,
    CSIMetrics,
)
from pyprovlib.csi._sidecar_controller import SidecarController
from pyprovlib.csi.attacher import CSIAttacher
from pyprovlib.csi.provisioner import CSIProvisioner
from pyprovlib.csi.resizer import CSIResizer
from pyprovlib.kube._objects import Obj
from pyprovlib.kube._resources import (
    CSINODES,
    EVENTS,
    PERSISTENT_VOLUME_CLAIMS,
    PERSISTENT_VOLUMES,
    VOLUME_ATTACHMENTS,
)
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.testing._server import ApiServer

CODES = [s for s in Status if s is not Status.OK]
# external-provisioner's checkError: the operation may still run in the driver.
IN_BACKGROUND = {Status.CANCELLED, Status.DEADLINE_EXCEEDED, Status.UNAVAILABLE, Status.ABORTED}
RETRY_INTERVAL_MAX = 0.6
"""The slow-retry period of infeasible (INVALID_ARGUMENT) failures in these tests."""
GI = 1024**3


def code_id(code: Status) -> str:
    return code.name


# -- watching PVs against driver volumes -----------------------------------------------------


class PVWatch:
    """Checks, all along, that no PV disappears while its driver volume exists: every 10 ms on
    a snapshot of both, and exactly at each volume deletion (the PV must still exist then,
    unless it never existed — a volume of a claim deleted before its PV was saved)."""

    def __init__(self, server: ApiServer, backend: Backend) -> None:
        self.server = server
        self.backend = backend
        self.seen: set[str] = set()
        self.violations: list[str] = []
        backend.on_delete = self._volume_deleted

    def _pv_names(self) -> set[str]:
        return {pv["metadata"]["name"] for pv in self.server.storage.list(PERSISTENT_VOLUMES)}

    def check(self) -> None:
        current = self._pv_names()
        self.seen |= current
        for name in sorted(self.seen - current):
            if name in self.backend.volumes:
                message = f"PV {name} deleted while its volume still exists"
                if message not in self.violations:
                    self.violations.append(message)

    def _volume_deleted(self, volume: Volume) -> None:
        self.check()
        if (
            volume.name in self.seen
            and self.server.storage.get(PERSISTENT_VOLUMES, None, volume.name) is None
        ):
            self.violations.append(f"PV {volume.name} was deleted before its volume")

    async def run(self) -> None:
        while True:
            self.check()
            await asyncio.sleep(0.01)


# -- the provisioner sidecar, restarted when it exits -----------------------------------------


class Sidecar:
    """The external-provisioner sidecar in this process (connection, CSIProvisioner,
    ProvisionController, connection monitor), restarted like a container whenever it exits on
    a lost connection (``exit_on_connection_loss``, upstream's behaviour)."""

    def __init__(
        self,
        client: ApiClient,
        endpoint: str,
        connection_options: ConnectionOptions,
        csi_metrics: CSIMetrics,
        controller_options: dict[str, Any],
    ) -> None:
        self.client = client
        self.endpoint = endpoint
        self.connection_options = connection_options
        self.csi_metrics = csi_metrics
        self.controller_options = controller_options
        self.exits = 0
        self.starting = False
        """True while a (re)started sidecar connects to the driver and identifies it."""
        self.connection: CSIConnection | None = None
        self.provisioner: CSIProvisioner | None = None
        self.controller: ProvisionController | None = None
        self._current: SidecarController[ProvisionController] | None = None
        self._stopping = False

    async def run(self) -> None:
        while not self._stopping:
            self.starting = True
            connection = await CSIConnection.open(
                self.endpoint, self.connection_options, metrics=self.csi_metrics
            )
            self.starting = False
            provisioner = CSIProvisioner(self.client, connection)
            controller = ProvisionController(
                self.client,
                connection.driver_name,
                provisioner,
                fast_options(**self.controller_options),
            )
            self.connection, self.provisioner, self.controller = connection, provisioner, controller
            sidecar = SidecarController(connection, controller)
            self._current = sidecar
            if self.stopping:
                connection.close()
                return
            lost = False
            try:
                await sidecar.run()
            except* CSIConnectionLost:
                lost = True
            if not lost:
                return
            self.exits += 1

    @property
    def stopping(self) -> bool:
        return self._stopping

    def stop(self) -> None:
        self._stopping = True
        if self._current is not None:
            self._current.stop()

    def in_progress(self) -> frozenset[str]:
        controller = self.controller
        return controller.claims_in_progress() if controller is not None else frozenset()

    def in_flight(self) -> frozenset[str]:
        provisioner = self.provisioner
        return provisioner.in_flight if provisioner is not None else frozenset()


# -- the stack ----------------------------------------------------------------------------------


@dataclass
class Stack:
    server: ApiServer
    client: ApiClient
    driver: FaultDriver
    sidecar: Sidecar
    watch: PVWatch
    csi_registry: CollectorRegistry
    namespaces: list[str]
    class_name: str
    running: asyncio.Task[None]
    deleted_uids: list[str] = field(default_factory=list)

    @property
    def backend(self) -> Backend:
        return self.driver.backend

    @property
    def controller(self) -> ProvisionController:
        assert self.sidecar.controller is not None
        return self.sidecar.controller

    def csi_calls(self, method: str, code: str) -> float:
        value = self.csi_registry.get_sample_value(
            "csi_sidecar_operations_seconds_count",
            {
                "driver_name": DRIVER_NAME,
                "method_name": f"/csi.v1.Controller/{method}",
                "grpc_status_code": code,
            },
        )
        return value or 0.0

    async def wait(
        self, check: Callable[[], bool], *, timeout: float, message: str | Callable[[], str]
    ) -> None:
        """Poll ``check`` every 10 ms until true (failing at once if the sidecar died)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            if self.running.done():
                self.running.result()
                raise AssertionError("the provisioner sidecar stopped")
            if check():
                return
            if loop.time() > deadline:
                text = message() if callable(message) else message
                raise AssertionError(f"timed out after {timeout}s waiting for: {text}")
            await asyncio.sleep(0.01)

    def claims(self) -> list[Obj]:
        return our_claims(self.server, self.namespaces)

    def uids(self) -> list[str]:
        return [c["metadata"]["uid"] for c in self.claims()]

    def volumes(self) -> list[Obj]:
        return our_volumes(self.server, [self.class_name])

    def events(self, reason: str, name: str) -> list[Obj]:
        return [
            e
            for e in self.server.storage.list(EVENTS)
            if e.get("reason") == reason and (e.get("involvedObject") or {}).get("name") == name
        ]

    def have_events(self, reason: str, names: Iterable[str]) -> bool:
        """Every object of ``names`` has an event with ``reason``."""
        return all(self.events(reason, name) for name in names)

    async def wait_bound(self, total: int, timeout: float = 30) -> None:
        await self.wait(
            lambda: all_bound(self.server, self.namespaces, total),
            timeout=timeout,
            message=lambda: unbound_report(self.server, self.namespaces),
        )

    async def wait_all_gone(self, timeout: float = 30) -> None:
        await self.wait(
            lambda: not self.backend.volumes and not self.volumes() and not self.claims(),
            timeout=timeout,
            message=lambda: (
                f"{len(self.backend.volumes)} volumes, {len(self.volumes())} PVs and "
                f"{len(self.claims())} claims left"
            ),
        )

    def check(self) -> None:
        """The suite's invariants, plus the CSI ones; a failure lists every problem found, with
        the driver's call history of the volumes involved."""
        self.watch.check()
        problems = list(self.watch.violations)
        try:
            check_invariants(
                self.server,
                self.namespaces,
                [self.class_name],
                self.backend.volumes,
                deleted_uids=self.deleted_uids,
            )
        except AssertionError as err:
            problems.insert(0, str(err))
        for pv in self.volumes():
            name = pv["metadata"]["name"]
            handle = ((pv.get("spec") or {}).get("csi") or {}).get("volumeHandle")
            volume = self.backend.volumes.get(name)
            if volume is None or volume.volume_id != handle:
                problems.append(f"PV {name} has volumeHandle {handle}, the driver {volume}")
        for name, n in self.backend.creations.items():
            if n != 1:
                problems.append(f"volume {name} was created {n} times")
        for name, n in self.backend.deletions.items():
            if n != 1:
                problems.append(f"volume {name} was deleted {n} times")
        if problems:
            involved = {n for n in self.backend.creations if any(n in p for p in problems)}
            history = {
                n: [
                    (c.method, c.status.name, round(c.at, 3))
                    for c in self.backend.calls
                    if c.name == n
                ]
                for n in sorted(involved)
            }
            raise AssertionError(f"{problems}; driver calls: {history}")

    async def quiet(self) -> None:
        """Nothing queued or believed in progress any more."""
        await self.wait(
            lambda: (
                len(self.controller.claim_queue) == 0
                and len(self.controller.volume_queue) == 0
                and not self.sidecar.in_progress()
                and not self.sidecar.in_flight()
            ),
            timeout=15,
            message=lambda: (
                f"queues {len(self.controller.claim_queue)}/{len(self.controller.volume_queue)},"
                f" in progress {sorted(self.sidecar.in_progress())},"
                f" in flight {sorted(self.sidecar.in_flight())}"
            ),
        )

    async def delete_all(self) -> None:
        self.deleted_uids.extend(self.uids())
        keys = [(c["metadata"]["namespace"], c["metadata"]["name"]) for c in self.claims()]
        await delete_claims(self.client, keys)


@contextlib.asynccontextmanager
async def csi_stack(
    *,
    namespaces: int = 1,
    topology: bool = False,
    call_timeout: float = 5.0,
    exit_on_connection_loss: bool = False,
    class_extra: dict[str, Any] | None = None,
    **controller_options: Any,
) -> AsyncIterator[Stack]:
    """API server with binder, the fault driver, and the provisioner sidecar running (with
    the sidecar's default ``--provisioning-finalizer=true`` unless told otherwise)."""
    controller_options.setdefault("retry_interval_max", RETRY_INTERVAL_MAX)
    controller_options.setdefault("provisioning_finalizer", True)
    async with ApiServer(binder=True) as server, server.api_client() as client:
        ns_names = [unique("csi") for _ in range(namespaces)]
        for ns in ns_names:
            await create_namespace(client, ns)
        class_name = await create_class(
            client, provisioner=DRIVER_NAME, reclaimPolicy="Delete", **(class_extra or {})
        )
        with socket_dir() as directory:
            async with FaultDriver(directory / "csi.sock", topology=topology) as driver:
                registry = CollectorRegistry()
                sidecar = Sidecar(
                    client,
                    driver.endpoint,
                    ConnectionOptions(
                        timeout=call_timeout,
                        backoff_start=0.01,
                        backoff_max=0.1,
                        exit_on_connection_loss=exit_on_connection_loss,
                    ),
                    CSIMetrics(registry),
                    controller_options,
                )
                watch = PVWatch(server, driver.backend)
                watcher = asyncio.create_task(watch.run(), name="pv-watch")
                running = asyncio.create_task(sidecar.run(), name="sidecar")
                try:
                    await wait_until(
                        lambda: (
                            running.done()
                            or (sidecar.controller is not None and sidecar.controller.ready())
                        ),
                        timeout=15,
                        message="provisioner sidecar ready",
                    )
                    if running.done():
                        running.result()  # surface the failure
                        raise AssertionError("the sidecar stopped before it was ready")
                    yield Stack(
                        server,
                        client,
                        driver,
                        sidecar,
                        watch,
                        registry,
                        ns_names,
                        class_name,
                        running,
                    )
                finally:
                    sidecar.stop()
                    try:
                        async with asyncio.timeout(20):
                            await asyncio.shield(running)
                    finally:
                        for task in (running, watcher):
                            task.cancel()
                            with contextlib.suppress(asyncio.CancelledError):
                                await task


async def claim_uids(stack: Stack, count: int) -> dict[str, str]:
    """Create ``count`` claims spread over the stack's namespaces; {volume name: claim uid}."""
    per_namespace = -(-count // len(stack.namespaces))
    await create_claims(stack.client, stack.namespaces, per_namespace, stack.class_name)
    return {f"pvc-{c['metadata']['uid']}": c["metadata"]["uid"] for c in stack.claims()}


# -- restarts -----------------------------------------------------------------------------------


@dataclass
class Restarts:
    """What a restart loop did: restarts in all, those that cut a backend operation short, and
    those that hit the sidecar while it was reconnecting or starting."""

    total: int = 0
    mid_operation: int = 0
    mid_recovery: int = 0


@contextlib.asynccontextmanager
async def restarting(
    driver: FaultDriver,
    sidecar: Sidecar,
    rng: random.Random,
    interval: float,
    down: float,
) -> AsyncIterator[Restarts]:
    """Restart the driver (socket gone for up to ``down`` seconds) about every ``interval``
    seconds during the block, aiming in turn at a backend operation in progress and at the
    sidecar recovering from the previous restart (reconnecting, or starting after it exited),
    when either happens within ``interval``."""
    done = Restarts()

    def recovering() -> bool:
        connection = sidecar.connection
        return sidecar.starting or (connection is not None and connection.lost)

    async def restart() -> None:
        if driver.backend.busy:
            done.mid_operation += 1
        if recovering():
            done.mid_recovery += 1
        # Once begun, a restart completes: the end of the block must not leave the driver
        # half-started.
        task = asyncio.ensure_future(driver.restart(rng.uniform(0, down)))
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            await task
            raise
        done.total += 1

    async def loop() -> None:
        clock = asyncio.get_running_loop()
        aims: list[Callable[[], bool]] = [lambda: bool(driver.backend.busy), recovering]
        while True:
            # An operation in progress is the window in which the caller loses its answer
            # while the backend goes on; a sidecar recovering is one a crash-looping driver
            # hits. The socket is back (and probed) 0-``down`` seconds after a restart.
            aim = aims[done.total % len(aims)]
            aim_until = clock.time() + interval
            if not done.mid_operation:
                # Until one restart has cut an operation, wait for one however long the
                # phase takes to start working: a loaded machine must not make it miss.
                aim, aim_until = aims[0], clock.time() + 20
            while not aim() and clock.time() < aim_until:
                await asyncio.sleep(0.002)
            await restart()
            await asyncio.sleep(rng.uniform(interval / 2, interval * 1.5))

    async with background(loop()):
        yield done


async def run_restarts(
    *,
    exit_on_connection_loss: bool,
    claims: int,
    namespaces: int,
    seed: int,
    interval: float,
    min_restarts: int,
) -> None:
    rng = random.Random(seed)
    async with csi_stack(
        namespaces=namespaces, exit_on_connection_loss=exit_on_connection_loss, call_timeout=2.0
    ) as s:
        # Each create and delete takes the backend 10-60 ms: restarts land mid-operation.
        s.backend.latency = (0.01, 0.06)
        first = s.sidecar.connection
        per_namespace = claims // namespaces
        async with restarting(s.driver, s.sidecar, rng, interval, interval / 3) as restarts:
            await create_claims(s.client, s.namespaces, per_namespace, s.class_name)
            # Keep restarting while provisioning goes on, at least min_restarts times.
            await s.wait(
                lambda: restarts.total >= min_restarts and restarts.mid_operation > 0,
                timeout=30,
                message=lambda: f"{restarts} while provisioning",
            )
        assert restarts.mid_operation > 0, "no restart cut an operation: the test tested little"
        await s.wait_bound(claims)
        s.check()
        assert sum(s.backend.creations.values()) == claims

        async with restarting(s.driver, s.sidecar, rng, interval, interval / 3) as restarts:
            await s.delete_all()
            await s.wait(
                lambda: restarts.total >= min_restarts and restarts.mid_operation > 0,
                timeout=30,
                message=lambda: f"{restarts} while deleting",
            )
        assert restarts.mid_operation > 0, "no restart cut an operation: the test tested little"
        await s.wait_all_gone()
        s.check()
        await s.quiet()
        if exit_on_connection_loss:
            assert s.sidecar.exits >= 1, "the sidecar never noticed a lost connection"
        else:
            assert s.sidecar.exits == 0
            assert s.sidecar.connection is first, "the connection was replaced, not recovered"
            assert first is not None
            await s.wait(lambda: not first.lost, timeout=10, message="the connection recovered")


@pytest.mark.parametrize("exit_on_connection_loss", [False, True], ids=["reconnect", "exit"])
async def test_driver_restarts_while_provisioning_and_deleting(
    exit_on_connection_loss: bool,
) -> None:
    await run_restarts(
        exit_on_connection_loss=exit_on_connection_loss,
        claims=30,
        namespaces=3,
        seed=int(exit_on_connection_loss),
        interval=0.4 if exit_on_connection_loss else 0.15,
        min_restarts=3,
    )


@pytest.mark.slow
@pytest.mark.parametrize("exit_on_connection_loss", [False, True], ids=["reconnect", "exit"])
async def test_driver_restarts_200_claims(exit_on_connection_loss: bool) -> None:
    await run_restarts(
        exit_on_connection_loss=exit_on_connection_loss,
        claims=200,
        namespaces=10,
        seed=10 + int(exit_on_connection_loss),
        interval=0.5 if exit_on_connection_loss else 0.2,
        min_restarts=15,
    )


# -- hangs past the call timeout ----------------------------------------------------------------

HANG_TIMEOUT = 0.25
"""The CSI call timeout (``--timeout``) of the hang scenarios."""
HANG = 0.7
"""How long the backend takes for a hanging operation: well past the timeout."""


async def run_hangs(claims: int, namespaces: int) -> None:
    async with csi_stack(namespaces=namespaces, call_timeout=HANG_TIMEOUT) as s:
        s.backend.fail(CREATE, Fault(delay=HANG, times=UNTIL_CLEARED))
        names = await claim_uids(s, claims)
        await s.wait_bound(claims)
        s.check()
        # Every first call timed out; each volume appeared in the backend only afterwards
        # (retries meanwhile were told ABORTED) and a later retry found it: one volume each.
        assert s.csi_calls(CREATE, "DeadlineExceeded") >= claims
        assert sorted(s.backend.creations) == sorted(names)
        s.backend.clear()

        s.backend.fail(DELETE, Fault(delay=HANG, times=UNTIL_CLEARED))
        await s.delete_all()
        await s.wait_all_gone()
        s.check()
        # Events are written in the background: wait for them rather than assume.
        await s.wait(
            lambda: all(s.events("VolumeFailedDelete", n) for n in names),
            timeout=10,
            message="a VolumeFailedDelete event on every PV",
        )
        for name in names:
            failed = s.events("VolumeFailedDelete", name)[0]
            assert "DeadlineExceeded" in failed["message"]
        assert s.csi_calls(DELETE, "DeadlineExceeded") >= claims
        await s.quiet()


async def test_create_and_delete_hang_past_the_timeout() -> None:
    await run_hangs(claims=20, namespaces=2)


@pytest.mark.slow
async def test_create_and_delete_hang_past_the_timeout_200_claims() -> None:
    await run_hangs(claims=200, namespaces=10)


async def run_deleted_mid_hang(claims: int) -> None:
    """Issue 5's promise: a claim deleted while its CreateVolume hangs leaves no volume."""
    async with csi_stack(call_timeout=HANG_TIMEOUT) as s:
        # Long enough that each claim is still hanging when the test deletes it.
        s.backend.fail(CREATE, Fault(delay=4 * HANG, times=UNTIL_CLEARED))
        names = await claim_uids(s, claims)
        keys = {
            f"pvc-{c['metadata']['uid']}": (c["metadata"]["namespace"], c["metadata"]["name"])
            for c in s.claims()
        }
        ordered = sorted(names)
        # Half are deleted as soon as their first CreateVolume runs in the backend, half once
        # the controller saw it time out and keeps the claim in progress.
        triggers: dict[str, Callable[[], bool]] = {}
        for index, name in enumerate(ordered):
            if index % 2:
                triggers[name] = lambda n=name: names[n] in s.sidecar.in_progress()  # type: ignore[misc]
            else:
                triggers[name] = lambda n=name: n in s.backend.busy  # type: ignore[misc]

        async def delete_when_due() -> None:
            while triggers:
                due = [name for name, ready in triggers.items() if ready()]
                for name in due:
                    del triggers[name]
                if due:
                    await delete_claims(s.client, [keys[n] for n in due])
                await asyncio.sleep(0.005)

        async with asyncio.timeout(30):
            await delete_when_due()
        s.deleted_uids.extend(names.values())
        await s.wait_all_gone()
        await s.quiet()
        s.check()
        for name in ordered:
            assert s.backend.creations[name] == 1, f"{name}: {s.backend.creations[name]}"
            assert s.backend.deletions[name] == 1, f"{name}: {s.backend.deletions[name]}"
            assert name not in s.watch.seen, f"a PV was saved for deleted claim {name}"
            assert not s.events("ProvisioningSucceeded", keys[name][1])


async def test_claim_deleted_while_create_volume_hangs() -> None:
    await run_deleted_mid_hang(20)


@pytest.mark.slow
async def test_claims_deleted_while_create_volume_hangs_200() -> None:
    await run_deleted_mid_hang(200)


async def test_claim_deleted_mid_hang_then_sidecar_restart_leaks_nothing() -> None:
    """Issue 5's promise across a restart of the sidecar: the driver restarts while volumes
    are being created for claims the user just deleted; the sidecar exits on the lost
    connection and starts again; the backend finishes the volumes afterwards."""
    async with csi_stack(exit_on_connection_loss=True, call_timeout=HANG_TIMEOUT) as s:
        s.backend.fail(CREATE, Fault(delay=2 * HANG, times=UNTIL_CLEARED))
        names = await claim_uids(s, 3)
        await s.wait(
            lambda: all(n in s.backend.busy for n in names),
            timeout=15,
            message="every CreateVolume running in the backend",
        )
        s.deleted_uids.extend(names.values())
        await delete_claims(
            s.client, [(c["metadata"]["namespace"], c["metadata"]["name"]) for c in s.claims()]
        )
        await s.driver.restart()
        await s.wait(lambda: s.sidecar.exits >= 1, timeout=15, message="the sidecar exited")
        await s.wait(
            lambda: all(n in s.backend.creations for n in names),
            timeout=15,
            message="the backend finished creating the volumes",
        )
        await s.wait(
            lambda: not s.backend.volumes,
            timeout=2,
            message=lambda: f"volumes of deleted claims left: {sorted(s.backend.volumes)}",
        )
        # The provisioning-protection finalizer held the claims until then; now they go.
        await s.wait(
            lambda: not s.claims(),
            timeout=5,
            message=lambda: f"claims left: {[c['metadata'] for c in s.claims()]}",
        )
        assert s.sidecar.exits >= 1
        for name in names:
            assert s.backend.creations[name] == 1, f"{name}: {s.backend.creations[name]}"
            assert s.backend.deletions[name] == 1, f"{name}: {s.backend.deletions[name]}"
        s.check()


# -- every status code from each controller RPC ----------------------------------------------


async def wait_retried(
    s: Stack, method: str, names: Iterable[str], code: Status, recorded: Callable[[], bool]
) -> None:
    """Wait until ``method`` answered ``code`` at least twice for each volume of ``names`` (so
    the failure was retried) and ``recorded()`` shows the failure where the sidecar puts it
    (events, statuses)."""
    names = list(names)
    await s.wait(
        lambda: all(s.backend.count(method, n, code) >= 2 for n in names) and recorded(),
        timeout=20,
        message=lambda: f"two failed {method} per volume, recorded: {s.backend.calls}",
    )


def injected(code: Status) -> Fault:
    return Fault(code, f"{GO_STATUS_NAMES[code]} from the driver", times=UNTIL_CLEARED)


def claim_keys(s: Stack) -> dict[str, tuple[str, str]]:
    """{volume name: (namespace, claim name)} of the live claims."""
    return {
        f"pvc-{c['metadata']['uid']}": (c["metadata"]["namespace"], c["metadata"]["name"])
        for c in s.claims()
    }


async def create_phase(s: Stack, code: Status, claims: int = 2) -> dict[str, str]:
    """CreateVolume answers ``code`` until the claims were retried, then the fault clears and
    they are provisioned. Returns {volume name: claim uid}."""
    go_name = GO_STATUS_NAMES[code]
    s.backend.fail(CREATE, injected(code))
    names = await claim_uids(s, claims)
    keys = claim_keys(s)
    # Retried (INVALID_ARGUMENT only after the slow-retry period), an event each time.
    claim_names = [claim for _ns, claim in keys.values()]
    await wait_retried(
        s, CREATE, names, code, lambda: s.have_events("ProvisioningFailed", claim_names)
    )
    in_progress = s.controller.claims_in_progress()
    for name, uid in names.items():
        claim = keys[name][1]
        events = s.events("ProvisioningFailed", claim)
        assert any(go_name in e["message"] for e in events), events
        # upstream's checkError: the four codes of an operation that may still run keep the
        # claim in progress (retried until it ends, however often); the others are final.
        assert (uid in in_progress) is (code in IN_BACKGROUND), (code, in_progress)
        if code is Status.INVALID_ARGUMENT:
            # Infeasible: retried only after the slow-retry period.
            first, second = [c.at for c in s.backend.calls if c.name == name][:2]
            assert second - first >= 0.9 * RETRY_INTERVAL_MAX, "retried before the slow period"
            assert any("infeasible" in e["message"] for e in events), events
    assert not s.backend.volumes, "a failed CreateVolume left a volume"
    assert not s.volumes()

    s.backend.clear()
    await s.wait_bound(claims)
    s.check()
    return names


async def delete_phase(s: Stack, code: Status, names: Iterable[str]) -> None:
    """DeleteVolume answers ``code`` until retried, then the fault clears: the PVs are kept
    meanwhile (each with a VolumeFailedDelete event), then everything goes."""
    go_name = GO_STATUS_NAMES[code]
    names = list(names)
    s.backend.fail(DELETE, injected(code))
    await s.delete_all()
    await wait_retried(s, DELETE, names, code, lambda: s.have_events("VolumeFailedDelete", names))
    for name in names:
        events = s.events("VolumeFailedDelete", name)
        assert any(go_name in e["message"] for e in events), events
        # The PV is kept while its volume exists: it is how the volume is found again.
        pv = s.server.storage.get(PERSISTENT_VOLUMES, None, name)
        assert pv is not None, f"PV {name} deleted although DeleteVolume failed"
        assert name in s.backend.volumes
    s.watch.check()
    assert not s.watch.violations

    s.backend.clear()
    await s.wait_all_gone()
    s.check()
    await s.quiet()


@pytest.mark.parametrize("code", CODES, ids=code_id)
async def test_create_and_delete_volume_return_status_then_succeed(code: Status) -> None:
    async with csi_stack() as s:
        names = await create_phase(s, code)
        await delete_phase(s, code, names)


async def test_resource_exhausted_with_a_selected_node_reschedules() -> None:
    """With topology and a selected node, RESOURCE_EXHAUSTED gives the claim back to the
    scheduler (the selected-node annotation is removed) instead of retrying on that node."""
    async with csi_stack(
        topology=True, class_extra={"volumeBindingMode": "WaitForFirstConsumer"}
    ) as s:
        await create_driver_node(s.client, "node-a", DRIVER_NAME, TOPOLOGY_KEY, value="zone-a")
        await create_driver_node(s.client, "node-b", DRIVER_NAME, TOPOLOGY_KEY, value="zone-b")
        s.backend.fail(
            CREATE, Fault(Status.RESOURCE_EXHAUSTED, "zone-a is full", times=UNTIL_CLEARED)
        )
        claims = ResourceClient(s.client, PERSISTENT_VOLUME_CLAIMS)
        ns = s.namespaces[0]
        body: Obj = {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {
                "name": "claim-0",
                "namespace": ns,
                "annotations": {ANN_SELECTED_NODE: "node-a"},
            },
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": s.class_name,
                "resources": {"requests": {"storage": "1Gi"}},
            },
        }
        created = await claims.create(body, ns)
        name = f"pvc-{created['metadata']['uid']}"

        def unscheduled() -> bool:
            claim = s.server.storage.get(PERSISTENT_VOLUME_CLAIMS, ns, "claim-0") or {}
            return ANN_SELECTED_NODE not in (claim.get("metadata", {}).get("annotations") or {})

        await s.wait(
            lambda: unscheduled() and bool(s.events("ProvisioningFailed", "claim-0")),
            timeout=15,
            message="the selected node removed, an event written",
        )
        assert s.backend.count(CREATE, name, Status.RESOURCE_EXHAUSTED) == 1
        events = s.events("ProvisioningFailed", "claim-0")
        assert any("ResourceExhausted" in e["message"] for e in events), events
        assert created["metadata"]["uid"] not in s.controller.claims_in_progress()
        # The scheduler picks another node; the driver has room there.
        s.backend.clear()
        await claims.patch(
            "claim-0", {"metadata": {"annotations": {ANN_SELECTED_NODE: "node-b"}}}, namespace=ns
        )
        await s.wait_bound(1)
        s.check()
        assert s.backend.volumes[name].topology == {TOPOLOGY_KEY: "zone-b"}
        assert s.backend.count(CREATE, name, Status.RESOURCE_EXHAUSTED) == 1
        await s.delete_all()
        await s.wait_all_gone()
        s.check()


# -- the attacher and the resizer -------------------------------------------------------------


@contextlib.asynccontextmanager
async def running(s: Stack, controller: AttachController | ResizeController) -> AsyncIterator[None]:
    """Run another controller on the stack's CSI connection for the block."""
    task = asyncio.create_task(controller.run())
    try:
        await s.wait(
            lambda: task.done() or controller.ready(), timeout=15, message="controller ready"
        )
        if task.done():
            task.result()
            raise AssertionError("the controller stopped before it was ready")
        yield
    finally:
        controller.stop()
        try:
            async with asyncio.timeout(15):
                await asyncio.shield(task)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def finalizers(obj: Obj | None) -> list[str]:
    return list(((obj or {}).get("metadata") or {}).get("finalizers") or [])


def status_of(obj: Obj | None) -> Obj:
    return (obj or {}).get("status") or {}


def conditions(status: Obj) -> dict[str, Obj]:
    return {c["type"]: c for c in status.get("conditions") or []}


class Attachments:
    """VolumeAttachments of the stack's volumes, one node each."""

    def __init__(self, s: Stack, names: list[str]) -> None:
        self.s = s
        self.names = names
        self.node_ids = {name: f"csi-node-{i}" for i, name in enumerate(names)}
        self.vas = ResourceClient(s.client, VOLUME_ATTACHMENTS)

    async def register_nodes(self) -> None:
        csinodes = ResourceClient(self.s.client, CSINODES)
        for index, name in enumerate(self.names):
            await csinodes.create(
                {
                    "apiVersion": "storage.k8s.io/v1",
                    "kind": "CSINode",
                    "metadata": {"name": f"node-{index}"},
                    "spec": {"drivers": [{"name": DRIVER_NAME, "nodeID": self.node_ids[name]}]},
                }
            )

    def va(self, index: int) -> Obj | None:
        return self.s.server.storage.get(VOLUME_ATTACHMENTS, None, f"va-{index}")

    def published(self, name: str) -> bool:
        volume = self.s.backend.volumes[name]
        return self.node_ids[name] in self.s.backend.published.get(volume.volume_id, set())

    def errors(self, field: str) -> list[Obj]:
        return [status_of(self.va(i)).get(field) or {} for i in range(len(self.names))]

    def saved_errors(self, field: str, code: Status) -> bool:
        """Every VolumeAttachment's ``field`` (``attachError``, ``detachError``) carries
        ``code``."""
        return all(e.get("errorCode") == code.value for e in self.errors(field))

    async def create(self) -> None:
        for index, name in enumerate(self.names):
            await self.vas.create(
                attachment_body(f"va-{index}", DRIVER_NAME, f"node-{index}", name)
            )

    async def delete(self) -> None:
        for index in range(len(self.names)):
            await self.vas.delete(f"va-{index}")


async def publish_phase(s: Stack, code: Status, at: Attachments) -> None:
    """ControllerPublishVolume answers ``code`` until retried; the error (with its code) is
    saved on each VolumeAttachment and the finalizers stay; then the volumes attach."""
    go_name = GO_STATUS_NAMES[code]
    finalizer = finalizer_name(DRIVER_NAME)
    s.backend.fail(PUBLISH, injected(code))
    await at.create()
    await wait_retried(s, PUBLISH, at.names, code, lambda: at.saved_errors("attachError", code))
    for index, name in enumerate(at.names):
        current = at.va(index)
        assert go_name in status_of(current)["attachError"]["message"]
        assert not status_of(current).get("attached")
        # Finalizers go on before the call, and stay: the volume may be attached.
        assert finalizer in finalizers(current)
        assert finalizer in finalizers(s.server.storage.get(PERSISTENT_VOLUMES, None, name))
        assert not at.published(name)
    s.backend.clear()
    await s.wait(
        lambda: all(status_of(at.va(i)).get("attached") for i in range(len(at.names))),
        timeout=20,
        message="attached",
    )
    assert all(at.published(n) for n in at.names)
    assert not any(at.errors("attachError"))


async def unpublish_phase(s: Stack, code: Status, at: Attachments) -> None:
    """ControllerUnpublishVolume answers ``code`` until retried; the VolumeAttachments stay
    (with their finalizer and the error) while the volumes are still published; then they go."""
    go_name = GO_STATUS_NAMES[code]
    finalizer = finalizer_name(DRIVER_NAME)
    s.backend.fail(UNPUBLISH, injected(code))
    await at.delete()
    await wait_retried(s, UNPUBLISH, at.names, code, lambda: at.saved_errors("detachError", code))
    for index, name in enumerate(at.names):
        current = at.va(index)
        assert current is not None, "a VolumeAttachment went away while detaching failed"
        assert finalizer in finalizers(current)
        assert go_name in status_of(current)["detachError"]["message"]
        assert at.published(name)
    s.backend.clear()
    await s.wait(
        lambda: all(at.va(i) is None for i in range(len(at.names))),
        timeout=20,
        message="VolumeAttachments detached and gone",
    )
    assert not s.backend.published


async def expand_phase(s: Stack, code: Status, names: Iterable[str]) -> None:
    """ControllerExpandVolume answers ``code`` until retried: a VolumeResizeFailed event, the
    claim's allocation status and conditions as external-resizer sets them for that code; then
    the claims, PVs and volumes grow."""
    go_name = GO_STATUS_NAMES[code]
    names = list(names)
    keys = claim_keys(s)
    claims = ResourceClient(s.client, PERSISTENT_VOLUME_CLAIMS)

    def status(name: str) -> Obj:
        namespace, claim = keys[name]
        return status_of(s.server.storage.get(PERSISTENT_VOLUME_CLAIMS, namespace, claim))

    s.backend.fail(EXPAND, injected(code))
    for namespace, claim in keys.values():
        await claims.patch(
            claim, {"spec": {"resources": {"requests": {"storage": "2Gi"}}}}, namespace=namespace
        )
    claim_names = [claim for _ns, claim in keys.values()]
    await wait_retried(
        s, EXPAND, names, code, lambda: s.have_events("VolumeResizeFailed", claim_names)
    )
    final = code.value not in IN_PROGRESS_CODES
    infeasible = code.value in INFEASIBLE_CODES
    for name in names:
        events = s.events("VolumeResizeFailed", keys[name][1])
        assert any(f"code = {go_name}" in e["message"] for e in events), events
        current = status(name)
        allocated = (current.get("allocatedResourceStatuses") or {}).get("storage")
        expected = "ControllerResizeInfeasible" if infeasible else "ControllerResizeInProgress"
        assert allocated == expected, (code, current)
        # Only a final error is recorded as a condition (nothing runs in the backend any more).
        assert ("ControllerResizeError" in conditions(current)) is final, (code, current)
        assert (current.get("capacity") or {}).get("storage") == "1Gi"
        assert s.backend.volumes[name].capacity == GI

    s.backend.clear()
    await s.wait(
        lambda: all((status(n).get("capacity") or {}).get("storage") == "2Gi" for n in names),
        timeout=20,
        message="claims expanded",
    )
    for name in names:
        current = status(name)
        assert not current.get("allocatedResourceStatuses"), current
        assert not {"ControllerResizeError", "Resizing"} & set(conditions(current)), current
        pv = s.server.storage.get(PERSISTENT_VOLUMES, None, name) or {}
        assert pv["spec"]["capacity"]["storage"] == "2Gi"
        assert s.backend.volumes[name].capacity == 2 * GI


RESIZE_RETRY_MAX = 0.4
"""The resizer's longest retry interval (infeasible expansions wait this long)."""


@pytest.mark.parametrize("code", CODES, ids=code_id)
async def test_publish_expand_unpublish_return_status_then_succeed(code: Status) -> None:
    """The attacher and the resizer on the provisioner's driver: attach, expand the attached
    volumes online, detach, each RPC first answering ``code``; then the claims are deleted
    and nothing is left (no VolumeAttachment, no finalizer holding a PV, no volume)."""
    async with csi_stack(class_extra={"allowVolumeExpansion": True}) as s:
        names = sorted(await claim_uids(s, 2))
        await s.wait_bound(2)
        connection = s.sidecar.connection
        assert connection is not None
        attacher = AttachController(
            s.client,
            DRIVER_NAME,
            CSIAttacher(connection),
            AttachControllerOptions(
                retry_interval_start=0.01,
                retry_interval_max=0.2,
                workers=4,
                resync_period=0.0,
                timeout=5.0,
                registry=CollectorRegistry(),
            ),
        )
        resizer = ResizeController(
            s.client,
            CSIResizer(connection, s.client),
            ResizeControllerOptions(
                retry_interval_start=0.01,
                retry_interval_max=RESIZE_RETRY_MAX,
                workers=4,
                resync_period=0.0,
                timeout=5.0,
                registry=CollectorRegistry(),
            ),
        )
        at = Attachments(s, names)
        await at.register_nodes()
        async with running(s, attacher), running(s, resizer):
            await publish_phase(s, code, at)
            await expand_phase(s, code, names)
            await unpublish_phase(s, code, at)
            # The PVs lose the attacher's finalizer once deleted: nothing is left behind.
            await s.delete_all()
            await s.wait_all_gone()
        s.check()
        assert s.backend.count(UNPUBLISH, status=Status.OK) >= len(names)

"""The ResizeController under API faults and crashes (issue 11, "Faults" and "Process crashes",
for the resizer).

Bound claims are expanded several times each — some expansions while API faults of every kind
of test_api_faults.py are injected, some with a second, larger request made while the first
is still being carried out — or while the controller is crashed (task cancelled) at random
points, the backend pausing after each expansion and PV writes slowed, so crashes land
between "expanded in the backend" and "PV capacity saved" and between that and "claim status
saved". At the end, for every claim:

- backend size == PV ``spec.capacity`` == claim ``status.capacity`` == its largest request,
  and ``status.allocatedResources`` says the same;
- no resize condition left (``Resizing``, ``ControllerResizeError``, ...) and no
  ``allocatedResourceStatuses``;
- the backend was never asked for less than it had (a shrink) nor for more than the claim
  ever requested (an overshoot); repeating an expansion at the size it has is allowed (it is
  how a restarted controller finishes an interrupted one);
- events: ``Resizing`` and ``VolumeResizeSuccessful`` for the claim, from the resizer.
  Warnings (``VolumeResizeFailed``) only for failures the user may hear about: injected API
  errors, and — as upstream, whose "mark finished" write is guarded by the claim's
  resourceVersion too — a claim edited again while its expansion was being recorded (409).
  A crash alone never produces one.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest
from claim_support import claim_body, class_body
from kubernetes_asyncio.client import ApiClient, V1PersistentVolume
from rel_support import (
    FAULT_KINDS,
    Problems,
    bounded,
    cancel,
    chaos,
    create_namespace,
    csi_volume_body,
    load_support,
    unique,
    wait_until,
    with_retries,
)
from sidecar_support import running

from pyprovlib._resizer import ExpansionResult, Resizer
from pyprovlib.controller._resize import ResizeController
from pyprovlib.kube._objects import Obj, meta, name_of
from pyprovlib.kube._quantity import parse_quantity
from pyprovlib.kube._resources import (
    PERSISTENT_VOLUME_CLAIMS,
    PERSISTENT_VOLUMES,
    STORAGE_CLASSES,
)
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.testing._server import ApiServer

if TYPE_CHECKING:  # the same module, for tools/typecheck_tests.py
    import resize_support
else:
    resize_support = load_support("resize", "resize_support")

GI = 1024**3
RESIZE_CONDITIONS = {
    "Resizing",
    "FileSystemResizePending",
    "ControllerResizeError",
    "NodeResizeError",
}


def size_of(text: Any) -> int | None:
    """Bytes of a quantity string, None when missing or unparsable."""
    if not isinstance(text, str):
        return None
    try:
        return parse_quantity(text).value()
    except ValueError:
        return None


class RecordingResizer(Resizer):
    """A backend that applies what it is asked literally — so a shrink would shrink — and
    records every call. Asked for less than the volume has, it refuses (records a shrink and
    keeps the size, as a real backend would never shrink). Pauses up to ``max_pause`` seconds
    after each expansion so crashes land before the PV is updated."""

    def __init__(self, name: str, rng: random.Random, max_pause: float = 0.0) -> None:
        self.name = name
        self.rng = rng
        self.max_pause = max_pause
        self.sizes: dict[str, int] = {}
        self.calls: list[tuple[str, int]] = []
        self.shrinks: list[tuple[str, int, int]] = []  # (handle, had, asked)
        # When set, an expansion waits for it before doing anything (a slow backend).
        self.gate: asyncio.Event | None = None

    def can_support(self, pv: V1PersistentVolume) -> bool:
        csi = pv.spec.csi if pv.spec else None
        return csi is not None and csi.driver == self.name

    async def expand(self, pv: V1PersistentVolume, new_size: int) -> ExpansionResult:
        handle = str(pv.spec.csi.volume_handle)
        self.calls.append((handle, new_size))
        if self.gate is not None:
            await self.gate.wait()
        had = self.sizes[handle]
        if new_size < had:
            self.shrinks.append((handle, had, new_size))
        else:
            self.sizes[handle] = new_size
        if self.max_pause:
            await asyncio.sleep(self.rng.uniform(0, self.max_pause))
        return ExpansionResult(self.sizes[handle], node_expansion_required=False)


# -- the world of one scenario --------------------------------------------------------------------


@dataclass
class World(Problems):
    """The claims of one scenario and what the test asked of them."""

    server: ApiServer
    client: ApiClient
    resizer: RecordingResizer
    namespace: str = field(default_factory=lambda: unique("rel-resize"))
    storage_class: str = field(default_factory=lambda: unique("sc"))
    pvs: dict[str, str] = field(default_factory=dict)  # claim -> PV
    handles: dict[str, str] = field(default_factory=dict)  # claim -> volume handle
    requests: dict[str, list[int]] = field(default_factory=dict)  # claim -> bytes asked, in order
    pace: float = 0.0
    rng: random.Random = field(default_factory=random.Random)

    def controller(self) -> ResizeController:
        controller = ResizeController(self.client, self.resizer, resize_support.fast_options())
        # Events failed by injected faults are retried within the test's time, not in 10 s.
        controller.recorder.retry_sleep = 0.05
        return controller

    async def setup(self, claims: int) -> None:
        await create_namespace(self.client, self.namespace)
        await ResourceClient(self.client, STORAGE_CLASSES).create(
            class_body(
                self.storage_class,
                self.resizer.name,
                allowVolumeExpansion=True,
                reclaimPolicy="Retain",
            )
        )
        await bounded(self._bound_pair(i) for i in range(claims))
        await wait_until(
            lambda: (
                all((c.get("status") or {}).get("phase") == "Bound" for c in self.claims().values())
                and len(self.claims()) == claims
            ),
            timeout=30,
            message="claims Bound",
        )

    async def _bound_pair(self, index: int) -> None:
        """A PV pre-bound to a claim (statically provisioned), which the PV binder binds."""
        claim, pv, handle = f"claim-{index}", unique("pv"), unique("vol")
        self.pvs[claim], self.handles[claim] = pv, handle
        self.requests[claim] = [GI]
        self.resizer.sizes[handle] = GI
        await ResourceClient(self.client, PERSISTENT_VOLUMES).create(
            csi_volume_body(
                pv,
                {"driver": self.resizer.name, "volumeHandle": handle},
                storageClassName=self.storage_class,
                claimRef={"namespace": self.namespace, "name": claim},
            )
        )
        await ResourceClient(self.client, PERSISTENT_VOLUME_CLAIMS).create(
            claim_body(claim, self.storage_class, namespace=self.namespace, volumeName=pv),
            self.namespace,
        )

    async def request(self, claim: str, gib: int) -> None:
        """The user's edit: ask for ``gib`` GiB (retried through faults)."""
        if self.pace:
            await asyncio.sleep(self.rng.uniform(0, self.pace))
        self.requests[claim].append(gib * GI)
        body = {"spec": {"resources": {"requests": {"storage": f"{gib}Gi"}}}}
        api = ResourceClient(self.client, PERSISTENT_VOLUME_CLAIMS)
        await with_retries(lambda: api.patch(claim, body, namespace=self.namespace))

    # -- what the server holds -----------------------------------------------------------------

    def claims(self) -> dict[str, Obj]:
        return {
            name_of(c): c
            for c in self.server.storage.list("persistentvolumeclaims", self.namespace)
        }

    def events(self) -> list[Obj]:
        return list(self.server.storage.list("events", self.namespace))

    def problems(self) -> list[str]:
        """Every broken invariant of the claims' final state (empty once settled)."""
        problems: list[str] = []
        claims = self.claims()
        for claim, asked in self.requests.items():
            want = max(asked)
            pvc = claims.get(claim)
            pv = self.server.storage.get("persistentvolumes", None, self.pvs[claim])
            if pvc is None or pv is None:
                problems.append(f"claim {claim} or its PV is gone")
                continue
            status = pvc.get("status") or {}
            backend = self.resizer.sizes[self.handles[claim]]
            pv_size = size_of(((pv.get("spec") or {}).get("capacity") or {}).get("storage"))
            capacity = size_of((status.get("capacity") or {}).get("storage"))
            allocated = size_of((status.get("allocatedResources") or {}).get("storage"))
            if (backend, pv_size, capacity, allocated) != (want, want, want, want):
                problems.append(
                    f"claim {claim} wants {want}: backend {backend}, PV {pv_size}, "
                    f"capacity {capacity}, allocated {allocated}"
                )
            left = RESIZE_CONDITIONS & {str(c.get("type")) for c in status.get("conditions") or []}
            if left:
                problems.append(f"claim {claim} still has conditions {sorted(left)}")
            if (status.get("allocatedResourceStatuses") or {}).get("storage"):
                problems.append(
                    f"claim {claim} still has allocatedResourceStatuses "
                    f"{status['allocatedResourceStatuses']}"
                )
        return problems

    def check_calls(self) -> None:
        """No shrink, no overshoot: every call asked for at least what the volume had and at
        most the largest request its claim ever made."""
        assert self.resizer.shrinks == [], f"shrinks asked for: {self.resizer.shrinks[:5]}"
        largest = {self.handles[c]: max(asked) for c, asked in self.requests.items()}
        overshoots = [(h, n) for h, n in self.resizer.calls if n > largest[h]]
        assert overshoots == [], f"expansions beyond any request: {overshoots[:5]}"

    def check_events(self, warnings_allowed: Callable[[str], bool]) -> None:
        """Each claim got ``Resizing`` and ``VolumeResizeSuccessful`` from the resizer, about
        itself; warnings only ``VolumeResizeFailed`` with a message ``warnings_allowed``."""
        claims = self.claims()
        problems: list[str] = []
        by_claim: dict[str, dict[str, int]] = {c: {} for c in claims}
        for event in self.events():
            involved = event.get("involvedObject") or {}
            name = str(involved.get("name"))
            if name not in claims or involved.get("kind") != "PersistentVolumeClaim":
                continue
            if involved.get("uid") != meta(claims[name]).get("uid"):
                problems.append(f"event {event.get('reason')} names claim {name} by a wrong uid")
            source = str((event.get("source") or {}).get("component"))
            if source != f"external-resizer {self.resizer.name}":
                continue  # the PV binder's events
            reason = str(event.get("reason"))
            by_claim[name][reason] = by_claim[name].get(reason, 0) + int(event.get("count") or 1)
            if event.get("type") == "Warning" and not (
                reason == "VolumeResizeFailed" and warnings_allowed(str(event.get("message")))
            ):
                problems.append(f"warning on {name}: {reason}: {event.get('message')}")
        for name, reasons in by_claim.items():
            for wanted in ("Resizing", "VolumeResizeSuccessful"):
                if not reasons.get(wanted):
                    problems.append(f"claim {name} has no {wanted} event: {reasons}")
        assert not problems, f"{len(problems)} event problems: {problems[:8]}"


@contextlib.asynccontextmanager
async def world_of(
    claims: int, rng: random.Random, max_pause: float = 0.0, pace: float = 0.0
) -> AsyncIterator[World]:
    async with ApiServer(binder=True) as server, server.api_client() as client:
        resizer = RecordingResizer(f"{unique('rel-resize')}.test.pyprovlib.io", rng, max_pause)
        world = World(server, client, resizer, pace=pace, rng=rng)
        await world.setup(claims)
        yield world


async def settle(world: World, timeout: float = 60.0) -> None:
    await wait_until(world.settled, timeout=timeout, message=world.report)


async def grow(world: World, rng: random.Random, step: int) -> None:
    """Every claim asks for ``step`` GiB more; a third of them, chosen at random, asks for one
    GiB more again right after, while the first expansion may still be under way."""

    async def one(claim: str) -> None:
        current = max(world.requests[claim]) // GI
        await world.request(claim, current + step)
        if rng.random() < 1 / 3:
            await asyncio.sleep(rng.uniform(0, 0.05))
            await world.request(claim, current + step + 1)

    await bounded(one(c) for c in sorted(world.requests))


async def queue_drained(controller: ResizeController) -> None:
    await wait_until(
        lambda: len(controller.claim_queue) == 0, timeout=10, message="resizer queue drained"
    )


# -- API faults ------------------------------------------------------------------------------------


async def fault_scenario(kinds: Sequence[str], claims: int, seed: int) -> None:
    """Two rounds of growth: with faults (a third of the claims asking twice), then without."""
    rng = random.Random(seed)
    async with world_of(claims, rng) as world:
        controller = world.controller()
        async with running(controller):
            for step, faulty in ((1, True), (2, False)):
                if faulty:
                    async with chaos(world.server, kinds, seed * 10 + step) as injected:
                        await grow(world, rng, step)
                        with contextlib.suppress(AssertionError):
                            await wait_until(world.settled, timeout=0.5, message="")
                    assert injected, "no fault was injected: the scenario tested nothing"
                else:
                    await grow(world, rng, step)
                await settle(world)
            await queue_drained(controller)
            assert controller.healthy()
            world.check_calls()
            await wait_events(world, any_warning)


def any_warning(_message: str) -> bool:
    return True


def no_warning(_message: str) -> bool:
    return False


def edited_meanwhile(message: str) -> bool:
    """A 409: the claim was edited (a larger request) while the expansion was recorded."""
    return "the object has been modified" in message


def _events_report(world: World, warnings_allowed: Callable[[str], bool]) -> str:
    try:
        world.check_events(warnings_allowed)
    except AssertionError as err:
        return str(err)
    return ""


async def wait_events(world: World, warnings_allowed: Callable[[str], bool]) -> None:
    """Wait until the events are right (events failed by faults are retried)."""
    await wait_until(
        lambda: not _events_report(world, warnings_allowed),
        timeout=15,
        message=lambda: _events_report(world, warnings_allowed),
    )


@pytest.mark.parametrize("kind", FAULT_KINDS)
async def test_api_faults_while_expanding(kind: str) -> None:
    await fault_scenario([kind], claims=8, seed=FAULT_KINDS.index(kind))


@pytest.mark.slow
async def test_every_fault_mixed_200_claims() -> None:
    await fault_scenario(FAULT_KINDS, claims=200, seed=17)


# -- crashes ---------------------------------------------------------------------------------------


async def crash_scenario(claims: int, kills: int, seed: int) -> None:
    """Three rounds of growth, each while controllers are started and cancelled ``kills``
    times at random points; a last controller finishes each round."""
    rng = random.Random(seed)
    async with world_of(claims, rng, max_pause=0.03, pace=0.2) as world:
        # PV and claim status writes take a while: kills land between the backend, the PV
        # and the claim.
        world.server.faults.latency(0.03, verb="patch", resource="persistentvolumes")
        world.server.faults.latency(0.03, verb="patch", resource="persistentvolumeclaims/status")
        killed_mid_work: list[bool] = []

        async def crash_loop() -> None:
            for _ in range(kills):
                controller = world.controller()
                task = asyncio.create_task(controller.run())
                await asyncio.sleep(rng.uniform(0.05, 0.6))
                killed_mid_work.append(not world.settled())
                await cancel(task)

        for step in (1, 2, 1):
            await asyncio.gather(crash_loop(), grow(world, rng, step))
            controller = world.controller()
            async with running(controller):
                await settle(world)
                await queue_drained(controller)
        assert any(killed_mid_work), "no kill landed while there was work left"
        world.check_calls()
        await wait_events(world, edited_meanwhile)


async def test_controller_cancelled_at_random_points() -> None:
    await crash_scenario(claims=6, kills=3, seed=5)


@pytest.mark.slow
async def test_controller_cancelled_at_random_points_200_claims() -> None:
    await crash_scenario(claims=200, kills=25, seed=6)


async def test_crash_between_backend_pv_and_claim() -> None:
    """Killed exactly after the backend expanded but before the PV's capacity was saved (the
    PV patch held by API latency), then, for the next expansion, exactly after the PV was saved
    but before the claim's status was: the next controller repeats the expansion at the same
    size (never more, never less) and finishes the claim."""
    rng = random.Random(7)
    async with world_of(1, rng) as world:
        server, resizer = world.server, world.resizer
        (claim,) = world.requests
        handle = world.handles[claim]

        async def crash_in_window(resource: str, gib: int, window: Callable[[], bool]) -> None:
            """Ask for ``gib`` GiB; once the backend is called, hold the next ``resource``
            patch, let the expansion go on, kill the controller while the patch hangs; check
            ``window`` then let a new controller finish."""
            gate = resizer.gate = asyncio.Event()
            calls = len(resizer.calls)
            task = asyncio.create_task(world.controller().run())
            try:
                await world.request(claim, gib)
                await wait_until(
                    lambda: len(resizer.calls) > calls, timeout=15, message="expansion called"
                )
                before = server.requests.count("patch", resource)
                server.faults.latency(60.0, verb="patch", resource=resource, count=1)
                gate.set()
                await wait_until(
                    lambda: server.requests.count("patch", resource) > before,
                    timeout=15,
                    message=f"{resource} patch in flight",
                )
            finally:
                await cancel(task)
                resizer.gate = None
                server.faults.clear()
            assert window(), world.report()
            controller = world.controller()
            async with running(controller):
                await settle(world)

        def pv_size() -> int | None:
            pv = server.storage.get("persistentvolumes", None, world.pvs[claim])
            assert pv is not None
            return size_of(pv["spec"]["capacity"]["storage"])

        def claim_capacity() -> int | None:
            pvc = world.claims()[claim]
            return size_of(((pvc.get("status") or {}).get("capacity") or {}).get("storage"))

        # Window 1: the backend has 2Gi, the PV still says 1Gi.
        await crash_in_window(
            "persistentvolumes", 2, lambda: resizer.sizes[handle] == 2 * GI and pv_size() == GI
        )
        # Window 2: backend and PV have 3Gi, the claim's capacity still says 2Gi.
        await crash_in_window(
            "persistentvolumeclaims/status",
            3,
            lambda: resizer.sizes[handle] == pv_size() == 3 * GI and claim_capacity() == 2 * GI,
        )
        assert resizer.calls == [(handle, 2 * GI)] * 2 + [(handle, 3 * GI)] * 2
        world.check_calls()
        await wait_events(world, no_warning)

"""The AttachController under API faults and crashes (issue 11, "Faults" and "Process crashes",
for the attacher).

VolumeAttachments are created (some PVs attached to two nodes), deleted (some right after
they were created, while they are being attached), and PVs deleted (some while a VA still uses
them) — under each API fault kind of test_api_faults.py (injected while VAs are created and
deleted at once, the "churn"), or while the controller is crashed (task cancelled) again
and again, or while a real ``python -m pyprovlib.csi.attacher`` process is SIGKILLed.
Handlers: an in-memory attacher backend (with and without the reconciler) and the trivial
handler (the reconciler's crash variant runs with ``-m slow``). At the end:

- every live VA is attached exactly once in the backend (one attach that changed anything,
  however often attach was called), with ``status.attached`` true, the publish context, and
  the ``external-attacher/<driver>`` finalizer (none with the trivial handler);
- every deleted VA is gone, detached in the backend (one detach per attach);
- no backend attachment without a live VA;
- a PV used by a live VA carries the finalizer (so deleting it waits); a deleted PV no VA uses
  is gone. As upstream, the finalizer is removed only from a PV being deleted: a PV left in
  place keeps it after its last VA is gone (external-attacher's ``processFinalizers``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import sys
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from claim_support import attachment_body
from kubernetes_asyncio.client import ApiClient
from rel_support import (
    FAULT_KINDS,
    LoggedProcess,
    Problems,
    bounded,
    cancel,
    chaos,
    csi_volume_body,
    load_support,
    unique,
    wait_until,
    with_retries,
)
from sidecar_support import running, short_socket_dir

from pyprovlib._attacher import AttachNode, AttachVolume
from pyprovlib.controller._attach import NODE_ID_ANNOTATION, AttachController
from pyprovlib.controller._attach.options import finalizer_name
from pyprovlib.kube._objects import Obj, meta, name_of
from pyprovlib.kube._resources import CSINODES, PERSISTENT_VOLUMES, VOLUME_ATTACHMENTS
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.testing._server import ApiServer

if TYPE_CHECKING:  # the same modules, for tools/typecheck_tests.py
    import attach_support
    import csi_attach_driver
else:
    attach_support = load_support("attach", "attach_support")
    csi_attach_driver = load_support("attach", "csi_attach_driver")

PUBLISH_CONTEXT = {"devicePath": "/dev/reliability"}
Pair = tuple[str, str]  # (volume handle, node id)


class CountingAttacher(attach_support.MemoryAttacher):
    """The in-memory backend, counting the attaches and detaches that changed something, and
    pausing (up to ``max_pause`` seconds) after each operation so crashes land between "done
    in the backend" and "recorded in the API"."""

    def __init__(self, rng: random.Random, max_pause: float = 0.0) -> None:
        super().__init__(PUBLISH_CONTEXT)
        self.rng = rng
        self.max_pause = max_pause
        self.attaches: Counter[Pair] = Counter()
        self.detaches: Counter[Pair] = Counter()

    async def attach(
        self,
        volume: AttachVolume,
        node: AttachNode,
        readonly: bool,
        context: Mapping[str, str],
    ) -> Mapping[str, str]:
        pair = (volume.volume_id, node.node_id)
        before = pair in self.attached
        result: Mapping[str, str] = await super().attach(volume, node, readonly, context)
        if not before and pair in self.attached:
            self.attaches[pair] += 1
        await self._pause()
        return result

    async def detach(self, volume: AttachVolume, node: AttachNode) -> None:
        pair = (volume.volume_id, node.node_id)
        before = pair in self.attached
        await super().detach(volume, node)
        if before and pair not in self.attached:
            self.detaches[pair] += 1
        await self._pause()

    async def _pause(self) -> None:
        if self.max_pause:
            await asyncio.sleep(self.rng.uniform(0, self.max_pause))

    def pairs(self) -> set[Pair]:
        return set(self.attached)


class ListingCountingAttacher(CountingAttacher, attach_support.ListingAttacher):
    """The same backend able to list what it published: the reconciler runs too."""


HANDLERS = ("memory", "reconciler", "trivial")


# -- the world of one scenario --------------------------------------------------------------------


@dataclass
class World(Problems):
    """The objects of one scenario and what the test expects of them."""

    server: ApiServer
    client: ApiClient
    handler: str
    driver: str = field(default_factory=lambda: f"{unique('rel-attach')}.test.pyprovlib.io")
    nodes: dict[str, str] = field(default_factory=dict)  # node name -> node id
    handles: dict[str, str] = field(default_factory=dict)  # PV name -> volume handle
    live: dict[str, tuple[str, str]] = field(default_factory=dict)  # VA -> (PV, node)
    deleted_vas: dict[str, tuple[str, str]] = field(default_factory=dict)
    deleted_pvs: set[str] = field(default_factory=set)
    confirmed: set[str] = field(default_factory=set)  # VAs seen attached when settled
    # Crash scenarios spread the test's writes out, so kills land while work arrives.
    pace: float = 0.0
    concurrency: int = 16
    rng: random.Random = field(default_factory=random.Random)
    backend: CountingAttacher | None = None
    # For a backend this test does not own (a CSI driver): its attachments, uncounted.
    external_pairs: Callable[[], set[Pair]] | None = None
    # The publish context the backend returns for a volume handle.
    context_of: Callable[[str], Mapping[str, str]] = lambda _handle: PUBLISH_CONTEXT

    @property
    def finalizer(self) -> str:
        return finalizer_name(self.driver)

    @property
    def trivial(self) -> bool:
        return self.backend is None and self.external_pairs is None

    def pairs(self) -> set[Pair]:
        if self.backend is not None:
            return self.backend.pairs()
        if self.external_pairs is not None:
            return self.external_pairs()
        return set()

    def pair(self, pv: str, node: str) -> Pair:
        return (self.handles[pv], self.nodes[node])

    def controller(self, **options: Any) -> AttachController:
        if self.handler == "reconciler":
            options.setdefault("reconcile_sync", 0.3)
        return AttachController(
            self.client, self.driver, self.backend, attach_support.fast_options(**options)
        )

    # -- the test's own writes (retried through faults) -----------------------------------------

    async def create_nodes(self, count: int) -> None:
        api = ResourceClient(self.client, CSINODES)
        for i in range(count):
            name, node_id = unique("node"), f"id-{i}-{unique('n')}"
            self.nodes[name] = node_id
            body = {
                "apiVersion": "storage.k8s.io/v1",
                "kind": "CSINode",
                "metadata": {"name": name},
                "spec": {"drivers": [{"name": self.driver, "nodeID": node_id}]},
            }
            await with_retries(functools.partial(api.create, body))

    async def create_pvs(self, count: int) -> list[str]:
        api = ResourceClient(self.client, PERSISTENT_VOLUMES)
        names = [unique("pv") for _ in range(count)]

        async def one(name: str) -> None:
            self.handles[name] = f"vol-{name}"
            csi = {"driver": self.driver, "volumeHandle": self.handles[name]}
            body = csi_volume_body(name, csi, access_mode="ReadWriteMany")
            await with_retries(lambda: api.create(body))

        await bounded(one(n) for n in names)
        return names

    async def _pace(self) -> None:
        if self.pace:
            await asyncio.sleep(self.rng.uniform(0, self.pace))

    async def create_va(self, pv: str, node: str) -> str:
        await self._pace()
        name = unique("va")
        self.live[name] = (pv, node)
        body = attachment_body(name, self.driver, node, pv)
        await with_retries(lambda: ResourceClient(self.client, VOLUME_ATTACHMENTS).create(body))
        return name

    async def delete_va(self, name: str) -> None:
        await self._pace()
        self.deleted_vas[name] = self.live.pop(name)
        await with_retries(lambda: ResourceClient(self.client, VOLUME_ATTACHMENTS).delete(name))

    async def delete_pv(self, name: str) -> None:
        await self._pace()
        self.deleted_pvs.add(name)
        await with_retries(lambda: ResourceClient(self.client, PERSISTENT_VOLUMES).delete(name))

    # -- what the server holds -----------------------------------------------------------------

    def vas(self) -> dict[str, Obj]:
        return {
            name_of(va): va
            for va in self.server.storage.list("volumeattachments")
            if (va.get("spec") or {}).get("attacher") == self.driver
        }

    def pvs(self) -> dict[str, Obj]:
        return {
            name_of(pv): pv
            for pv in self.server.storage.list("persistentvolumes")
            if name_of(pv) in self.handles
        }

    def used_pvs(self) -> set[str]:
        return {pv for pv, _node in self.live.values()}

    def problems(self) -> list[str]:
        """Every broken invariant (empty once the scenario settled correctly)."""
        problems: list[str] = []
        vas, pvs, pairs = self.vas(), self.pvs(), self.pairs()
        wanted: set[Pair] = set()
        for name, (pv, node) in self.live.items():
            va = vas.get(name)
            if va is None:
                problems.append(f"live VA {name} is gone")
                continue
            if not attach_support.is_attached(va):
                problems.append(f"live VA {name} is not attached: {va.get('status')}")
            if meta(va).get("deletionTimestamp"):
                problems.append(f"live VA {name} is being deleted")
            count = attach_support.finalizers(va).count(self.finalizer)
            if self.trivial:
                if count:
                    problems.append(f"the trivial handler put a finalizer on VA {name}")
                continue
            pair = self.pair(pv, node)
            wanted.add(pair)
            if count != 1:
                problems.append(f"live VA {name} has {count} finalizers {self.finalizer}")
            if pair not in pairs:
                problems.append(f"live VA {name}: {pair} not attached in the backend")
            if attach_support.status(va).get("attachmentMetadata") != self.context_of(pair[0]):
                problems.append(f"live VA {name} has no publish context: {va.get('status')}")
            if (meta(va).get("annotations") or {}).get(NODE_ID_ANNOTATION) != self.nodes[node]:
                problems.append(f"live VA {name} does not remember its node ID")
            if self.backend is not None and self.backend.attaches[pair] != 1:
                problems.append(f"{pair} of VA {name} attached {self.backend.attaches[pair]} times")
        for name, (pv, node) in self.deleted_vas.items():
            if name in vas:
                problems.append(f"deleted VA {name} still exists: {vas[name].get('metadata')}")
            if self.trivial:
                continue
            pair = self.pair(pv, node)
            if pair in pairs:
                problems.append(f"deleted VA {name}: {pair} still attached in the backend")
            if self.backend is None:
                continue
            attaches, detaches = self.backend.attaches[pair], self.backend.detaches[pair]
            # A VA deleted before it was attached may never have reached the backend.
            expected = {1} if name in self.confirmed else {0, 1}
            if attaches != detaches or attaches not in expected:
                problems.append(
                    f"{pair} of deleted VA {name}: {attaches} attaches, {detaches} detaches"
                )
        problems += [f"backend attachment {p} without a VA" for p in sorted(pairs - wanted)]
        used = self.used_pvs()
        for name, volume in pvs.items():
            has = self.finalizer in attach_support.finalizers(volume)
            if self.trivial and has:
                problems.append(f"the trivial handler put a finalizer on PV {name}")
            if not self.trivial and name in used and not has:
                problems.append(f"PV {name} is used by a live VA but has no finalizer")
            if name not in used and meta(volume).get("deletionTimestamp"):
                problems.append(f"PV {name} is deleted and unused but still exists")
        problems += [f"deleted PV {n} is gone though a VA uses it" for n in used - set(pvs)]
        return problems


def make_backend(
    handler: str, rng: random.Random, max_pause: float = 0.0
) -> CountingAttacher | None:
    if handler in ("trivial", "csi"):  # no backend, or one the test does not own
        return None
    if handler == "reconciler":
        return ListingCountingAttacher(rng, max_pause)
    return CountingAttacher(rng, max_pause)


async def settle(world: World, timeout: float = 60.0) -> None:
    """Wait until every invariant holds; remember the VAs then attached."""
    await wait_until(world.settled, timeout=timeout, message=world.report)
    world.confirmed.update(world.live)


# -- the three phases every scenario runs ------------------------------------------------------


async def phase_attach(world: World, rng: random.Random, count: int) -> None:
    """``count`` VAs for fresh PVs on random nodes; every fifth PV on a second node as well."""
    pvs = await world.create_pvs(count)
    nodes = sorted(world.nodes)
    specs: list[tuple[str, str]] = []
    for i, pv in enumerate(pvs):
        first, second = rng.sample(nodes, 2)
        specs.append((pv, first))
        if i % 5 == 0:
            specs.append((pv, second))
    rng.shuffle(specs)
    await bounded((world.create_va(pv, node) for pv, node in specs), world.concurrency)


async def phase_churn(world: World, rng: random.Random, count: int) -> None:
    """Delete half of the live VAs; delete some of their PVs with them and some PVs whose VAs
    stay; attach fresh PVs; create VAs and delete them (and their PVs) at once, mid-attach."""
    live = sorted(world.live)
    rng.shuffle(live)
    doomed = live[: len(live) // 2]
    staying_pvs = sorted({world.live[name][0] for name in live[len(doomed) :]})
    # PVs none of whose VAs stay (a PV attached to two nodes may lose only one of its VAs).
    doomed_pvs = sorted({world.live[name][0] for name in doomed} - set(staying_pvs))
    pvs_to_delete = doomed_pvs[: len(doomed_pvs) // 2]
    if not world.trivial:
        # A PV deleted while a VA uses it must wait for the VA (its finalizer holds it). Only
        # PVs whose VAs are all attached: as upstream, a VA whose PV is being deleted (or is
        # gone) is never attached.
        vas = world.vas()

        def all_attached(pv: str) -> bool:
            return all(
                attach_support.is_attached(vas.get(va, {}))
                for va, (used, _node) in world.live.items()
                if used == pv
            )

        attached = [n for n in staying_pvs if all_attached(n)]
        pvs_to_delete += attached[: max(1, len(attached) // 4)]
    fresh = await world.create_pvs(count)
    churn = await world.create_pvs(max(2, count // 3))
    nodes = sorted(world.nodes)

    async def short_lived(pv: str) -> None:
        name = await world.create_va(pv, rng.choice(nodes))
        await asyncio.sleep(rng.uniform(0, 0.2))
        await world.delete_va(name)
        await world.delete_pv(pv)

    await bounded(
        [world.delete_va(n) for n in doomed]
        + [world.delete_pv(n) for n in pvs_to_delete]
        + [world.create_va(pv, rng.choice(nodes)) for pv in fresh]
        + [short_lived(pv) for pv in churn],
        world.concurrency,
    )


async def phase_delete_all(world: World) -> None:
    await bounded([world.delete_va(n) for n in sorted(world.live)], world.concurrency)
    await bounded(
        [world.delete_pv(n) for n in sorted(set(world.pvs()) - world.deleted_pvs)],
        world.concurrency,
    )


def assert_all_gone(world: World) -> None:
    assert world.live == {}
    assert world.vas() == {}, sorted(world.vas())[:5]
    assert world.pvs() == {}, sorted(world.pvs())[:5]
    assert world.pairs() == set()


async def queues_drained(controller: AttachController) -> None:
    await wait_until(
        lambda: len(controller.va_queue) == 0 and len(controller.pv_queue) == 0,
        timeout=10,
        message="attacher queues drained",
    )


@contextlib.asynccontextmanager
async def world_of(
    handler: str, rng: random.Random, max_pause: float = 0.0, pace: float = 0.0
) -> AsyncIterator[World]:
    """A fresh API server with three nodes; with ``pace``, the test's writes go two at a time,
    up to ``pace`` seconds apart."""
    async with ApiServer() as server, server.api_client() as client:
        world = World(server, client, handler, backend=make_backend(handler, rng, max_pause))
        if pace:
            world.pace, world.concurrency, world.rng = pace, 2, rng
        await world.create_nodes(3)
        yield world


# -- API faults ------------------------------------------------------------------------------------


async def fault_scenario(handler: str, kinds: Sequence[str], vas: int, seed: int) -> None:
    """Attach; then churn (attach, detach, delete PVs) while faults are injected, and for a
    half second after; then delete everything and check nothing is left."""
    rng = random.Random(seed)
    async with world_of(handler, rng) as world:
        controller = world.controller()
        async with running(controller):
            await phase_attach(world, rng, vas)
            await settle(world)
            async with chaos(world.server, kinds, seed) as injected:
                await phase_churn(world, rng, vas)
                # Keep the faults coming while the controller works.
                with contextlib.suppress(AssertionError):
                    await wait_until(world.settled, timeout=0.5, message="")
            assert injected, "no fault was injected: the scenario tested nothing"
            await settle(world)
            await phase_delete_all(world)
            await settle(world)
            assert_all_gone(world)
            await queues_drained(controller)
            assert controller.healthy()
        if world.backend is not None:
            # Each attach that changed something was undone by exactly one detach.
            assert world.backend.attaches == world.backend.detaches


@pytest.mark.parametrize("kind", FAULT_KINDS)
async def test_api_faults_while_attaching_and_detaching(kind: str) -> None:
    await fault_scenario("memory", [kind], vas=16, seed=FAULT_KINDS.index(kind))


@pytest.mark.parametrize("handler", ["reconciler", "trivial"])
async def test_every_fault_mixed_other_handlers(handler: str) -> None:
    await fault_scenario(handler, FAULT_KINDS, vas=16, seed=20 + HANDLERS.index(handler))


@pytest.mark.slow
@pytest.mark.parametrize("handler", HANDLERS)
async def test_every_fault_mixed_200_vas(handler: str) -> None:
    await fault_scenario(handler, FAULT_KINDS, vas=200, seed=30 + HANDLERS.index(handler))


# -- crashes: the controller task cancelled at random points -----------------------------------


async def crash_scenario(handler: str, vas: int, kills: int, seed: int) -> None:
    """Each phase runs while controllers are started and cancelled ``kills`` times at random
    points (the backend pausing up to 30 ms after each operation and status writes taking
    50 ms, so kills land between "done in the backend" and "recorded in the API"); then a last
    controller finishes the work."""
    rng = random.Random(seed)
    async with world_of(handler, rng, max_pause=0.03, pace=0.25) as world:
        # Status writes take a while: kills land between the work and its record (the only
        # work the trivial handler does).
        world.server.faults.latency(0.05, verb="patch", resource="volumeattachments/status")
        killed_mid_work: list[bool] = []

        def writes() -> int:
            return world.server.requests.count("patch", "volumeattachments") + (
                world.server.requests.count("patch", "volumeattachments/status")
            )

        def wrote_since(before: int) -> bool:
            return writes() > before or world.settled()

        async def crash_loop() -> None:
            for attempt in range(kills):
                # On a loaded machine the phase may not have written anything yet: a kill
                # before there is work tests nothing, so wait (briefly) for some.
                with contextlib.suppress(AssertionError):
                    await wait_until(lambda: not world.settled(), timeout=1.0, message="")
                before = writes()
                task = asyncio.create_task(world.controller().run())
                if attempt == 0:
                    # However fast the client and server are, one kill per phase lands right
                    # after the controller's first write of a VA went out (a 50 ms status
                    # write is then still in flight), not after the work is all done.
                    with contextlib.suppress(AssertionError):
                        await wait_until(
                            functools.partial(wrote_since, before), timeout=5.0, message=""
                        )
                else:
                    # The others at random points, some during the status writes, some later.
                    await asyncio.sleep(rng.uniform(0.02, 0.3))
                killed_mid_work.append(not world.settled())
                await cancel(task)

        phases: list[Callable[[], Awaitable[None]]] = [
            lambda: phase_attach(world, rng, vas),
            lambda: phase_churn(world, rng, vas // 2),
            lambda: phase_delete_all(world),
        ]
        for phase in phases:
            await asyncio.gather(crash_loop(), phase())
            controller = world.controller()
            async with running(controller):
                await settle(world)
                await queues_drained(controller)
        assert_all_gone(world)
        assert any(killed_mid_work), "no kill landed while there was work left"
        if world.backend is not None:
            assert world.backend.attaches == world.backend.detaches


@pytest.mark.parametrize("handler", ["memory", "trivial"])
async def test_controller_cancelled_at_random_points(handler: str) -> None:
    await crash_scenario(handler, vas=8, kills=2, seed=40 + HANDLERS.index(handler))


@pytest.mark.slow
@pytest.mark.parametrize("handler", HANDLERS)
async def test_controller_cancelled_at_random_points_200_vas(handler: str) -> None:
    await crash_scenario(handler, vas=200, kills=25, seed=50 + HANDLERS.index(handler))


async def test_crash_between_backend_and_api_in_both_directions() -> None:
    """Killed exactly after the backend attached but before ``status.attached`` was saved
    (the status patch held by API latency), then exactly after the backend detached but before
    the VA finalizer was removed: the next controller finishes each, attaching and detaching
    once in the backend (the calls are repeated, idempotently)."""
    rng = random.Random(60)
    async with world_of("memory", rng) as world:
        backend = world.backend
        assert backend is not None
        server = world.server
        (pv,) = await world.create_pvs(1)
        node = sorted(world.nodes)[0]
        pair = world.pair(pv, node)

        server.faults.latency(60.0, verb="patch", resource="volumeattachments/status", count=1)
        task = asyncio.create_task(world.controller().run())
        try:
            va = await world.create_va(pv, node)
            await wait_until(
                lambda: (
                    pair in backend.pairs()
                    and server.requests.count("patch", "volumeattachments/status") >= 1
                ),
                timeout=15,
                message="attached in the backend, status patch in flight",
            )
        finally:
            await cancel(task)
        assert not attach_support.is_attached(world.vas()[va])  # the window
        controller = world.controller()
        async with running(controller):
            await settle(world)
        assert (backend.count("attach"), backend.attaches[pair]) == (2, 1)

        patches = server.requests.count("patch", "volumeattachments")
        server.faults.latency(60.0, verb="patch", resource="volumeattachments", count=1)
        task = asyncio.create_task(world.controller().run())
        try:
            await world.delete_va(va)
            await world.delete_pv(pv)
            await wait_until(
                lambda: (
                    pair not in backend.pairs()
                    and server.requests.count("patch", "volumeattachments") > patches
                ),
                timeout=15,
                message="detached in the backend, finalizer removal in flight",
            )
        finally:
            await cancel(task)
        left = world.vas()[va]  # the window: detached, but the VA still holds its finalizer
        assert world.finalizer in attach_support.finalizers(left)
        assert meta(left).get("deletionTimestamp")
        assert world.finalizer in attach_support.finalizers(world.pvs()[pv])
        controller = world.controller()
        async with running(controller):
            await settle(world)
        assert_all_gone(world)
        assert (backend.count("detach"), backend.detaches[pair]) == (2, 1)


# -- crashes: a real attacher process SIGKILLed ---------------------------------------------------


class AttacherProcess(LoggedProcess):
    """``python -m pyprovlib.csi.attacher`` against the in-memory server and a CSI driver
    served by the test (its state survives the process)."""

    def __init__(self, kubeconfig: Path, endpoint: str, log: Path) -> None:
        super().__init__(log)
        self.kubeconfig = kubeconfig
        self.endpoint = endpoint

    def argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "pyprovlib.csi.attacher",
            f"--kubeconfig={self.kubeconfig}",
            f"--csi-address={self.endpoint}",
            "--kube-api-qps=0",
            "--timeout=5s",
            "--retry-interval-start=50ms",
            "--retry-interval-max=1s",
            "--worker-threads=4",
            "--log-format=json",
        ]

    def env(self) -> dict[str, str]:
        env = super().env()
        env.pop("KUBECONFIG", None)
        return env

    def starts(self) -> int:
        """How many processes logged that their controller runs (workers started)."""
        if not self.log.exists():
            return 0
        return self.log.read_text(errors="replace").count('"started CSI attacher"')


async def sigkill_scenario(tmp_path: Path, vas: int, kills: int, seed: int) -> None:
    rng = random.Random(seed)
    Fault = csi_attach_driver.Fault
    with short_socket_dir() as sockets:
        async with world_of("csi", rng, pace=0.1) as world:
            driver = csi_attach_driver.AttachDriver(world.driver, sockets / "csi.sock")
            state = driver.state
            world.external_pairs = lambda: {
                (volume, node) for volume, nodes in state.published.items() for node in nodes
            }
            world.context_of = lambda handle: {"devicePath": f"/dev/disk/{handle}"}
            # Every publish/unpublish takes a while and every status write too, so kills land
            # between the driver's work and the API's record of it.
            state.fail("ControllerPublishVolume", Fault(delay=0.05, times=10**6))
            state.fail("ControllerUnpublishVolume", Fault(delay=0.05, times=10**6))
            world.server.faults.latency(0.1, verb="patch", resource="volumeattachments/status")
            kubeconfig = world.server.write_kubeconfig(tmp_path / "kubeconfig")
            process = AttacherProcess(kubeconfig, driver.endpoint, tmp_path / "attacher.log")
            killed_mid_work: list[bool] = []

            def progress() -> int:
                return len(state.publish_requests) + len(state.unpublish_requests)

            async def kill_loop() -> None:
                for _ in range(kills):
                    await process.start()
                    before = progress()

                    def progressed(before: int = before) -> bool:
                        return progress() != before

                    with contextlib.suppress(AssertionError):
                        await wait_until(progressed, timeout=20, message="")
                    await asyncio.sleep(rng.uniform(0.0, 0.4))
                    killed_mid_work.append(not world.settled())
                    await process.kill()

            async with driver:
                try:
                    # Attach, then churn, each while processes are started and killed.
                    await asyncio.gather(kill_loop(), phase_attach(world, rng, vas))
                    await asyncio.gather(kill_loop(), phase_churn(world, rng, vas // 2))
                    # A last process finishes the work, then detaches everything.
                    starts = process.starts()
                    await process.start()
                    for step in ("settled", "all deleted"):
                        if step == "all deleted":
                            await phase_delete_all(world)
                        await wait_until(
                            lambda: process.starts() > starts and world.settled(),
                            timeout=60,
                            message=lambda: world.report() + "\n" + process.tail(),
                        )
                    assert await process.terminate() == 0, process.tail()
                finally:
                    await process.close()
            assert_all_gone(world)
            assert any(killed_mid_work), "no kill landed while there was work left"


@pytest.mark.parametrize(
    ("vas", "kills", "seed"),
    [
        pytest.param(8, 2, 70, marks=pytest.mark.heavy, id="8-vas"),
        pytest.param(100, 8, 71, marks=pytest.mark.slow, id="100-vas"),
    ],
)
async def test_attacher_process_sigkilled_at_random_points(
    tmp_path: Path, vas: int, kills: int, seed: int
) -> None:
    await sigkill_scenario(tmp_path, vas=vas, kills=kills, seed=seed)

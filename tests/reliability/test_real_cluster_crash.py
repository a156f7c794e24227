"""Crash and failover on a real control plane (issue 17): the scenarios of
test_process_crash.py and test_leader_failover.py, with kube-apiserver, kube-controller-manager
(PV controller, pvc-protection) and etcd in place of the in-memory server.

- ``python -m pyprovlib.examples.nfs`` SIGKILLed while it provisions and while it deletes;
- two replicas with leader election, the leader SIGKILLed while claims are being provisioned;
- kube-apiserver restarted while claims are being provisioned (needs a control plane the
  launcher started: ``kube_cluster.control_plane.restart_apiserver()``).

Afterwards the invariants of rel_support.check_invariants hold, read over the API: every claim
Bound to exactly one PV (``pvc-<uid>``), one asset per PV, no asset without a PV, nothing left
of deleted claims and nothing deleted that should be kept. Each scenario's provisioner has a
name of its own, so it never acts on other tests' claims. In memory these scenarios are
test_process_crash.py's and test_leader_failover.py's; here they skip without a real cluster.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from claim_support import class_body
from rel_support import (
    NFSProcess,
    Replicas,
    check_invariants,
    claim_body,
    create_claims,
    delete_claims,
    nfs_assets,
    unbound_report,
)

from pyprovlib.kube._objects import Obj
from pyprovlib.kube._resources import (
    PERSISTENT_VOLUME_CLAIMS,
    PERSISTENT_VOLUMES,
    STORAGE_CLASSES,
)
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.testing._cluster import TestCluster

pytestmark = pytest.mark.e2e


class ApiView:
    """The objects rel_support's invariant helpers read from ``ApiServer.storage``, listed from
    any API server (call :meth:`refresh` first); passed where they take a server."""

    def __init__(self, cluster: TestCluster) -> None:
        self.cluster = cluster
        self.storage = self
        self._claims: list[Obj] = []
        self._volumes: list[Obj] = []

    async def refresh(self) -> ApiView:
        api = self.cluster.api_client
        claims = await ResourceClient(api, PERSISTENT_VOLUME_CLAIMS).list(self.cluster.namespace)
        volumes = await ResourceClient(api, PERSISTENT_VOLUMES).list()
        self._claims = list(claims["items"])
        self._volumes = list(volumes["items"])
        return self

    def list(self, resource: str, namespace: str | None = None) -> list[Obj]:
        if resource == "persistentvolumeclaims":
            return [c for c in self._claims if c["metadata"]["namespace"] == namespace]
        if resource == "persistentvolumes":
            return self._volumes
        raise KeyError(resource)

    # builtins.list: in the class body, below the method, ``list`` is the method.
    def claims(self) -> builtins.list[Obj]:
        return self.list("persistentvolumeclaims", self.cluster.namespace)

    def volumes(self, class_name: str) -> builtins.list[Obj]:
        return [pv for pv in self._volumes if pv["spec"].get("storageClassName") == class_name]

    def bound(self, expected: int) -> bool:
        claims = self.claims()
        return len(claims) == expected and all(
            (c.get("status") or {}).get("phase") == "Bound" for c in claims
        )


async def poll(
    check: Callable[[], Awaitable[bool]], *, timeout: float, message: Callable[[], str]
) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for: {message()}")
        await asyncio.sleep(0.1)


class RealNFSProcess(NFSProcess):
    """The NFS example on the real cluster, under a provisioner name of its own."""

    def __init__(self, kubeconfig: Path, root: Path, log: Path, name: str) -> None:
        super().__init__(kubeconfig, root, log)
        self.name = name

    def flags(self) -> list[str]:
        return [f"--provisioner-name={self.name}", *super().flags()]


@dataclass(eq=False)
class RealReplicas(Replicas):
    """test_leader_failover's replicas on the real cluster, under a provisioner name of their
    own (so the Lease is theirs too)."""

    name: str

    def flags(self) -> list[str]:
        return [
            f"--provisioner-name={self.name}",
            "--leader-election=true",
            f"--leader-election-namespace={self.namespace}",
            # longer than in memory: a loaded machine's real apiserver answers slower
            "--leader-election-lease-duration=6s",
            "--leader-election-renew-deadline=4s",
            "--leader-election-retry-period=500ms",
        ]


@dataclass(eq=False)
class World:
    """One scenario's cluster, class, export directory and view."""

    cluster: TestCluster
    tmp_path: Path
    name: str
    class_name: str
    root: Path = field(init=False)
    view: ApiView = field(init=False)
    kubeconfig: Path = field(init=False)

    def __post_init__(self) -> None:
        self.root = self.tmp_path / "export"
        self.view = ApiView(self.cluster)
        assert self.cluster.kubeconfig is not None
        self.kubeconfig = self.cluster.kubeconfig

    def assets(self) -> list[str]:
        return nfs_assets(self.root)

    async def check(self, *, deleted_uids: list[str] | None = None) -> None:
        await self.view.refresh()
        ns = self.cluster.namespace
        check_invariants(
            self.view,  # type: ignore[arg-type]  # duck-typed: storage.list
            [ns],
            [self.class_name],
            self.assets(),
            deleted_uids=deleted_uids or [],
        )

    async def wait_bound(self, claims: int, log: Callable[[], str]) -> None:
        async def bound() -> bool:
            return (await self.view.refresh()).bound(claims)

        await poll(
            bound,
            timeout=120,
            message=lambda: (
                unbound_report(self.view, [self.cluster.namespace])  # type: ignore[arg-type]
                + "\n"
                + log()
            ),
        )

    async def wait_all_gone(self, log: Callable[[], str]) -> None:
        async def gone() -> bool:
            await self.view.refresh()
            return not self.assets() and not self.view.volumes(self.class_name)

        await poll(gone, timeout=120, message=lambda: f"left: {self.assets()[:5]}\n{log()}")


@pytest.fixture
async def world(kube_cluster: TestCluster, tmp_path: Path) -> World:
    if not kube_cluster.is_real:
        pytest.skip(
            "crash on a real control plane: set PYPROVLIB_E2E_KUBECONFIG (in memory: "
            "test_process_crash.py, test_leader_failover.py)"
        )
    name = f"{kube_cluster.unique_name('crash')}.pyprovlib.io/nfs"
    class_name = kube_cluster.unique_name("sc")
    await ResourceClient(kube_cluster.api_client, STORAGE_CLASSES).create(
        class_body(class_name, name, reclaimPolicy="Delete", parameters={"onDelete": "delete"})
    )
    kube_cluster.track(STORAGE_CLASSES, class_name)
    w = World(kube_cluster, tmp_path, name, class_name)
    w.root.mkdir()
    return w


def tail(path: Path) -> str:
    return path.read_text(errors="replace")[-3000:] if path.exists() else ""


async def uids_of(world: World) -> list[str]:
    await world.view.refresh()
    return [c["metadata"]["uid"] for c in world.view.claims()]


async def test_nfs_process_sigkilled_while_provisioning_and_deleting(
    world: World, kube_cluster: TestCluster
) -> None:
    claims, kills = 20, 2
    rng = random.Random(17)
    process = RealNFSProcess(world.kubeconfig, world.root, world.tmp_path / "nfs.log", world.name)
    ns = kube_cluster.namespace
    try:
        keys = await create_claims(kube_cluster.api_client, [ns], claims, world.class_name)

        async def kill_mid_work(progress: Callable[[], int], done: int) -> bool:
            """Start, wait until the process has done some work, kill it at a random point;
            True when the kill left work to do."""
            await process.start()
            before = progress()
            with contextlib.suppress(AssertionError):

                async def moved() -> bool:
                    return progress() != before

                await poll(moved, timeout=30, message=lambda: "")
            await asyncio.sleep(rng.uniform(0.0, 0.3))
            await process.kill()
            return progress() not in (before, done)

        def dirs() -> int:
            return len(world.assets())

        mid = [await kill_mid_work(dirs, claims) for _ in range(kills)]
        await process.start()
        await world.wait_bound(claims, process.tail)
        await world.check()
        uids = await uids_of(world)
        await process.kill()

        await delete_claims(kube_cluster.api_client, keys)
        mid += [await kill_mid_work(dirs, 0) for _ in range(kills)]
        await process.start()
        await world.wait_all_gone(process.tail)
        assert await process.terminate() == 0
        await world.check(deleted_uids=uids)
        print(f"kills that landed mid-work: {mid}")
        assert any(mid), "no kill landed while the process was working"
    finally:
        await process.close()


async def test_two_replicas_leader_sigkilled_while_provisioning(
    world: World, kube_cluster: TestCluster
) -> None:
    claims = 20
    ns = kube_cluster.namespace
    group = RealReplicas(world.tmp_path, world.kubeconfig, world.root, ns, world.name)
    api = ResourceClient(kube_cluster.api_client, PERSISTENT_VOLUME_CLAIMS)
    logs = lambda: "\n".join(tail(log) for _proc, log in group.procs)  # noqa: E731
    try:
        for _ in range(2):
            await group.start()

        async def leader() -> bool:
            return group.leader() is not None

        await poll(leader, timeout=60, message=logs)
        first = group.leader()
        assert first is not None
        for i in range(claims):
            await api.create(claim_body(ns, f"claim-{i}", world.class_name), ns)
            if i == claims // 4:
                # the leader dies with claims queued and more on the way
                await group.kill(first)
            await asyncio.sleep(0.05)

        async def bound() -> bool:
            # a replica that could not renew in time exits, as upstream's does: replace it
            await group.top_up(2)
            return (await world.view.refresh()).bound(claims)

        await poll(
            bound,
            timeout=120,
            message=lambda: unbound_report(world.view, [ns]) + "\n" + logs(),  # type: ignore[arg-type]
        )
        await world.check()
        assert group.leader() not in (None, first)
    finally:
        await group.stop_all()
    assert group.overlapping_work() == [], group.overlapping_work()
    assert len(group.killed_at) == 1


async def test_apiserver_restarted_while_provisioning(
    world: World, kube_cluster: TestCluster
) -> None:
    control_plane: Any = getattr(kube_cluster, "control_plane", None)
    restart = getattr(control_plane, "restart_apiserver", None)
    if restart is None:
        pytest.skip(
            "needs a control plane started by pyprovlib.testing's launcher "
            "(PYPROVLIB_KUBE_ASSETS) to restart kube-apiserver"
        )
    claims = 20
    ns = kube_cluster.namespace
    process = RealNFSProcess(world.kubeconfig, world.root, world.tmp_path / "nfs.log", world.name)
    try:
        await process.start()
        await create_claims(kube_cluster.api_client, [ns], claims // 2, world.class_name)

        async def some_work() -> bool:
            return bool(world.assets())

        await poll(some_work, timeout=60, message=process.tail)
        await restart()
        # claims created after the restart too: the informers must have come back
        api = ResourceClient(kube_cluster.api_client, PERSISTENT_VOLUME_CLAIMS)
        for i in range(claims // 2, claims):
            await api.create(claim_body(ns, f"claim-{i}", world.class_name), ns)
        await world.wait_bound(claims, process.tail)
        await world.check()
        assert process.running(), "the provisioner exited: " + process.tail()
    finally:
        await process.close()

"""Shared pieces of the reliability suite: a backend whose assets outlive a controller, claim
factories, wait helpers and the invariants every scenario ends with.

The invariants (issue 11): every live claim is Bound exactly once (to ``pvc-<its uid>``, and no
other PV names it); every PV has exactly one asset; no asset exists without a PV; a deleted
claim leaves neither PV nor asset behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import random
import signal
import sys
import time
from asyncio.subprocess import Process
from collections import Counter
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Collection,
    Iterable,
    Sequence,
)
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import claim_support
import provision_support
from claim_support import class_body
from kubernetes_asyncio.client import (
    ApiClient,
    V1HostPathVolumeSource,
    V1ObjectMeta,
    V1PersistentVolume,
    V1PersistentVolumeSpec,
)
from module_support import load_file
from task_support import background

from pyprovlib import testing
from pyprovlib._provisioner import Provisioner, ProvisionOptions
from pyprovlib.controller._options import ProvisionControllerOptions
from pyprovlib.controller._provision import ProvisionController
from pyprovlib.kube._objects import Obj
from pyprovlib.kube._resources import (
    NAMESPACES,
    PERSISTENT_VOLUME_CLAIMS,
    STORAGE_CLASSES,
)
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.kube._workqueue import ItemExponentialFailureRateLimiter
from pyprovlib.testing._server import ApiServer

PROVISIONER = "reliability.pyprovlib.io/memory"
_counter = itertools.count()


def unique(prefix: str) -> str:
    return f"{prefix}-{os.getpid()}-{next(_counter)}"


class Backend:
    """A storage system: assets by PV name, outliving any provisioner instance. Records every
    provisioning call in flight per replica so overlapping leaders can be detected."""

    def __init__(self) -> None:
        self.assets: dict[str, Obj] = {}
        self.creations: Counter[str] = Counter()
        self.in_flight: dict[str, set[str]] = {}  # replica -> pv names being provisioned
        self.overlaps: list[tuple[str, str, str]] = []  # (pv, replica, other replica)

    def enter(self, replica: str, pv: str) -> None:
        for other, names in self.in_flight.items():
            if other != replica and names:
                self.overlaps.append((pv, replica, other))
        self.in_flight.setdefault(replica, set()).add(pv)

    def leave(self, replica: str, pv: str) -> None:
        self.in_flight.get(replica, set()).discard(pv)


class BackendProvisioner(Provisioner):
    """An idempotent provisioner over :class:`Backend` (the PV name is the asset id).
    ``pause`` (seconds, may be 0) widens the window between creating the asset and returning,
    so kills land inside it."""

    def __init__(self, backend: Backend, replica: str = "r0", pause: float = 0.0) -> None:
        self.backend = backend
        self.replica = replica
        self.pause = pause
        self.calls = 0

    async def provision(self, options: ProvisionOptions) -> V1PersistentVolume:
        self.calls += 1
        name = options.pv_name
        self.backend.enter(self.replica, name)
        try:
            await asyncio.sleep(0)
            # Hostile-input tests hand the controller claims without a request: be robust here
            # so any crash seen comes from the controller, not from this test backend.
            resources = options.pvc.spec.resources if options.pvc.spec else None
            request = ((resources.requests if resources else None) or {}).get("storage", "0")
            if name not in self.backend.assets:
                self.backend.creations[name] += 1
                self.backend.assets[name] = {"size": request, "claim": options.pvc.metadata.uid}
            if self.pause:
                await asyncio.sleep(self.pause)
        finally:
            self.backend.leave(self.replica, name)
        return V1PersistentVolume(
            metadata=V1ObjectMeta(name=name),
            spec=V1PersistentVolumeSpec(
                access_modes=options.pvc.spec.access_modes if options.pvc.spec else None,
                capacity={"storage": request},
                host_path=V1HostPathVolumeSource(path=f"/backend/{name}"),
            ),
        )

    async def delete(self, volume: V1PersistentVolume) -> None:
        await asyncio.sleep(0)
        self.backend.assets.pop(volume.metadata.name, None)
        if self.pause:
            await asyncio.sleep(self.pause)


def fast_options(**kwargs: Any) -> ProvisionControllerOptions:
    """The integration suite's options (no leader election, private metrics, millisecond
    retries), with retries up to half a second, no give-up thresholds and eight workers."""
    defaults: dict[str, Any] = {
        "rate_limiter": ItemExponentialFailureRateLimiter(0.005, 0.5),
        "failed_provision_threshold": 0,
        "failed_delete_threshold": 0,
        "workers": 8,
    }
    return provision_support.fast_options(**{**defaults, **kwargs})


def running(
    controller: ProvisionController,
) -> contextlib.AbstractAsyncContextManager[ProvisionController]:
    """Run ``controller`` for the block; stop it gracefully afterwards."""
    return testing.running(controller, stop_timeout=20)


async def cancel(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` (a crash, as far as its code can tell) and wait for it to end."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task


async def stop_controllers(
    controllers: Iterable[tuple[ProvisionController, asyncio.Task[None]]],
) -> None:
    """Stop each controller gracefully (waiting up to 10 s for its ``run()`` task), then
    cancel the tasks that did not end."""
    controllers = list(controllers)
    for controller, _task in controllers:
        controller.stop()
    for _controller, task in controllers:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(10):
                await task
        if not task.done():
            await cancel(task)


async def create_namespace(client: ApiClient, name: str) -> None:
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    await ResourceClient(client, NAMESPACES).create(body)


async def create_class(client: ApiClient, provisioner: str = PROVISIONER, **extra: Any) -> str:
    name = unique("sc")
    body: Obj = class_body(name, provisioner, **extra)
    await ResourceClient(client, STORAGE_CLASSES).create(body)
    return name


def claim_body(namespace: str, name: str, class_name: str, size: str = "1Gi") -> Obj:
    return claim_support.claim_body(name, class_name, namespace=namespace, size=size)


def csi_volume_body(name: str, csi: Obj, *, access_mode: str = "ReadWriteOnce", **spec: Any) -> Obj:
    """A pre-provisioned CSI PV of 1Gi that is retained (``csi``: driver, volumeHandle, ...),
    with ``spec`` added."""
    return claim_support.volume_body(
        name,
        accessModes=[access_mode],
        persistentVolumeReclaimPolicy="Retain",
        csi=csi,
        **spec,
    )


async def with_retries(make: Callable[[], Awaitable[Any]], attempts: int = 200) -> Any:
    """Run one API call of the *test* (not of the code under test) through injected faults:
    the test's own writes must land for the scenario to mean anything."""
    from kubernetes_asyncio.client.exceptions import ApiException

    from pyprovlib.kube._errors import is_already_exists, is_not_found

    for attempt in range(attempts):
        try:
            return await make()
        except ApiException as err:
            if is_already_exists(err) or is_not_found(err):
                return None
            if attempt == attempts - 1:
                raise
        except (TimeoutError, OSError, Exception) as err:  # connection reset, restart
            if attempt == attempts - 1:
                raise
            del err
        await asyncio.sleep(0.02)
    return None


async def bounded(coros: Iterable[Awaitable[Any]], limit: int = 16) -> None:
    """Await ``coros`` concurrently, at most ``limit`` at a time."""
    semaphore = asyncio.Semaphore(limit)

    async def one(coro: Awaitable[Any]) -> None:
        async with semaphore:
            await coro

    await asyncio.gather(*(one(c) for c in coros))


class Problems:
    """A scenario's view that lists what breaks its invariants (:meth:`problems`): settled
    when nothing does."""

    def problems(self) -> list[str]:
        raise NotImplementedError

    def settled(self) -> bool:
        return not self.problems()

    def report(self, examples: int = 6) -> str:
        problems = self.problems()
        return f"{len(problems)} problems, e.g. {problems[:examples]}"


async def create_claims(
    client: ApiClient, namespaces: Iterable[str], per_namespace: int, class_name: str
) -> list[tuple[str, str]]:
    """Create claims (concurrently, bounded), returning their (namespace, name)."""
    claims = ResourceClient(client, PERSISTENT_VOLUME_CLAIMS)
    keys = [(ns, f"claim-{i}") for ns in namespaces for i in range(per_namespace)]

    async def one(ns: str, name: str) -> None:
        await with_retries(lambda: claims.create(claim_body(ns, name, class_name), ns))

    await bounded((one(ns, n) for ns, n in keys), limit=32)
    return keys


async def create_paced(
    client: ApiClient,
    keys: Iterable[tuple[str, str]],
    class_name: str,
    pause: Callable[[], float],
) -> None:
    """Create claims (namespace, name) one at a time, ``pause()`` seconds apart: claims keep
    arriving while a scenario's faults go on."""
    claims = ResourceClient(client, PERSISTENT_VOLUME_CLAIMS)
    for ns, name in keys:
        await claims.create(claim_body(ns, name, class_name), ns)
        await asyncio.sleep(pause())


async def delete_claims(client: ApiClient, keys: Iterable[tuple[str, str]]) -> None:
    claims = ResourceClient(client, PERSISTENT_VOLUME_CLAIMS)

    async def one(ns: str, name: str) -> None:
        await with_retries(lambda: claims.delete(name, ns))

    await bounded((one(ns, n) for ns, n in keys), limit=32)


async def wait_until(
    check: Callable[[], bool], *, timeout: float, message: str | Callable[[], str]
) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout}s waiting for: "
                f"{message() if callable(message) else message}"
            )
        await asyncio.sleep(0.05)


def our_claims(server: ApiServer, namespaces: Iterable[str]) -> list[Obj]:
    out: list[Obj] = []
    for ns in namespaces:
        out.extend(server.storage.list("persistentvolumeclaims", ns))
    return out


def our_volumes(server: ApiServer, class_names: Iterable[str]) -> list[Obj]:
    wanted = set(class_names)
    return [
        pv
        for pv in server.storage.list("persistentvolumes")
        if pv.get("spec", {}).get("storageClassName") in wanted
    ]


def all_bound(server: ApiServer, namespaces: Iterable[str], expected: int) -> bool:
    claims = our_claims(server, namespaces)
    return len(claims) == expected and all(
        c.get("status", {}).get("phase") == "Bound" for c in claims
    )


def unbound_report(server: ApiServer, namespaces: Iterable[str]) -> str:
    claims = our_claims(server, namespaces)
    pending = [
        f"{c['metadata']['namespace']}/{c['metadata']['name']}"
        for c in claims
        if c.get("status", {}).get("phase") != "Bound"
    ]
    return f"{len(pending)} of {len(claims)} claims not Bound, e.g. {pending[:5]}"


def check_invariants(
    server: ApiServer,
    namespaces: Iterable[str],
    class_names: Iterable[str],
    assets: Iterable[str],
    *,
    deleted_uids: Iterable[str] = (),
) -> None:
    """The issue's invariants over the server's objects and the backend's asset names."""
    namespaces = list(namespaces)
    claims = our_claims(server, namespaces)
    volumes = our_volumes(server, class_names)
    asset_names = Counter(list(assets))
    volume_names = {pv["metadata"]["name"] for pv in volumes}
    by_claim: Counter[str] = Counter(
        (pv.get("spec", {}).get("claimRef") or {}).get("uid", "") for pv in volumes
    )
    problems: list[str] = []
    for claim in claims:
        uid = claim["metadata"]["uid"]
        key = f"{claim['metadata']['namespace']}/{claim['metadata']['name']}"
        if claim.get("status", {}).get("phase") != "Bound":
            problems.append(f"claim {key} is {claim.get('status', {}).get('phase')}, not Bound")
        if claim.get("spec", {}).get("volumeName") != f"pvc-{uid}":
            problems.append(f"claim {key} bound to {claim.get('spec', {}).get('volumeName')}")
        if by_claim[uid] != 1:
            problems.append(f"claim {key} is named by {by_claim[uid]} PVs")
    for name, n in asset_names.items():
        if n != 1:
            problems.append(f"asset {name} exists {n} times")
        if name not in volume_names:
            problems.append(f"asset {name} has no PV (leaked)")
    for name in volume_names:
        if name not in asset_names:
            problems.append(f"PV {name} has no asset")
    for uid in deleted_uids:
        if by_claim[uid]:
            problems.append(f"deleted claim {uid} still has a PV")
        if f"pvc-{uid}" in asset_names:
            problems.append(f"deleted claim {uid} still has an asset")
    assert not problems, f"{len(problems)} invariant violations: {problems[:20]}"


@dataclass(eq=False)
class Scenario:
    """Where one scenario's claims, PVs and assets live, and the two end states every scenario
    waits for — all claims Bound, everything deleted — with the invariants checked at each.

    ``assets`` lists the backend's asset names as they are now; ``detail`` adds to a timeout's
    message (a process's log, say)."""

    server: ApiServer
    namespaces: Sequence[str]
    class_names: Sequence[str]
    assets: Callable[[], Collection[str]]
    detail: Callable[[], str] = lambda: ""

    def claims(self) -> list[Obj]:
        return our_claims(self.server, self.namespaces)

    def volumes(self) -> list[Obj]:
        return our_volumes(self.server, self.class_names)

    def check(self, *, deleted_uids: Iterable[str] = ()) -> None:
        check_invariants(
            self.server, self.namespaces, self.class_names, self.assets(), deleted_uids=deleted_uids
        )

    async def wait_bound(self, expected: int, *, timeout: float) -> list[str]:
        """Wait until the scenario has ``expected`` claims, all Bound, check the invariants and
        return the claims' uids (for :meth:`wait_deleted`)."""
        await wait_until(
            lambda: all_bound(self.server, self.namespaces, expected),
            timeout=timeout,
            message=lambda: f"{unbound_report(self.server, self.namespaces)}\n{self.detail()}",
        )
        self.check()
        return [c["metadata"]["uid"] for c in self.claims()]

    async def wait_deleted(self, uids: Iterable[str], *, timeout: float) -> None:
        """Wait until no asset and no PV is left, and check the invariants, ``uids`` being the
        deleted claims'."""
        await wait_until(
            lambda: not self.assets() and not self.volumes(),
            timeout=timeout,
            message=lambda: (
                f"{len(self.assets())} assets ({sorted(self.assets())[:5]}) and "
                f"{len(self.volumes())} PVs left\n{self.detail()}"
            ),
        )
        self.check(deleted_uids=uids)


PV_NAME_LEN = len("pvc-") + 36


def nfs_assets(root: Path) -> list[str]:
    """PV names of the NFS example's volume directories (``<ns>-<claim>-<pv>``); an archived
    or foreign directory shows up under its own name and so breaks the invariants."""
    out = []
    for entry in sorted(root.iterdir()):
        name = entry.name
        out.append(name[-PV_NAME_LEN:] if name[-PV_NAME_LEN:].startswith("pvc-") else name)
    return out


NFS_PROVISIONER = "pyprovlib.io/nfs"


@dataclass
class World:
    """An in-memory API server (with the PV binder), a namespace and a StorageClass that
    deletes, the scenario's backend and its :class:`Scenario`. For the NFS example
    (:func:`nfs_world`), also its kubeconfig and export directory."""

    server: ApiServer
    client: ApiClient
    ns: str
    class_name: str
    backend: Backend
    scenario: Scenario
    kubeconfig: Path = Path()
    root: Path = Path()


@contextlib.asynccontextmanager
async def memory_world(prefix: str) -> AsyncIterator[World]:
    """A :class:`World` of :class:`BackendProvisioner` (provisioner :data:`PROVISIONER`)."""
    async with ApiServer(binder=True) as server, server.api_client() as client:
        ns = unique(prefix)
        await create_namespace(client, ns)
        class_name = await create_class(client, reclaimPolicy="Delete")
        backend = Backend()
        scenario = Scenario(server, [ns], [class_name], lambda: backend.assets)
        yield World(server, client, ns, class_name, backend, scenario)


@contextlib.asynccontextmanager
async def nfs_world(tmp_path: Path, prefix: str) -> AsyncIterator[World]:
    """A :class:`World` of the NFS example (whose assets are directories in ``root``)."""
    root = tmp_path / "export"
    root.mkdir()
    async with ApiServer(binder=True) as server, server.api_client() as client:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        ns = unique(prefix)
        await create_namespace(client, ns)
        class_name = await create_class(
            client, NFS_PROVISIONER, reclaimPolicy="Delete", parameters={"onDelete": "delete"}
        )
        scenario = Scenario(server, [ns], [class_name], lambda: nfs_assets(root))
        yield World(server, client, ns, class_name, Backend(), scenario, kubeconfig, root)


def nfs_argv(kubeconfig: Path, root: Path, *flags: str) -> list[str]:
    """``python -m pyprovlib.examples.nfs`` exporting ``root``, logging JSON, plus ``flags``."""
    return [
        sys.executable,
        "-m",
        "pyprovlib.examples.nfs",
        f"--kubeconfig={kubeconfig}",
        "--nfs-server=nfs.example.test",
        "--nfs-path=/export",
        f"--nfs-mount-path={root}",
        "--log-format=json",
        *flags,
    ]


async def start_logged(
    argv: Sequence[str], log: Path, mode: str = "ab", env: dict[str, str] | None = None
) -> Process:
    """Start ``argv`` (no shell) with its stdout and stderr going to ``log``."""
    with log.open(mode) as out:
        return await asyncio.create_subprocess_exec(
            *argv,
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
            env=dict(os.environ) if env is None else env,
        )


class LoggedProcess:
    """A controller process under test, started again after every crash: each run appends to
    one log. Subclasses say how to start it (:meth:`argv`)."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.proc: Process | None = None

    def argv(self) -> list[str]:
        raise NotImplementedError

    def env(self) -> dict[str, str]:
        return dict(os.environ)

    async def start(self) -> None:
        self.proc = await start_logged(self.argv(), self.log, env=self.env())

    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def kill(self) -> None:
        """SIGKILL: a crash."""
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)
        await self.proc.wait()

    async def terminate(self) -> int:
        """SIGTERM, and the exit code of the graceful shutdown."""
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            return await self.proc.wait()

    async def close(self) -> None:
        """Kill it if it is still running (a test's cleanup)."""
        if self.running():
            await self.kill()

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""


def asset_dirs(root: Path) -> list[str]:
    """The volume directories under a file-backed provisioner's root."""
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


def load_support(suite: str, name: str) -> ModuleType:
    """The support module ``tests/<suite>/<name>.py``, which is not on ``sys.path`` when only
    this suite runs (loaded once, under a private module name)."""
    path = Path(__file__).resolve().parents[1] / suite / f"{name}.py"
    return load_file(f"pyprovlib_tests_{suite}_{name}", path, register=True)


# -- API server chaos ----------------------------------------------------------------------------

FAULT_KINDS = ("500", "503", "429", "latency", "drop_watches", "compact", "restart")


async def inject(server: ApiServer, kind: str, rng: random.Random) -> None:
    """One dose of ``kind``."""
    if kind in ("500", "503"):
        server.faults.fail(int(kind), count=rng.randint(3, 10))
    elif kind == "429":
        server.faults.fail(429, count=rng.randint(2, 6), retry_after=1)
    elif kind == "latency":
        server.faults.latency(rng.uniform(0.05, 0.3), count=rng.randint(5, 20))
    elif kind == "drop_watches":
        server.drop_watches()
    elif kind == "compact":
        server.compact()
        server.drop_watches()
    elif kind == "restart":
        await server.restart()
    else:
        raise ValueError(kind)


@contextlib.asynccontextmanager
async def chaos(
    server: ApiServer, kinds: Sequence[str], seed: int, interval: float = 0.15
) -> AsyncIterator[list[str]]:
    """Inject faults of ``kinds`` every ``interval`` (jittered) for the duration of the block;
    yields the log of what was injected. The first fault goes in before the block runs, so a
    phase that finishes quickly is still faulted. Faults left over are cleared on exit."""
    rng = random.Random(seed)
    injected: list[str] = []

    async def inject_one() -> None:
        kind = rng.choice(kinds)
        await inject(server, kind, rng)
        injected.append(kind)

    async def loop() -> None:
        while True:
            await asyncio.sleep(rng.uniform(interval / 2, interval * 1.5))
            await inject_one()

    await inject_one()
    try:
        async with background(loop()):
            yield injected
    finally:
        server.faults.clear()


@dataclass(eq=False)
class Replicas:
    """``python -m pyprovlib.examples.nfs`` replicas with leader election, one log each."""

    tmp_path: Path
    kubeconfig: Path
    root: Path
    namespace: str
    procs: list[tuple[asyncio.subprocess.Process, Path]] = field(init=False, default_factory=list)
    # index -> wall-clock time of the SIGKILL
    killed_at: dict[int, float] = field(init=False, default_factory=dict)

    async def start(self) -> None:
        index = len(self.procs)
        log = self.tmp_path / f"replica-{index}.log"
        proc = await start_logged(nfs_argv(self.kubeconfig, self.root, *self.flags()), log, "wb")
        self.procs.append((proc, log))

    def flags(self) -> list[str]:
        return [
            "--leader-election=true",
            f"--leader-election-namespace={self.namespace}",
            "--leader-election-lease-duration=3s",
            "--leader-election-renew-deadline=2s",
            "--leader-election-retry-period=400ms",
        ]

    def became_leader(self, index: int) -> list[float]:
        """Wall-clock times at which replica ``index`` logged "became leader"."""
        times = []
        for line in self.procs[index][1].read_text(errors="replace").splitlines():
            if '"became leader"' in line:
                stamp = json.loads(line)["timestamp"]
                times.append(datetime.fromisoformat(stamp).timestamp())
        return times

    def leader(self) -> int | None:
        """The live replica that became leader most recently, if any."""
        live = [
            (max(times), i)
            for i, (proc, _log) in enumerate(self.procs)
            if proc.returncode is None and (times := self.became_leader(i))
        ]
        return max(live)[1] if live else None

    async def kill(self, index: int) -> None:
        proc = self.procs[index][0]
        proc.send_signal(signal.SIGKILL)
        self.killed_at[index] = time.time()
        await proc.wait()

    async def stop_all(self) -> None:
        for proc, _log in self.procs:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
        for proc, _log in self.procs:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(30):
                    await proc.wait()
            if proc.returncode is None:
                proc.send_signal(signal.SIGKILL)
                await proc.wait()

    def activity(self, index: int) -> list[float]:
        """Wall-clock times of replica ``index``'s storage work (directories made or removed,
        PVs saved or deleted)."""
        times = []
        for line in self.procs[index][1].read_text(errors="replace").splitlines():
            if any(f'"event": "{e}"' in line for e in _WORK_EVENTS):
                times.append(datetime.fromisoformat(json.loads(line)["timestamp"]).timestamp())
        return times

    def overlapping_work(self) -> list[str]:
        """Replicas whose spans of storage work overlap: two provisioning at once."""
        spans = sorted(
            (min(t), max(t), i) for i in range(len(self.procs)) if (t := self.activity(i))
        )
        return [
            f"replica {b[2]} worked from {b[0]} while {a[2]} worked until {a[1]}"
            for a, b in itertools.pairwise(spans)
            if b[0] < a[1]
        ]

    async def top_up(self, replicas: int) -> None:
        """Replace replicas that exited on their own (a leader that cannot renew in time
        exits, as upstream does)."""
        live = sum(proc.returncode is None for proc, _log in self.procs)
        for _ in range(replicas - live):
            await self.start()


_WORK_EVENTS = (
    "volume directory ready",
    "volume provisioned",
    "deleting volume directory",
    "volume deleted",
)


class NFSProcess(LoggedProcess):
    """``python -m pyprovlib.examples.nfs`` against the in-memory server."""

    def __init__(self, kubeconfig: Path, root: Path, log: Path) -> None:
        super().__init__(log)
        self.kubeconfig = kubeconfig
        self.root = root

    def flags(self) -> list[str]:
        return ["--leader-election=false", "--worker-threads=8"]

    def argv(self) -> list[str]:
        return nfs_argv(self.kubeconfig, self.root, *self.flags())

"""Benchmark the ProvisionController: N claims created at once, time until every PV exists and
every claim is Bound, latency from claim creation to PV creation, and the controller's CPU,
memory and API requests per volume.

Three processes, so the figures are the controller's alone:

- the API server: ``python -m pyprovlib.testing --port 0 --kubeconfig <tmp>`` with its PV binder
  (or a real cluster with ``--kubeconfig``);
- the controller (``--role controller``, started by the driver): a ProvisionController with a
  trivial in-memory provisioner; it reports its own ``getrusage`` and the API requests it sent,
  counted client-side by verb;
- the driver (this process): creates the namespace, class and claims, watches claims and PVs
  and takes every timestamp from watch events.

The controller's provisioning figures (CPU, RSS, requests) are split off once every claim is
Bound and the controller's event writer has caught up (events are written in the background and
may lag), so every request of the provisioning counts there; the rest is the deletion's.

``--create-rate R`` paces the claims at R per second instead of creating them at once (the
Go reference kept up with 1,000 claims created in 3 s: ``--create-rate 333``);
``--binder-process`` runs the PV binder in its own process (``python -m pyprovlib.testing
--binder-only``) instead of inside the API server's.

Usage::

    python bench/provision.py --volumes 1000 --threadiness 4
    python bench/provision.py --volumes 1000 --threadiness 32 --kubeconfig ~/.kube/config

Prints human-readable lines, then exactly one line of JSON.
"""

# ruff: noqa: E402 - the lazy-import opt-in must run before kubernetes_asyncio is imported
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import resource
import secrets
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

# The opt-in a controller process makes (pyprovlib's `python -m` entry points make it for
# themselves): kubernetes-asyncio's generated modules load on first use, which the RSS figure
# depends on. It must come before anything imports kubernetes_asyncio.
import pyprovlib

pyprovlib.enable_lazy_kubernetes_imports()

# isort: split
from kubernetes_asyncio.client import (
    ApiClient,
    Configuration,
    V1HostPathVolumeSource,
    V1ObjectMeta,
    V1PersistentVolume,
    V1PersistentVolumeSpec,
)
from kubernetes_asyncio.config import load_kube_config

from pyprovlib.controller._provision import FINALIZER_PROVISIONING

if TYPE_CHECKING:
    from pyprovlib.kube._objects import Obj
    from pyprovlib.kube._resources import Resource

PROVISIONER = "bench.pyprovlib.io/memory"
HERE = Path(__file__).resolve()


# --------------------------------------------------------------------------------------------
# Controller process
# --------------------------------------------------------------------------------------------


def counting_client(configuration: Configuration) -> Any:
    """The controller's client as ``new_client`` builds it (a LimitedApiClient, here
    unthrottled like the Go reference), counting the requests it sends by (verb, resource).
    Counting overrides ``request``, kubernetes-asyncio's public method every request of the
    controller (typed or raw JSON) goes through."""
    from pyprovlib.kube._config import LimitedApiClient
    from pyprovlib.kube._ratelimit import TokenBucket

    host = configuration.host

    class CountingApiClient(LimitedApiClient):
        def __init__(self) -> None:
            super().__init__(configuration, limiter=TokenBucket(0, 0))
            self.counts: Counter[tuple[str, str]] = Counter()

        async def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            query = kwargs.get("query_params") or (args[0] if args else None) or []
            path = url[len(host) :] if url.startswith(host) else url
            self.counts[_classify(method, path, list(query))] += 1
            return await super().request(method, url, *args, **kwargs)

    return CountingApiClient()


_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


def _classify(method: str, path: str, query: list[tuple[str, str]]) -> tuple[str, str]:
    """(verb, resource) of a raw request, cheaply: it runs in the measured process."""
    watch = any(k == "watch" and v.lower() in ("true", "1") for k, v in query)
    key = (method, path, watch)
    found = _CLASSIFIED.get(key)
    if found is None:
        found = _classify_path(method, path, watch)
        if len(_CLASSIFIED) < 10_000:
            _CLASSIFIED[key] = found
    return found


_CLASSIFIED: dict[tuple[str, str, bool], tuple[str, str]] = {}


def _classify_path(method: str, path: str, watch: bool) -> tuple[str, str]:
    parts = [p for p in path.split("?", 1)[0].split("/") if p]
    # /api/v1/<plural>[/<name>] or /api/v1/namespaces/<ns>/<plural>[/<name>], /apis/<g>/<v>/...
    parts = parts[2:] if parts[:1] == ["api"] else parts[3:]
    if len(parts) > 2 and parts[0] == "namespaces":
        parts = parts[2:]
    plural = parts[0] if parts else "?"
    verb = _VERBS.get(method)
    if verb is None:
        verb = "watch" if watch else ("get" if len(parts) > 1 else "list")
    return verb, plural


class MemoryProvisioner:
    """The trivial backend: assets in a dict, provision and delete idempotent."""

    def __init__(self) -> None:
        self.assets: dict[str, str] = {}

    async def provision(self, options: Any) -> V1PersistentVolume:
        request = options.pvc.spec.resources.requests["storage"]
        self.assets.setdefault(options.pv_name, request)
        return V1PersistentVolume(
            metadata=V1ObjectMeta(name=options.pv_name),
            spec=V1PersistentVolumeSpec(
                access_modes=options.pvc.spec.access_modes,
                capacity={"storage": request},
                host_path=V1HostPathVolumeSource(path=f"/bench/{options.pv_name}"),
            ),
        )

    async def delete(self, volume: V1PersistentVolume) -> None:
        self.assets.pop(volume.metadata.name, None)


def _claim_syncs() -> int:
    """How many claim syncs the controller ran (its ``claims`` work queue's processed items)."""
    from prometheus_client import REGISTRY

    value = REGISTRY.get_sample_value("workqueue_work_duration_seconds_count", {"name": "claims"})
    return int(value or 0)


def _events_dropped() -> dict[str, int]:
    """pyprovlib_events_dropped_total by reason (the recorder drops, like client-go, when its
    buffer is full)."""
    from prometheus_client import REGISTRY

    out: dict[str, int] = {}
    for metric in REGISTRY.collect():
        if metric.name == "pyprovlib_events_dropped":
            for sample in metric.samples:
                if sample.name.endswith("_total") and sample.value:
                    out[sample.labels["reason"]] = int(sample.value)
    return out


def make_client(configuration: Configuration, args: argparse.Namespace) -> Any:
    """The controller's counting client; ``--aiohttp-trust-env`` as kubernetes-asyncio opens
    its session."""
    api = counting_client(configuration)
    if args.aiohttp_trust_env:
        # kubernetes-asyncio's own session: trust_env=True makes aiohttp look up ~/.netrc
        # and the proxy environment in the default thread pool on every request (two
        # executor round trips). LimitedApiClient resolves the proxy once instead; this
        # undoes that, for comparison (aiohttp's public API: the same connector, a new
        # session).
        import aiohttp

        session = api.rest_client.pool_manager
        connector = session.connector
        session.detach()
        api.rest_client.pool_manager = aiohttp.ClientSession(
            connector=connector, trust_env=True, read_bufsize=2**21
        )
    return api


def _rusage() -> tuple[float, int]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, r.ru_maxrss


def _sys_cpu() -> float:
    """CPU seconds spent in the kernel (sockets, epoll) so far."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_stime


async def run_controller(args: argparse.Namespace) -> None:
    from pyprovlib._provisioner import Provisioner
    from pyprovlib.controller._options import ProvisionControllerOptions
    from pyprovlib.controller._provision import ProvisionController

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))

    class Backend(MemoryProvisioner, Provisioner):
        pass

    if args.object_deleter:
        from collections.abc import Mapping

        from pyprovlib._provisioner import ObjectDeleter

        class JsonBackend(MemoryProvisioner, Provisioner, ObjectDeleter):
            """Deletes from the PV's JSON: the controller converts no model for delete."""

            async def delete_object(self, volume: Mapping[str, Any]) -> None:
                self.assets.pop(volume["metadata"]["name"], None)

        backend: Backend | JsonBackend = JsonBackend()
    else:
        backend = Backend()

    configuration = Configuration()
    await load_kube_config(config_file=args.kubeconfig, client_configuration=configuration)
    configuration.connection_pool_maxsize = max(configuration.connection_pool_maxsize, 64)
    api = make_client(configuration, args)
    controller = ProvisionController(
        api,
        args.provisioner,
        backend,
        ProvisionControllerOptions(leader_election=False, workers=args.threadiness),
    )
    profiler: Any = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile(time.process_time)
    snapshot: dict[str, Any] = {}
    flushing: list[asyncio.Task[None]] = []

    async def provisioned() -> None:
        # SIGUSR1: the driver saw every claim Bound. Events are written in the background
        # (like client-go's broadcaster) and may lag behind: let the ones about
        # this work be written, so their cost counts here, then split the figures.
        await controller.recorder.flush(60)
        cpu, rss = _rusage()
        snapshot.update(
            cpu=cpu,
            sys=_sys_cpu(),
            rss=rss,
            counts=Counter(api.counts),
            dropped=_events_dropped(),
            claim_syncs=_claim_syncs(),
            backlog=controller.recorder.high_water,
        )
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(args.profile)
        print("PROVISIONED", flush=True)

    loop = asyncio.get_running_loop()

    def stop() -> None:
        snapshot["cpu_stop"] = _rusage()[0]
        controller.stop()

    loop.add_signal_handler(signal.SIGTERM, stop)
    loop.add_signal_handler(
        signal.SIGUSR1, lambda: flushing.append(asyncio.create_task(provisioned()))
    )
    task = asyncio.create_task(controller.run())
    while not controller.ready():
        if task.done():
            await task
        await asyncio.sleep(0.01)
    cpu0, rss0 = _rusage()
    sys0 = _sys_cpu()
    syncs0 = _claim_syncs()
    api.counts.clear()
    if profiler is not None:
        profiler.enable()
    print("READY", flush=True)
    await task
    for pending in flushing:
        await pending
    cpu1, maxrss_kb = _rusage()

    def by_verb(counter: Counter[tuple[str, str]]) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for (verb, plural), n in counter.items():
            out.setdefault(verb, {})[plural] = n
        return out

    print(
        json.dumps(
            {
                "cpu_provision_s": snapshot.get("cpu", cpu1) - cpu0,
                "cpu_provision_sys_s": snapshot.get("sys", sys0) - sys0,
                "events_backlog_peak": snapshot.get("backlog"),
                "cpu_delete_s": cpu1 - snapshot.get("cpu", cpu1),
                # Of which the graceful stop (SIGTERM, after every PV was gone) took:
                "cpu_stop_s": cpu1 - snapshot.get("cpu_stop", cpu1),
                "cpu_total_s": cpu1,
                "rss_ready_mb": rss0 / 1024,
                "peak_rss_provision_mb": snapshot.get("rss", maxrss_kb) / 1024,
                "peak_rss_mb": maxrss_kb / 1024,
                "requests_provision": by_verb(snapshot.get("counts", api.counts)),
                "requests": by_verb(api.counts),
                "assets": len(backend.assets),
                "events_dropped_provision": snapshot.get("dropped", {}),
                "claim_syncs_provision": snapshot.get("claim_syncs", _claim_syncs()) - syncs0,
            }
        ),
        flush=True,
    )
    await api.close()


# --------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------


async def _start_logged(tmp: Path, name: str, ready: str, *args: str) -> asyncio.subprocess.Process:
    log_path = tmp / f"{name}.log"
    with log_path.open("wb") as log_file:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "pyprovlib.testing",
            *args,
            stdout=log_file,
            stderr=asyncio.subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    deadline = time.monotonic() + 30
    while ready not in log_path.read_text(errors="replace"):
        if proc.returncode is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the {name} did not start: {log_path.read_text()[-2000:]}")
        await asyncio.sleep(0.05)
    return proc


async def _start_server(
    tmp: Path, *, binder_process: bool
) -> tuple[asyncio.subprocess.Process, asyncio.subprocess.Process | None, Path]:
    """The in-memory API server; with ``binder_process``, its PV binder runs in a process of
    its own (as kube-controller-manager does) instead of inside the server's."""
    kubeconfig = tmp / "kubeconfig"
    server = await _start_logged(
        tmp,
        "API server",
        "listening on",
        "--port",
        "0",
        "--kubeconfig",
        str(kubeconfig),
        # kube-controller-manager's --pvclaimbinder-sync-period: the test default (2 s) puts
        # every claim and PV back in the binder's queue every 2 s, ahead of new claims.
        "--binder-resync-period",
        "15",
        *(["--no-binder"] if binder_process else []),
    )
    binder = None
    if binder_process:
        binder = await _start_logged(
            tmp,
            "PV binder",
            "binder running",
            "--binder-only",
            "--binder-resync-period",
            "15",
            "--kubeconfig",
            str(kubeconfig),
        )
    return server, binder, kubeconfig


class Observer:
    """Watches claims and PVs, timestamping what it sees."""

    def __init__(self, api: ApiClient, namespace: str, expected: int) -> None:
        self.api = api
        self.namespace = namespace
        self.expected = expected
        self.claim_seen: dict[str, float] = {}
        self.claim_annotated: dict[str, float] = {}
        self.bound: dict[str, float] = {}
        self.pv_seen: dict[str, float] = {}  # by claim uid
        self.all_pvs = asyncio.Event()
        self.all_bound = asyncio.Event()
        # Bound, and no longer holding the provisioning-protection finalizer (which the
        # controller removes once the claim is bound, when that option is on): the controller's
        # work for the claims is over only then, so its CPU is read after this.
        self.all_settled = asyncio.Event()
        self.protected: set[str] = set()
        self.no_pvs = asyncio.Event()
        self.pv_names: set[str] = set()

    async def watch(
        self, kind: Resource, namespace: str | None
    ) -> AsyncIterator[tuple[float, Obj]]:
        """Every watch event of ``kind`` (in ``namespace``) from now on, bookmarks aside,
        with the monotonic time it arrived; the watch is resumed when the server ends it."""
        from pyprovlib.kube._rest import ResourceClient

        client = ResourceClient(self.api, kind)
        listed = await client.list(namespace)
        rv = listed["metadata"]["resourceVersion"]
        while True:
            async with client.watch(namespace, resource_version=rv, timeout_seconds=600) as stream:
                async for event in stream:
                    now = time.monotonic()
                    rv = event["object"]["metadata"].get("resourceVersion", rv)
                    if event["type"] != "BOOKMARK":
                        yield now, event

    async def watch_claims(self) -> None:
        from pyprovlib.kube._resources import PERSISTENT_VOLUME_CLAIMS

        async for now, event in self.watch(PERSISTENT_VOLUME_CLAIMS, self.namespace):
            obj = event["object"]
            uid = obj["metadata"]["uid"]
            self.claim_seen.setdefault(uid, now)
            annotations = obj["metadata"].get("annotations") or {}
            if "volume.kubernetes.io/storage-provisioner" in annotations:
                # The PV controller (binder) asked for provisioning: the controller's
                # own latency starts here.
                self.claim_annotated.setdefault(uid, now)
            if FINALIZER_PROVISIONING in (obj["metadata"].get("finalizers") or ()):
                self.protected.add(uid)
            else:
                self.protected.discard(uid)
            if obj.get("status", {}).get("phase") == "Bound":
                self.bound.setdefault(uid, now)
                if len(self.bound) >= self.expected:
                    self.all_bound.set()
            if self.all_bound.is_set() and not self.protected:
                self.all_settled.set()

    async def watch_volumes(self) -> None:
        from pyprovlib.kube._resources import PERSISTENT_VOLUMES

        async for now, event in self.watch(PERSISTENT_VOLUMES, None):
            obj = event["object"]
            ref = obj.get("spec", {}).get("claimRef") or {}
            if ref.get("namespace") != self.namespace:
                continue
            name = obj["metadata"]["name"]
            if event["type"] == "DELETED":
                self.pv_names.discard(name)
                if not self.pv_names and self.all_pvs.is_set():
                    self.no_pvs.set()
                continue
            self.pv_names.add(name)
            self.pv_seen.setdefault(ref.get("uid", name), now)
            if len(self.pv_seen) >= self.expected:
                self.all_pvs.set()


def _proc_cpu(pid: int) -> float | None:
    """CPU seconds (user + system) of another process, from /proc (Linux); None elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[k]


async def drive(args: argparse.Namespace) -> dict[str, Any]:
    from pyprovlib.kube._resources import NAMESPACES, PERSISTENT_VOLUME_CLAIMS, STORAGE_CLASSES
    from pyprovlib.kube._rest import ResourceClient

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-provision-")))
        server: asyncio.subprocess.Process | None = None
        binder: asyncio.subprocess.Process | None = None
        if args.kubeconfig:
            kubeconfig = Path(args.kubeconfig)
            target = f"cluster from {kubeconfig}"
        else:
            server, binder, kubeconfig = await _start_server(
                tmp, binder_process=args.binder_process
            )
            target = "in-memory API server (separate process)"
            if binder is not None:
                target += " and PV binder (another process)"
        suffix = secrets.token_hex(3)
        namespace = f"bench-provision-{suffix}"
        class_name = f"bench-{suffix}"
        provisioner = f"{PROVISIONER}-{suffix}"
        configuration = Configuration()
        await load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
        configuration.connection_pool_maxsize = 128
        api = ApiClient(configuration=configuration)
        controller: asyncio.subprocess.Process | None = None
        try:
            await ResourceClient(api, NAMESPACES).create({"metadata": {"name": namespace}})
            await ResourceClient(api, STORAGE_CLASSES).create(
                {
                    "apiVersion": "storage.k8s.io/v1",
                    "kind": "StorageClass",
                    "metadata": {"name": class_name},
                    "provisioner": provisioner,
                    "reclaimPolicy": "Delete",
                }
            )
            controller = await asyncio.create_subprocess_exec(
                sys.executable,
                str(HERE),
                "--role",
                "controller",
                "--kubeconfig",
                str(kubeconfig),
                "--threadiness",
                str(args.threadiness),
                "--provisioner",
                provisioner,
                *(["--profile", args.profile] if args.profile else []),
                *(["--aiohttp-trust-env"] if args.aiohttp_trust_env else []),
                *(["--object-deleter"] if getattr(args, "object_deleter", False) else []),
                stdout=asyncio.subprocess.PIPE,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
            assert controller.stdout is not None
            async with asyncio.timeout(60):
                while (line := (await controller.stdout.readline()).decode()) != "READY\n":
                    if not line:
                        raise RuntimeError("the controller exited before becoming ready")

            async def start_spy(output: str, pid: int) -> asyncio.subprocess.Process:
                spy = await asyncio.create_subprocess_exec(
                    *(args.py_spy_command or "py-spy").split(),
                    "record",
                    "--rate",
                    str(args.py_spy_rate),
                    "--nonblocking",
                    "--format",
                    "raw",
                    "--output",
                    output,
                    "--pid",
                    str(pid),
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=asyncio.subprocess.DEVNULL,
                )
                await asyncio.sleep(1.0)  # attached
                return spy

            spy: asyncio.subprocess.Process | None = None
            if args.py_spy:
                # Sampled from outside between READY and PROVISIONED: the provisioning only.
                spy = await start_spy(args.py_spy, controller.pid)
            observer = Observer(api, namespace, args.volumes)
            async with asyncio.TaskGroup() as tg:
                watchers = [
                    tg.create_task(observer.watch_claims()),
                    tg.create_task(observer.watch_volumes()),
                ]
                await asyncio.sleep(0.5)  # both watches open

                claims = ResourceClient(api, PERSISTENT_VOLUME_CLAIMS)
                gate = asyncio.Semaphore(args.create_concurrency)

                async def create(i: int) -> None:
                    if args.create_rate > 0:
                        # Paced: claim i is created at i / rate seconds, like a client
                        # creating claims at a steady rate.
                        await asyncio.sleep(t0 + i / args.create_rate - time.monotonic())
                    async with gate:
                        await claims.create(
                            {
                                "apiVersion": "v1",
                                "kind": "PersistentVolumeClaim",
                                "metadata": {"name": f"claim-{i:05d}", "namespace": namespace},
                                "spec": {
                                    "accessModes": ["ReadWriteOnce"],
                                    "storageClassName": class_name,
                                    "resources": {"requests": {"storage": "1Gi"}},
                                },
                            }
                        )

                print(f"creating {args.volumes} claims against the {target}", flush=True)
                server_cpu0 = _proc_cpu(server.pid) if server is not None else None
                binder_cpu0 = _proc_cpu(binder.pid) if binder is not None else None
                t0 = time.monotonic()
                await asyncio.gather(*(create(i) for i in range(args.volumes)))
                t_created = time.monotonic()
                async with asyncio.timeout(args.timeout):
                    await observer.all_pvs.wait()
                t_pvs = time.monotonic()
                async with asyncio.timeout(args.timeout):
                    await observer.all_bound.wait()
                t_bound = time.monotonic()
                async with asyncio.timeout(args.timeout):
                    await observer.all_settled.wait()
                t_settled = time.monotonic()
                server_cpu1 = _proc_cpu(server.pid) if server is not None else None
                binder_cpu1 = _proc_cpu(binder.pid) if binder is not None else None
                controller.send_signal(signal.SIGUSR1)
                async with asyncio.timeout(90):
                    while (line := (await controller.stdout.readline()).decode()) != (
                        "PROVISIONED\n"
                    ):
                        if not line:
                            raise RuntimeError("the controller exited before its figures")

                if spy is not None:
                    spy.send_signal(signal.SIGINT)
                    await spy.wait()
                    spy = None
                if args.py_spy_delete:
                    # From PROVISIONED until every PV is gone: the deletion only.
                    spy = await start_spy(args.py_spy_delete, controller.pid)

                # Clean up through the controller too: deleting the claims releases the PVs.
                async def delete(i: int) -> None:
                    async with gate:
                        await claims.delete(f"claim-{i:05d}", namespace)

                await asyncio.gather(*(delete(i) for i in range(args.volumes)))
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(args.timeout):
                        await observer.no_pvs.wait()
                t_deleted = time.monotonic()
                if spy is not None:
                    spy.send_signal(signal.SIGINT)
                    await spy.wait()
                for w in watchers:
                    w.cancel()

            controller.send_signal(signal.SIGTERM)
            async with asyncio.timeout(60):
                out = (await controller.stdout.read()).decode().strip().splitlines()
                await controller.wait()
            stats = json.loads(out[-1])
        finally:
            if controller is not None and controller.returncode is None:
                controller.kill()
                await controller.wait()
            with contextlib.suppress(Exception):
                await ResourceClient(api, STORAGE_CLASSES).delete(class_name)
            with contextlib.suppress(Exception):
                await ResourceClient(api, NAMESPACES).delete(namespace)
            await api.close()
            for proc in (binder, server):
                if proc is None:
                    continue
                proc.send_signal(signal.SIGTERM)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(10):
                        await proc.wait()
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()

    latencies = [
        observer.pv_seen[uid] - seen
        for uid, seen in observer.claim_seen.items()
        if uid in observer.pv_seen
    ]
    from_annotation = [
        observer.pv_seen[uid] - seen
        for uid, seen in observer.claim_annotated.items()
        if uid in observer.pv_seen
    ]
    n = args.volumes
    per_volume = {
        verb: round(sum(by_resource.values()) / n, 3)
        for verb, by_resource in sorted(stats["requests_provision"].items())
    }
    per_volume_delete = {
        verb: round(
            (sum(by_resource.values()) - sum(stats["requests_provision"].get(verb, {}).values()))
            / n,
            3,
        )
        for verb, by_resource in sorted(stats["requests"].items())
    }
    result = {
        "bench": "provision",
        "volumes": n,
        "threadiness": args.threadiness,
        "target": "real" if args.kubeconfig else "in-memory",
        "aiohttp_trust_env": args.aiohttp_trust_env,
        "create_rate": args.create_rate or None,
        "binder_process": args.binder_process,
        "create_s": round(t_created - t0, 3),
        "all_pvs_s": round(t_pvs - t0, 3),
        "all_bound_s": round(t_bound - t0, 3),
        "all_settled_s": round(t_settled - t0, 3),
        "all_deleted_s": round(t_deleted - t_bound, 3),
        "volumes_per_s": round(n / (t_pvs - t0), 1),
        "p50_s": round(statistics.median(latencies), 4) if latencies else None,
        "p99_s": round(_percentile(latencies, 0.99), 4) if latencies else None,
        "max_s": round(max(latencies), 4) if latencies else None,
        "p50_from_annotation_s": (
            round(statistics.median(from_annotation), 4) if from_annotation else None
        ),
        "p99_from_annotation_s": (
            round(_percentile(from_annotation, 0.99), 4) if from_annotation else None
        ),
        "cpu_s_per_1000": round(stats["cpu_provision_s"] * 1000 / n, 3),
        "cpu_sys_s_per_1000": round(stats.get("cpu_provision_sys_s", 0.0) * 1000 / n, 3),
        "cpu_s_per_1000_delete": round(stats["cpu_delete_s"] * 1000 / n, 3),
        "cpu_s_stop": round(stats.get("cpu_stop_s", 0.0), 3),
        "controller_cpu_total_s": round(stats["cpu_total_s"], 3),
        "rss_idle_mb": round(stats["rss_ready_mb"], 1),
        "peak_rss_mb": round(stats["peak_rss_provision_mb"], 1),
        "peak_rss_with_delete_mb": round(stats["peak_rss_mb"], 1),
        "api_requests_per_volume": per_volume,
        "api_requests_per_volume_delete": per_volume_delete,
        "api_requests_by_resource": stats["requests_provision"],
        "events_dropped": stats.get("events_dropped_provision", {}),
        "claim_syncs_per_volume": round(stats.get("claim_syncs_provision", 0) / n, 2),
        "events_backlog_peak": stats.get("events_backlog_peak"),
        "apiserver_cpu_s": (
            round(server_cpu1 - server_cpu0, 2)
            if server_cpu0 is not None and server_cpu1 is not None
            else None
        ),
        "binder_cpu_s": (
            round(binder_cpu1 - binder_cpu0, 2)
            if binder_cpu0 is not None and binder_cpu1 is not None
            else None
        ),
    }
    print(
        f"{n} claims created in {result['create_s']} s; every PV after {result['all_pvs_s']} s "
        f"({result['volumes_per_s']} volumes/s), every claim Bound after {result['all_bound_s']} s"
    )
    print(
        f"claim → PV latency p50 {result['p50_s']} s, p99 {result['p99_s']} s, "
        f"max {result['max_s']} s"
    )
    print(
        "latency from the PV controller's storage-provisioner annotation to the PV: p50 "
        f"{result['p50_from_annotation_s']} s, p99 {result['p99_from_annotation_s']} s"
    )
    print(
        f"controller: {result['cpu_s_per_1000']} CPU s per 1000 volumes, peak RSS "
        f"{result['peak_rss_mb']} MB (idle after sync: {result['rss_idle_mb']} MB); API "
        f"requests per volume {per_volume}"
    )
    if result["apiserver_cpu_s"] is not None:
        where = "" if result["binder_cpu_s"] is not None else " (with binder)"
        print(
            f"in-memory API server{where}: {result['apiserver_cpu_s']} CPU s over the "
            f"{result['all_bound_s']} s until every claim was Bound"
        )
    if result["binder_cpu_s"] is not None:
        print(f"PV binder process: {result['binder_cpu_s']} CPU s over the same time")
    print(
        f"deleting the claims: every PV gone {result['all_deleted_s']} s after the last bind; "
        f"{result['cpu_s_per_1000_delete']} CPU s per 1000; requests {per_volume_delete}"
    )
    return result


def add_driver_arguments(p: argparse.ArgumentParser, *, threadiness: int) -> None:
    """The flags of the driver half (claims, pacing, the simulated control plane), shared with
    csi_provision.py."""
    p.add_argument("--volumes", type=int, default=1000)
    p.add_argument("--threadiness", type=int, default=threadiness)
    p.add_argument("--kubeconfig", help="a real cluster instead of the in-memory API server")
    p.add_argument("--create-concurrency", type=int, default=64)
    p.add_argument(
        "--create-rate",
        type=float,
        default=0.0,
        help="create claims at this many per second (default 0: all at once)",
    )
    p.add_argument(
        "--binder-process",
        action="store_true",
        help="run the in-memory server's PV binder in its own process",
    )
    p.add_argument("--timeout", type=float, default=300.0)


def add_client_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of the controller's API client, shared with csi_provision.py."""
    p.add_argument(
        "--aiohttp-trust-env",
        action="store_true",
        help="keep kubernetes-asyncio's trust_env=True session (netrc/proxy lookups per request) "
        "instead of pyprovlib.kube._config.use_resolved_proxy",
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_driver_arguments(p, threadiness=4)
    p.add_argument("--role", choices=["driver", "controller"], default="driver")
    p.add_argument("--provisioner", default=PROVISIONER)
    p.add_argument("--profile", help="write the controller's cProfile stats to this file")
    p.add_argument(
        "--object-deleter",
        action="store_true",
        help="the backend is also an ObjectDeleter: deletes from the PV's JSON, so the "
        "controller converts no V1PersistentVolume for it (what that conversion costs)",
    )
    p.add_argument(
        "--py-spy",
        metavar="FILE",
        help="sample the controller with py-spy during provisioning; raw (collapsed) stacks "
        "to FILE",
    )
    p.add_argument(
        "--py-spy-delete",
        metavar="FILE",
        help="sample the controller with py-spy while it deletes (claims deleted until every "
        "PV is gone); raw (collapsed) stacks to FILE",
    )
    p.add_argument("--py-spy-command", help="how to run py-spy (default: py-spy on PATH)")
    p.add_argument("--py-spy-rate", type=int, default=250, help="py-spy samples per second")
    add_client_arguments(p)
    args = p.parse_args()
    if args.kubeconfig:
        args.kubeconfig = os.path.expanduser(args.kubeconfig)
    if args.role == "controller":
        asyncio.run(run_controller(args))
        return
    result = asyncio.run(drive(args))
    print(json.dumps(result))


if __name__ == "__main__":
    main()

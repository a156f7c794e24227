"""Benchmark provisioning through the CSI path: the same measurement as ``provision.py`` (N
claims created at once; time until every PV exists and every claim is Bound; claim → PV
latency; the controller's CPU, memory and API requests per volume), with the controller being
a ProvisionController over a :class:`~pyprovlib.csi.provisioner.CSIProvisioner` that calls
CreateVolume/DeleteVolume over a unix socket. Comparing the two shows the gRPC cost per volume.

Four processes, so the controller's figures are its own:

- the API server (``python -m pyprovlib.testing``, with its PV binder) or a real cluster;
- the CSI driver (``--role driver``): a Python driver built on :mod:`pyprovlib.csi._server`
  answering CreateVolume/DeleteVolume at once from a dict;
- the controller (``--role controller``): CSIConnection + CSIProvisioner + ProvisionController;
- this process, which reuses ``provision.py``'s driver half (claims, watches, timestamps).

The controller counts its provisioning attempts and its CSI calls by gRPC status, so a run
shows whether any volume took more than one attempt (``provision_attempts_per_volume``,
``provision_outcomes``, ``csi_client_calls``). ``--transport none`` answers CreateVolume and
DeleteVolume inside the controller (no driver process, no gRPC): the difference to a normal run
is the transport's cost in place.

``--isolated`` measures the CSI path alone, without an API server: ``CSIProvisioner.provision``
(the claim and class as the controller's cached JSON in, CreateVolume, the PV's JSON out, as
the controller calls it) for N volumes against the driver
process, ``--threadiness`` at a time, ``--repeat`` times; it reports the CPU per volume of this
process. Far less noisy than the end-to-end figures: use it to compare changes to the CSI path
(``--transport none`` there gives the provisioner's own share).

Usage::

    python bench/csi_provision.py --volumes 1000 --threadiness 16
    python bench/csi_provision.py --isolated --volumes 5000 --threadiness 16

Prints human-readable lines, then exactly one line of JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import logging
import os
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import structlog

HERE = Path(__file__).resolve()
CALLS_FILE_ENV = "PYPROVLIB_BENCH_CSI_CALLS_FILE"
# provision.py starts the controller role with its own flags: --transport and
# --provisioning-finalizer travel by env.
TRANSPORT_ENV = "PYPROVLIB_BENCH_CSI_TRANSPORT"
FINALIZER_ENV = "PYPROVLIB_BENCH_CSI_PROVISIONING_FINALIZER"


def _load_provision_bench() -> Any:
    spec = importlib.util.spec_from_file_location("bench_provision", HERE.with_name("provision.py"))
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


provision = _load_provision_bench()


# --------------------------------------------------------------------------------------------
# CSI driver process
# --------------------------------------------------------------------------------------------


async def run_driver(args: argparse.Namespace) -> None:
    from pyprovlib.csi._proto.csi import v1
    from pyprovlib.csi._server import ControllerService, CSIServer, IdentityService

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))

    class Controller(ControllerService):
        def __init__(self) -> None:
            super().__init__([v1.ControllerServiceCapabilityRpcType.CREATE_DELETE_VOLUME])
            self.volumes: dict[str, int] = {}
            self.calls: Counter[str] = Counter()

        async def create_volume(self, message: v1.CreateVolumeRequest) -> v1.CreateVolumeResponse:
            self.calls["CreateVolume"] += 1
            capacity_range = message.capacity_range
            size = capacity_range.required_bytes if capacity_range is not None else 0
            self.volumes.setdefault(message.name, size)
            return v1.CreateVolumeResponse(
                volume=v1.Volume(volume_id=message.name, capacity_bytes=self.volumes[message.name])
            )

        async def delete_volume(self, message: v1.DeleteVolumeRequest) -> v1.DeleteVolumeResponse:
            self.calls["DeleteVolume"] += 1
            self.volumes.pop(message.volume_id, None)
            return v1.DeleteVolumeResponse()

    identity = IdentityService(
        args.provisioner, "bench", services=[v1.PluginCapabilityServiceType.CONTROLLER_SERVICE]
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    # The parent holds our stdin open: EOF means it is gone (even SIGKILLed), so stop rather
    # than be left behind serving nobody.
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)

    async def parent_gone() -> None:
        await stdin.read()
        stop.set()

    controller = Controller()
    async with CSIServer([identity, controller], f"unix://{args.socket}"):
        watcher = asyncio.create_task(parent_gone())
        print("READY", flush=True)
        await stop.wait()
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    print(json.dumps(dict(controller.calls)), flush=True)


# --------------------------------------------------------------------------------------------
# Controller process (the role provision.py's driver half starts)
# --------------------------------------------------------------------------------------------


class InProcessConnection:
    """What CSIProvisioner needs of a CSIConnection, answered in this process: no driver, no
    gRPC (``--transport none``). Volumes are kept in a dict like the driver role's."""

    def __init__(self, driver_name: str) -> None:
        from pyprovlib.csi._connection import PluginCapabilities
        from pyprovlib.csi._proto.csi import v1
        from pyprovlib.kube._clock import RealClock

        self.driver_name = driver_name
        self.plugin_capabilities = PluginCapabilities(
            frozenset({v1.PluginCapabilityServiceType.CONTROLLER_SERVICE})
        )
        self.controller_capabilities = frozenset(
            {v1.ControllerServiceCapabilityRpcType.CREATE_DELETE_VOLUME}
        )
        self.clock = RealClock()
        self.volumes: dict[str, int] = {}
        self.calls: Counter[str] = Counter()

    async def create_volume(self, request: Any, *, call_timeout: float | None = None) -> Any:
        from pyprovlib.csi._proto.csi import v1

        self.calls["CreateVolume"] += 1
        await asyncio.sleep(0)  # a call suspends the worker, as a real one does
        capacity_range = request.capacity_range
        size = capacity_range.required_bytes if capacity_range is not None else 0
        self.volumes.setdefault(request.name, size)
        return v1.CreateVolumeResponse(
            volume=v1.Volume(volume_id=request.name, capacity_bytes=self.volumes[request.name])
        )

    async def delete_volume(self, request: Any, *, call_timeout: float | None = None) -> Any:
        from pyprovlib.csi._proto.csi import v1

        self.calls["DeleteVolume"] += 1
        await asyncio.sleep(0)
        self.volumes.pop(request.volume_id, None)
        return v1.DeleteVolumeResponse()

    def close(self) -> None:
        """Nothing to close."""


def counting_provisioner(base: Any) -> Any:
    """``base`` (CSIProvisioner) counting its provision attempts and how each ended."""
    from pyprovlib._provisioner import ProvisioningError

    class Counting(base):  # type: ignore[misc, valid-type]
        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, **kw)
            self.attempts = 0
            self.outcomes: Counter[str] = Counter()

        async def provision(self, options: Any) -> Any:
            self.attempts += 1
            try:
                volume = await super().provision(options)
            except ProvisioningError as err:
                self.outcomes[f"{type(err).__name__}/{err.state.name}"] += 1
                raise
            except Exception as err:
                self.outcomes[type(err).__name__] += 1
                raise
            self.outcomes["ok"] += 1
            return volume

    return Counting


def csi_client_calls(connection: Any) -> dict[str, int]:
    """The connection's calls by ``method/grpc status`` (its operations histogram)."""
    metrics = getattr(connection, "metrics", None)
    if metrics is None:
        return {f"{k}/OK": v for k, v in getattr(connection, "calls", {}).items()}
    out: dict[str, int] = {}
    for metric in metrics.operations_seconds.collect():
        for sample in metric.samples:
            if sample.name.endswith("_count") and sample.value:
                method = sample.labels["method_name"].rsplit("/", 1)[-1]
                key = f"{method}/{sample.labels['grpc_status_code']}"
                out[key] = out.get(key, 0) + int(sample.value)
    return out


async def start_driver(args: argparse.Namespace, socket: Path) -> asyncio.subprocess.Process:
    """The driver role in a subprocess, once it serves on ``socket``."""
    driver = await asyncio.create_subprocess_exec(
        sys.executable,
        str(HERE),
        "--role",
        "driver",
        "--socket",
        str(socket),
        "--provisioner",
        args.provisioner,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert driver.stdout is not None
    async with asyncio.timeout(60):
        while (line := (await driver.stdout.readline()).decode()) != "READY\n":
            if not line:
                raise RuntimeError("the CSI driver exited before becoming ready")
    return driver


async def stop_driver(driver: asyncio.subprocess.Process | None) -> dict[str, int]:
    """Stop the driver role; the calls it counted ({} when it left none)."""
    if driver is None:
        return {}
    assert driver.stdout is not None
    if driver.returncode is None:
        driver.send_signal(signal.SIGTERM)
    lines = (await driver.stdout.read()).decode().strip().splitlines()
    await driver.wait()
    try:
        calls: dict[str, int] = json.loads(lines[-1]) if lines else {}
    except json.JSONDecodeError:
        return {}
    return calls


async def run_controller(args: argparse.Namespace) -> None:
    from kubernetes_asyncio.client import Configuration
    from kubernetes_asyncio.config import load_kube_config

    from pyprovlib.controller._options import ProvisionControllerOptions
    from pyprovlib.controller._provision import ProvisionController
    from pyprovlib.csi._connection import CSIConnection
    from pyprovlib.csi.provisioner import CSIProvisioner
    from pyprovlib.kube._informer import SharedInformerFactory

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    driver: asyncio.subprocess.Process | None = None
    connection: Any
    if args.transport == "none":
        connection = InProcessConnection(args.provisioner)
    else:
        socket = Path(tempfile.mkdtemp(prefix="bench-csi-")) / "csi.sock"
        driver = await start_driver(args, socket)
        connection = await CSIConnection.open(f"unix://{socket}")

    configuration = Configuration()
    await load_kube_config(config_file=args.kubeconfig, client_configuration=configuration)
    configuration.connection_pool_maxsize = max(configuration.connection_pool_maxsize, 64)
    api = provision.make_client(configuration, args)
    # As the sidecar does: one informer factory for the controller and the provisioner.
    factory = SharedInformerFactory(api)
    provisioner = counting_provisioner(CSIProvisioner)(api, connection, informer_factory=factory)
    controller = ProvisionController(
        api,
        connection.driver_name,
        provisioner,
        ProvisionControllerOptions(
            leader_election=False,
            workers=args.threadiness,
            provisioning_finalizer=args.provisioning_finalizer,
        ),
        informer_factory=factory,
    )
    snapshot: dict[str, Any] = {}
    profiler: Any = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile(time.process_time)

    flushing: list[asyncio.Task[None]] = []

    async def provisioned() -> None:
        # SIGUSR1: the driver saw every claim Bound. Let the events about this work be
        # written (they lag in the background), so their cost counts here; then split.
        await controller.recorder.flush(60)
        cpu, rss = provision._rusage()
        snapshot.update(
            cpu=cpu,
            sys=provision._sys_cpu(),
            backlog=controller.recorder.high_water,
            rss=rss,
            counts=Counter(api.counts),
            dropped=provision._events_dropped(),
            claim_syncs=provision._claim_syncs(),
            attempts=provisioner.attempts,
            outcomes=dict(provisioner.outcomes),
            client_calls=csi_client_calls(connection),
        )
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(args.profile)
        print("PROVISIONED", flush=True)

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, controller.stop)
    loop.add_signal_handler(
        signal.SIGUSR1, lambda: flushing.append(asyncio.create_task(provisioned()))
    )
    task = asyncio.create_task(controller.run())

    async def run_informers() -> None:
        async with asyncio.TaskGroup() as group:
            factory.start(group)
            await asyncio.Event().wait()

    informers = asyncio.create_task(run_informers())
    while not controller.ready():
        if task.done():
            await task
        await asyncio.sleep(0.01)
    cpu0, rss0 = provision._rusage()
    sys0 = provision._sys_cpu()
    syncs0 = provision._claim_syncs()
    api.counts.clear()
    if profiler is not None:
        profiler.enable()
    print("READY", flush=True)
    await task
    for pending in flushing:
        await pending
    informers.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await informers
    cpu1, maxrss_kb = provision._rusage()
    connection.close()
    driver_calls = await stop_driver(driver) if driver is not None else dict(connection.calls)
    # provision.py's driver half reads only its own figures from us: hand the CSI figures
    # over through the file the bench process named.
    figures = {
        "driver_calls": driver_calls,
        "attempts": snapshot.get("attempts", provisioner.attempts),
        "outcomes": snapshot.get("outcomes", dict(provisioner.outcomes)),
        "client_calls": snapshot.get("client_calls", csi_client_calls(connection)),
    }
    await asyncio.to_thread(Path(os.environ[CALLS_FILE_ENV]).write_text, json.dumps(figures))

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
                "cpu_total_s": cpu1,
                "rss_ready_mb": rss0 / 1024,
                "peak_rss_provision_mb": snapshot.get("rss", maxrss_kb) / 1024,
                "peak_rss_mb": maxrss_kb / 1024,
                "requests_provision": by_verb(snapshot.get("counts", api.counts)),
                "requests": by_verb(api.counts),
                "assets": 0,
                "events_dropped_provision": snapshot.get("dropped", {}),
                "claim_syncs_provision": snapshot.get("claim_syncs", provision._claim_syncs())
                - syncs0,
            }
        ),
        flush=True,
    )
    await api.close()


# --------------------------------------------------------------------------------------------
# Isolated: the CSI path alone (--isolated)
# --------------------------------------------------------------------------------------------


def _claim(i: int, run: int) -> dict[str, Any]:
    """A claim as the controller's cache holds it once the PV controller annotated it."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": f"claim-{i:05d}",
            "namespace": "bench",
            "uid": f"{run:08x}-0000-4000-8000-{i:012x}",
            "resourceVersion": str(1000 + i),
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "annotations": {"volume.kubernetes.io/storage-provisioner": "bench"},
        },
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "bench",
            "resources": {"requests": {"storage": "1Gi"}},
            "volumeMode": "Filesystem",
        },
        "status": {"phase": "Pending"},
    }


async def run_isolated(args: argparse.Namespace) -> dict[str, Any]:
    """CSIProvisioner.provision for ``args.volumes`` claims, ``args.threadiness`` at a time,
    ``args.repeat`` times; the CPU per volume of this process (user and system)."""
    import resource
    import statistics

    from kubernetes_asyncio.client import ApiClient, Configuration

    from pyprovlib._provisioner import ProvisionOptions
    from pyprovlib.csi._connection import CSIConnection
    from pyprovlib.csi.provisioner import CSIProvisioner

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    driver: asyncio.subprocess.Process | None = None
    connection: Any
    if args.transport == "none":
        connection = InProcessConnection(args.provisioner)
    else:
        socket = Path(tempfile.mkdtemp(prefix="bench-csi-")) / "csi.sock"
        driver = await start_driver(args, socket)
        connection = await CSIConnection.open(f"unix://{socket}")
    # Never called: the class names no secrets, the driver has no topology, claims no source.
    api = ApiClient(Configuration())
    provisioner = counting_provisioner(CSIProvisioner)(api, connection)
    storage_class: dict[str, Any] = {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": "bench", "uid": "class-uid", "resourceVersion": "1"},
        "provisioner": connection.driver_name,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
    }

    async def provision_all(options: list[ProvisionOptions]) -> None:
        pending = iter(options)

        async def worker() -> None:
            # Like the controller's workers: each takes the next claim when it is free.
            for item in pending:
                await provisioner.provision(item)

        async with asyncio.TaskGroup() as group:
            for _ in range(args.threadiness):
                group.create_task(worker())

    def batch(run: int, n: int) -> list[ProvisionOptions]:
        # The cached JSON, as the controller hands it over: CSIProvisioner reads
        # claim_object/storage_class_object and converts nothing.
        return [
            ProvisionOptions(
                storage_class=storage_class,
                pv_name=f"pvc-{run:08x}-{i:012x}",
                pvc=_claim(i, run),
            )
            for i in range(n)
        ]

    try:
        await provision_all(batch(0, 100))  # warm-up: first calls, lazy imports
        runs: list[dict[str, float]] = []
        for run in range(1, args.repeat + 1):
            options = batch(run, args.volumes)
            before = resource.getrusage(resource.RUSAGE_SELF)
            wall0 = time.monotonic()
            await provision_all(options)
            wall = time.monotonic() - wall0
            after = resource.getrusage(resource.RUSAGE_SELF)
            user = after.ru_utime - before.ru_utime
            system = after.ru_stime - before.ru_stime
            runs.append(
                {
                    "cpu_us_per_volume": round((user + system) * 1e6 / args.volumes, 1),
                    "user_us_per_volume": round(user * 1e6 / args.volumes, 1),
                    "sys_us_per_volume": round(system * 1e6 / args.volumes, 1),
                    "volumes_per_s": round(args.volumes / wall, 1),
                }
            )
            print(
                f"run {run}: {runs[-1]['cpu_us_per_volume']} CPU µs per volume (user "
                f"{runs[-1]['user_us_per_volume']}, sys {runs[-1]['sys_us_per_volume']}), "
                f"{runs[-1]['volumes_per_s']} volumes/s",
                flush=True,
            )
        client_calls = csi_client_calls(connection)
    finally:
        connection.close()
        driver_calls = await stop_driver(driver) if driver is not None else dict(connection.calls)
        await api.close()
    total = 100 + args.volumes * args.repeat
    return {
        "bench": "csi_provision_isolated",
        "volumes": args.volumes,
        "repeat": args.repeat,
        "threadiness": args.threadiness,
        "transport": args.transport,
        "cpu_us_per_volume": statistics.median(r["cpu_us_per_volume"] for r in runs),
        "cpu_us_per_volume_min": min(r["cpu_us_per_volume"] for r in runs),
        "runs": runs,
        "provision_attempts_per_volume": round(provisioner.attempts / total, 3),
        "provision_outcomes": dict(provisioner.outcomes),
        "csi_client_calls": client_calls,
        "csi_calls_per_volume": {k: round(v / total, 3) for k, v in driver_calls.items()},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    provision.add_driver_arguments(p, threadiness=16)
    p.add_argument("--role", choices=["bench", "controller", "driver"], default="bench")
    p.add_argument("--provisioner", default=provision.PROVISIONER.replace("/", "-"))
    p.add_argument("--socket", help="driver role: the unix socket to serve on")
    p.add_argument("--py-spy", metavar="FILE", help="as in provision.py")
    p.add_argument("--py-spy-delete", metavar="FILE", help="as in provision.py")
    p.add_argument("--py-spy-command", help="as in provision.py")
    p.add_argument("--py-spy-rate", type=int, default=250, help="as in provision.py")
    p.add_argument(
        "--profile",
        help="write the controller's cProfile stats to this file. cProfile counts every "
        "resumption of a coroutine as a call: an async function's ncalls is its invocations "
        "plus its suspensions, not a number of attempts (provision_attempts_per_volume is)",
    )
    provision.add_client_arguments(p)
    p.add_argument(
        "--transport",
        choices=["grpc", "none"],
        default=os.environ.get(TRANSPORT_ENV, "grpc"),
        help="none: answer CreateVolume/DeleteVolume in the controller, without driver or gRPC",
    )
    p.add_argument(
        "--provisioning-finalizer",
        choices=["true", "false"],
        default=os.environ.get(FINALIZER_ENV, "true"),
        help="hold claims with pyprovlib.io/provisioning-protection while their volume is "
        "created (the sidecar's default: true; false is upstream's behaviour, two claim "
        "PATCHes fewer per volume)",
    )
    p.add_argument(
        "--isolated",
        action="store_true",
        help="measure CSIProvisioner.provision against the driver alone (no API server)",
    )
    p.add_argument("--repeat", type=int, default=3, help="--isolated: runs of --volumes each")
    args = p.parse_args()
    args.provisioning_finalizer = args.provisioning_finalizer == "true"
    if args.kubeconfig:
        args.kubeconfig = os.path.expanduser(args.kubeconfig)
    if args.role == "driver":
        asyncio.run(run_driver(args))
        return
    if args.role == "controller":
        asyncio.run(run_controller(args))
        return
    if args.isolated:
        print(json.dumps(asyncio.run(run_isolated(args))))
        return
    # provision.py's driver half starts HERE --role controller, and names the provisioner
    # bench.pyprovlib.io/memory-<suffix>, which the CSI driver takes as its name.
    provision.HERE = HERE
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-csi-calls-") as tmp:
        calls_file = Path(tmp) / "calls.json"
        os.environ[CALLS_FILE_ENV] = str(calls_file)
        os.environ[TRANSPORT_ENV] = args.transport
        os.environ[FINALIZER_ENV] = str(args.provisioning_finalizer).lower()
        result = asyncio.run(provision.drive(args))
        figures = json.loads(calls_file.read_text()) if calls_file.exists() else {}
    result["bench"] = "csi_provision"
    result["transport"] = args.transport
    result["provisioning_finalizer"] = args.provisioning_finalizer
    calls = figures.get("driver_calls", {})
    result["csi_calls_per_volume"] = {k: round(v / args.volumes, 3) for k, v in calls.items()}
    result["provision_attempts_per_volume"] = round(figures.get("attempts", 0) / args.volumes, 3)
    result["provision_outcomes"] = figures.get("outcomes", {})
    result["csi_client_calls"] = figures.get("client_calls", {})
    print(
        f"CSI calls per volume (driver side): {result['csi_calls_per_volume']}; provision "
        f"attempts per volume {result['provision_attempts_per_volume']} "
        f"{result['provision_outcomes']}; controller's CSI calls {result['csi_client_calls']}"
    )
    result["wall_s"] = round(time.monotonic() - started, 1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()

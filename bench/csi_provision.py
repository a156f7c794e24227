"""Benchmark provisioning through the CSI path: the same measurement as ``provision.py`` (N
claims created at once; time until every PV exists and every claim is Bound; claim → PV
latency; the controller's CPU, memory and API requests per volume), with the controller being
a ProvisionController over a :class:`~pyprovlib.csi.provisioner.CSIProvisioner` that calls
CreateVolume/DeleteVolume over a unix socket. Comparing the two shows the gRPC cost per volume.

Four processes, so the controller's figures are its own:

- the API server (``python -m pyprovlib.testing``, with its PV binder) or a real cluster;
- the CSI driver (``--role driver``): a Python driver built on :mod:`pyprovlib.csi.server`
  answering CreateVolume/DeleteVolume at once from a dict;
- the controller (``--role controller``): CSIConnection + CSIProvisioner + ProvisionController;
- this process, which reuses ``provision.py``'s driver half (claims, watches, timestamps).

Usage::

    python bench/csi_provision.py --volumes 1000 --threadiness 16

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
    from pyprovlib.csi.server import ControllerService, CSIServer, IdentityService

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))

    class Controller(ControllerService):
        def __init__(self) -> None:
            super().__init__([v1.ControllerServiceCapabilityRpcType.CREATE_DELETE_VOLUME])
            self.volumes: dict[str, int] = {}
            self.calls: Counter[str] = Counter()

        async def create_volume(self, message: v1.CreateVolumeRequest) -> v1.CreateVolumeResponse:
            self.calls["CreateVolume"] += 1
            size = message.capacity_range.required_bytes if message.capacity_range else 0
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
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    controller = Controller()
    async with CSIServer([identity, controller], f"unix://{args.socket}"):
        print("READY", flush=True)
        await stop.wait()
    print(json.dumps(dict(controller.calls)), flush=True)


# --------------------------------------------------------------------------------------------
# Controller process (the role provision.py's driver half starts)
# --------------------------------------------------------------------------------------------


async def run_controller(args: argparse.Namespace) -> None:
    from kubernetes_asyncio.client import Configuration
    from kubernetes_asyncio.config import load_kube_config

    from pyprovlib.controller.options import ProvisionControllerOptions
    from pyprovlib.controller.provision import ProvisionController
    from pyprovlib.csi.connection import CSIConnection
    from pyprovlib.csi.provisioner import CSIProvisioner
    from pyprovlib.kube.informer import SharedInformerFactory

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    tmp = Path(tempfile.mkdtemp(prefix="bench-csi-"))
    socket = tmp / "csi.sock"
    driver = await asyncio.create_subprocess_exec(
        sys.executable,
        str(HERE),
        "--role",
        "driver",
        "--socket",
        str(socket),
        "--provisioner",
        args.provisioner,
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert driver.stdout is not None
    async with asyncio.timeout(60):
        while (line := (await driver.stdout.readline()).decode()) != "READY\n":
            if not line:
                raise RuntimeError("the CSI driver exited before becoming ready")

    configuration = Configuration()
    await load_kube_config(config_file=args.kubeconfig, client_configuration=configuration)
    configuration.connection_pool_maxsize = max(configuration.connection_pool_maxsize, 64)
    api = provision.CountingApiClient(configuration)
    if not args.aiohttp_trust_env:
        api.rest_client.pool_manager._trust_env = False
    connection = await CSIConnection.open(f"unix://{socket}")
    # As the sidecar does: one informer factory for the controller and the provisioner.
    factory = SharedInformerFactory(api)
    controller = ProvisionController(
        api,
        connection.driver_name,
        CSIProvisioner(api, connection, informer_factory=factory),
        ProvisionControllerOptions(leader_election=False, threadiness=args.threadiness),
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
            cpu=cpu, rss=rss, counts=Counter(api.counts), dropped=provision._events_dropped()
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
    driver.send_signal(signal.SIGTERM)
    driver_calls = json.loads((await driver.stdout.read()).decode().strip().splitlines()[-1])
    await driver.wait()
    # provision.py's driver half reads only its own figures from us: hand the CSI call
    # counts over through the file the bench process named.
    await asyncio.to_thread(Path(os.environ[CALLS_FILE_ENV]).write_text, json.dumps(driver_calls))

    def by_verb(counter: Counter[tuple[str, str]]) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for (verb, plural), n in counter.items():
            out.setdefault(verb, {})[plural] = n
        return out

    print(
        json.dumps(
            {
                "cpu_provision_s": snapshot.get("cpu", cpu1) - cpu0,
                "cpu_delete_s": cpu1 - snapshot.get("cpu", cpu1),
                "cpu_total_s": cpu1,
                "rss_ready_mb": rss0 / 1024,
                "peak_rss_provision_mb": snapshot.get("rss", maxrss_kb) / 1024,
                "peak_rss_mb": maxrss_kb / 1024,
                "requests_provision": by_verb(snapshot.get("counts", api.counts)),
                "requests": by_verb(api.counts),
                "assets": 0,
                "events_dropped_provision": snapshot.get("dropped", {}),
            }
        ),
        flush=True,
    )
    await api.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--volumes", type=int, default=1000)
    p.add_argument("--threadiness", type=int, default=16)
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
    p.add_argument("--role", choices=["bench", "controller", "driver"], default="bench")
    p.add_argument("--provisioner", default=provision.PROVISIONER.replace("/", "-"))
    p.add_argument("--socket", help="driver role: the unix socket to serve on")
    p.add_argument("--profile", help="write the controller's cProfile stats to this file")
    p.add_argument("--aiohttp-trust-env", action="store_true")
    args = p.parse_args()
    if args.kubeconfig:
        args.kubeconfig = os.path.expanduser(args.kubeconfig)
    if args.role == "driver":
        asyncio.run(run_driver(args))
        return
    if args.role == "controller":
        asyncio.run(run_controller(args))
        return
    # provision.py's driver half starts HERE --role controller, and names the provisioner
    # bench.pyprovlib.io/memory-<suffix>, which the CSI driver takes as its name.
    provision.HERE = HERE
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-csi-calls-") as tmp:
        calls_file = Path(tmp) / "calls.json"
        os.environ[CALLS_FILE_ENV] = str(calls_file)
        result = asyncio.run(provision.drive(args))
        calls = json.loads(calls_file.read_text()) if calls_file.exists() else {}
    result["bench"] = "csi_provision"
    result["csi_calls_per_volume"] = {k: round(v / args.volumes, 3) for k, v in calls.items()}
    print(f"CSI calls per volume: {result['csi_calls_per_volume']}")
    result["wall_s"] = round(time.monotonic() - started, 1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()

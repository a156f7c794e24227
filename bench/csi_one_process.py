"""Benchmark ``python -m pyprovlib.csi`` (the provisioner, attacher and resizer controllers in
one process) against the three sidecars as separate processes (``python -m
pyprovlib.csi.provisioner``, ``.attacher``, ``.resizer``) on the same work: N volumes
provisioned, attached, expanded, detached and deleted.

Processes, so each figure is its own:

- the API server (``python -m pyprovlib.testing``, with its PV binder, as ``provision.py``
  starts it);
- the CSI driver (``--role driver``): a Python driver on :mod:`pyprovlib.csi._server` answering
  CreateVolume, DeleteVolume, ControllerPublishVolume, ControllerUnpublishVolume and
  ControllerExpandVolume at once from a dict (the in-repo test driver's behaviour; not the Go
  hostpathplugin, whose own cost and disk work would only add noise to both sides alike);
- the controllers: one process, or three — the figures measured: peak RSS (``VmHWM``) and CPU
  (user + system) of each, read from /proc just before they are stopped;
- this process: the workload, in phases, each waited for by listing (every 0.5 s): create N
  claims (1Gi) until all are Bound; create a VolumeAttachment per PV until all are attached;
  raise every claim to 2Gi until every claim reports 2Gi; delete the VolumeAttachments until
  none is left; delete the claims until no PV is left.

Both layouts get the same flags: leader election on (one Lease, or one per sidecar),
``--kube-api-qps 0`` (no client-side limit: three sidecars would otherwise have three times the
budget of one process), every other flag at its default.

Usage::

    python bench/csi_one_process.py --volumes 1000            # both layouts, interleaved
    python bench/csi_one_process.py --volumes 1000 --runs 3
    python bench/csi_one_process.py --volumes 200 --layout one

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
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import structlog

HERE = Path(__file__).resolve()
DRIVER = "bench.csi.pyprovlib.io"
NODE = "bench-node"
NAMESPACE = "default"
POLL = 0.5
PHASE_TIMEOUT = 900.0
SIDECARS = ("pyprovlib.csi.provisioner", "pyprovlib.csi.attacher", "pyprovlib.csi.resizer")


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
    from grpclib.const import Status

    from pyprovlib.csi._proto.csi import v1
    from pyprovlib.csi._server import ControllerService, CSIError, CSIServer, IdentityService

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    caps = v1.ControllerServiceCapabilityRpcType

    class Controller(ControllerService):
        def __init__(self) -> None:
            super().__init__(
                [caps.CREATE_DELETE_VOLUME, caps.PUBLISH_UNPUBLISH_VOLUME, caps.EXPAND_VOLUME]
            )
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

        async def controller_publish_volume(
            self, message: v1.ControllerPublishVolumeRequest
        ) -> v1.ControllerPublishVolumeResponse:
            self.calls["ControllerPublishVolume"] += 1
            if message.volume_id not in self.volumes:
                raise CSIError(Status.NOT_FOUND, f"volume {message.volume_id} not found")
            return v1.ControllerPublishVolumeResponse(publish_context={"devicePath": "/dev/x"})

        async def controller_unpublish_volume(
            self, message: v1.ControllerUnpublishVolumeRequest
        ) -> v1.ControllerUnpublishVolumeResponse:
            self.calls["ControllerUnpublishVolume"] += 1
            return v1.ControllerUnpublishVolumeResponse()

        async def controller_expand_volume(
            self, message: v1.ControllerExpandVolumeRequest
        ) -> v1.ControllerExpandVolumeResponse:
            self.calls["ControllerExpandVolume"] += 1
            if message.volume_id not in self.volumes:
                raise CSIError(Status.NOT_FOUND, f"volume {message.volume_id} not found")
            required = message.capacity_range.required_bytes if message.capacity_range else 0
            self.volumes[message.volume_id] = max(self.volumes[message.volume_id], required)
            return v1.ControllerExpandVolumeResponse(
                capacity_bytes=self.volumes[message.volume_id], node_expansion_required=False
            )

    identity = IdentityService(
        DRIVER, "bench", services=[v1.PluginCapabilityServiceType.CONTROLLER_SERVICE]
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    # The parent holds our stdin open: EOF means it is gone, so stop rather than linger.
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


async def start_driver(socket: Path) -> asyncio.subprocess.Process:
    driver = await asyncio.create_subprocess_exec(
        sys.executable,
        str(HERE),
        "--role",
        "driver",
        "--socket",
        str(socket),
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


async def stop_driver(driver: asyncio.subprocess.Process) -> dict[str, int]:
    assert driver.stdout is not None
    if driver.returncode is None:
        driver.send_signal(signal.SIGTERM)
    lines = (await driver.stdout.read()).decode().strip().splitlines()
    await driver.wait()
    calls: dict[str, int] = json.loads(lines[-1]) if lines else {}
    return calls


# --------------------------------------------------------------------------------------------
# Controller processes
# --------------------------------------------------------------------------------------------


def _proc_status_kb(pid: int, field: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


async def start_controllers(
    layout: str, kubeconfig: Path, socket: Path, tmp: Path
) -> list[tuple[str, asyncio.subprocess.Process]]:
    modules = ["pyprovlib.csi"] if layout == "one" else list(SIDECARS)
    flags = [
        "--kubeconfig",
        str(kubeconfig),
        f"--csi-address=unix://{socket}",
        "--leader-election=true",
        f"--leader-election-namespace={NAMESPACE}",
        "--kube-api-qps=0",
        "--log-format=json",
        "--log-level=warning",
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYPROVLIB_")}
    env["PYTHONUNBUFFERED"] = "1"
    started = []
    for module in modules:
        log = (tmp / f"{module}.log").open("wb")
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            module,
            *flags,
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
            env=env,
        )
        log.close()
        started.append((module, proc))
    return started


async def stop_controllers(started: list[tuple[str, asyncio.subprocess.Process]]) -> None:
    for _, proc in started:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
    for _, proc in started:
        try:
            await asyncio.wait_for(proc.wait(), 60)
        except TimeoutError:
            proc.kill()
            await proc.wait()


# --------------------------------------------------------------------------------------------
# The workload
# --------------------------------------------------------------------------------------------


async def _until(
    what: str,
    check: Callable[[], Awaitable[bool]],
    started: list[tuple[str, asyncio.subprocess.Process]],
) -> float:
    begin = time.monotonic()
    while not await check():
        for module, proc in started:
            if proc.returncode is not None:
                raise RuntimeError(f"{module} exited ({proc.returncode}) during {what}")
        if time.monotonic() - begin > PHASE_TIMEOUT:
            raise RuntimeError(f"{what}: not done within {PHASE_TIMEOUT:.0f}s")
        await asyncio.sleep(POLL)
    return time.monotonic() - begin


async def _gather_limited(n: int, limit: int, one: Callable[[int], Awaitable[None]]) -> None:
    semaphore = asyncio.Semaphore(limit)

    async def guarded(i: int) -> None:
        async with semaphore:
            await one(i)

    await asyncio.gather(*(guarded(i) for i in range(n)))


async def workload(
    kubeconfig: Path,
    volumes: int,
    concurrency: int,
    started: list[tuple[str, asyncio.subprocess.Process]],
    startup_cpu: dict[str, float],
) -> dict[str, float]:
    from pyprovlib.kube._config import ClientSettings, new_client
    from pyprovlib.kube._resources import (
        CSINODES,
        LEASES,
        PERSISTENT_VOLUME_CLAIMS,
        PERSISTENT_VOLUMES,
        STORAGE_CLASSES,
        VOLUME_ATTACHMENTS,
    )
    from pyprovlib.kube._rest import ResourceClient

    phases: dict[str, float] = {}
    api = await new_client(ClientSettings(kubeconfig=str(kubeconfig), qps=0, burst=0))
    async with api:
        claims = ResourceClient(api, PERSISTENT_VOLUME_CLAIMS)
        pvs = ResourceClient(api, PERSISTENT_VOLUMES)
        vas = ResourceClient(api, VOLUME_ATTACHMENTS)
        leases = ResourceClient(api, LEASES)

        async def items(client: ResourceClient, namespace: str | None = None) -> list[Any]:
            return list((await client.list(namespace)).get("items") or [])

        expected_leases = 1 if len(started) == 1 else 3

        async def leading() -> bool:
            return len(await items(leases, NAMESPACE)) >= expected_leases

        phases["start"] = await _until("start-up", leading, started)
        for module, proc in started:
            startup_cpu[module] = provision._proc_cpu(proc.pid) or 0.0

        await ResourceClient(api, CSINODES).create(
            {
                "apiVersion": "storage.k8s.io/v1",
                "kind": "CSINode",
                "metadata": {"name": NODE},
                "spec": {"drivers": [{"name": DRIVER, "nodeID": NODE}]},
            }
        )
        await ResourceClient(api, STORAGE_CLASSES).create(
            {
                "apiVersion": "storage.k8s.io/v1",
                "kind": "StorageClass",
                "metadata": {"name": "bench"},
                "provisioner": DRIVER,
                "allowVolumeExpansion": True,
            }
        )

        async def create_claim(i: int) -> None:
            await claims.create(
                {
                    "apiVersion": "v1",
                    "kind": "PersistentVolumeClaim",
                    "metadata": {"name": f"claim-{i}", "namespace": NAMESPACE},
                    "spec": {
                        "accessModes": ["ReadWriteOnce"],
                        "storageClassName": "bench",
                        "resources": {"requests": {"storage": "1Gi"}},
                    },
                }
            )

        async def all_bound() -> bool:
            listed = await items(claims, NAMESPACE)
            return sum((c.get("status") or {}).get("phase") == "Bound" for c in listed) == volumes

        begin = time.monotonic()
        await _gather_limited(volumes, concurrency, create_claim)
        await _until("provisioning", all_bound, started)
        phases["provision"] = time.monotonic() - begin

        pv_names = sorted(c["spec"]["volumeName"] for c in await items(claims, NAMESPACE))

        async def create_va(i: int) -> None:
            await vas.create(
                {
                    "apiVersion": "storage.k8s.io/v1",
                    "kind": "VolumeAttachment",
                    "metadata": {"name": f"va-{i}"},
                    "spec": {
                        "attacher": DRIVER,
                        "nodeName": NODE,
                        "source": {"persistentVolumeName": pv_names[i]},
                    },
                }
            )

        async def all_attached() -> bool:
            listed = await items(vas)
            return sum(bool((v.get("status") or {}).get("attached")) for v in listed) == volumes

        begin = time.monotonic()
        await _gather_limited(volumes, concurrency, create_va)
        await _until("attaching", all_attached, started)
        phases["attach"] = time.monotonic() - begin

        async def expand(i: int) -> None:
            await claims.patch(
                f"claim-{i}",
                {"spec": {"resources": {"requests": {"storage": "2Gi"}}}},
                namespace=NAMESPACE,
            )

        async def all_expanded() -> bool:
            listed = await items(claims, NAMESPACE)
            done = sum(
                ((c.get("status") or {}).get("capacity") or {}).get("storage") == "2Gi"
                for c in listed
            )
            return done == volumes

        begin = time.monotonic()
        await _gather_limited(volumes, concurrency, expand)
        await _until("expanding", all_expanded, started)
        phases["expand"] = time.monotonic() - begin

        async def detach(i: int) -> None:
            await vas.delete(f"va-{i}")

        async def none_attached() -> bool:
            return not await items(vas)

        begin = time.monotonic()
        await _gather_limited(volumes, concurrency, detach)
        await _until("detaching", none_attached, started)
        phases["detach"] = time.monotonic() - begin

        async def delete_claim(i: int) -> None:
            await claims.delete(f"claim-{i}", NAMESPACE)

        async def no_volumes() -> bool:
            return not await items(pvs)

        begin = time.monotonic()
        await _gather_limited(volumes, concurrency, delete_claim)
        await _until("deleting", no_volumes, started)
        phases["delete"] = time.monotonic() - begin
    return phases


async def run_layout(layout: str, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="pcsi1-") as tmp_name:
        tmp = Path(tmp_name)
        server, binder, kubeconfig = await provision._start_server(tmp, binder_process=False)
        driver: asyncio.subprocess.Process | None = None
        started: list[tuple[str, asyncio.subprocess.Process]] = []
        try:
            socket = tmp / "csi.sock"
            driver = await start_driver(socket)
            started = await start_controllers(layout, kubeconfig, socket, tmp)
            startup: dict[str, float] = {}
            phases = await workload(kubeconfig, args.volumes, args.concurrency, started, startup)
            processes = {}
            for module, proc in started:
                cpu = provision._proc_cpu(proc.pid) or 0.0
                processes[module] = {
                    "cpu_s": cpu,
                    "startup_cpu_s": startup[module],
                    "work_cpu_s": cpu - startup[module],
                    "peak_rss_mb": (_proc_status_kb(proc.pid, "VmHWM") or 0) / 1024,
                    "rss_mb": (_proc_status_kb(proc.pid, "VmRSS") or 0) / 1024,
                }
        except BaseException:
            for module, _ in started:
                log = tmp / f"{module}.log"
                if log.exists():
                    print(f"--- {module}\n{log.read_text(errors='replace')[-3000:]}")
            raise
        finally:
            await stop_controllers(started)
            calls = await stop_driver(driver) if driver is not None else {}
            for proc in (server, binder):
                if proc is not None and proc.returncode is None:
                    proc.send_signal(signal.SIGTERM)
                    await proc.wait()
    return {
        "layout": layout,
        "processes": processes,
        "cpu_s": sum(p["cpu_s"] for p in processes.values()),
        "startup_cpu_s": sum(p["startup_cpu_s"] for p in processes.values()),
        "work_cpu_s": sum(p["work_cpu_s"] for p in processes.values()),
        "peak_rss_mb": sum(p["peak_rss_mb"] for p in processes.values()),
        "phases_s": phases,
        "csi_calls": calls,
    }


def _human(result: dict[str, Any], volumes: int) -> None:
    phases = ", ".join(f"{k} {v:.1f}s" for k, v in result["phases_s"].items())
    print(
        f"{result['layout']:>5}: CPU {result['cpu_s']:.1f} s (start-up "
        f"{result['startup_cpu_s']:.1f}, the work {result['work_cpu_s']:.1f}), peak RSS "
        f"{result['peak_rss_mb']:.1f} MB ({len(result['processes'])} process(es)); {phases}"
    )
    for module, proc in result["processes"].items():
        print(f"        {module}: CPU {proc['cpu_s']:.1f} s, peak RSS {proc['peak_rss_mb']:.1f} MB")
    calls = result["csi_calls"]
    print(f"        CSI calls per volume: { {k: v / volumes for k, v in sorted(calls.items())} }")


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    layouts = ["one", "three"] if args.layout == "both" else [args.layout]
    runs: dict[str, list[dict[str, Any]]] = {layout: [] for layout in layouts}
    print(
        f"{args.volumes} volumes: provision, attach, expand, detach, delete; "
        f"{args.runs} run(s) per layout, interleaved; load {os.getloadavg()[0]:.2f}"
    )
    for run in range(args.runs):
        for layout in layouts if run % 2 == 0 else list(reversed(layouts)):
            result = await run_layout(layout, args)
            _human(result, args.volumes)
            runs[layout].append(result)
    summary: dict[str, Any] = {}
    for layout, results in runs.items():
        summary[layout] = {
            "processes": len(results[0]["processes"]),
            "cpu_s": statistics.median(r["cpu_s"] for r in results),
            "cpu_s_runs": [round(r["cpu_s"], 2) for r in results],
            "startup_cpu_s": statistics.median(r["startup_cpu_s"] for r in results),
            "work_cpu_s": statistics.median(r["work_cpu_s"] for r in results),
            "work_cpu_s_runs": [round(r["work_cpu_s"], 2) for r in results],
            "peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in results),
            "peak_rss_mb_runs": [round(r["peak_rss_mb"], 1) for r in results],
            "per_process_peak_rss_mb": {
                m: round(statistics.median(r["processes"][m]["peak_rss_mb"] for r in results), 1)
                for m in results[0]["processes"]
            },
            "phases_s": {
                k: round(statistics.median(r["phases_s"][k] for r in results), 2)
                for k in results[0]["phases_s"]
            },
            "csi_calls_per_volume": {
                k: v / args.volumes for k, v in sorted(results[-1]["csi_calls"].items())
            },
        }
    if "one" in summary and "three" in summary:
        one, three = summary["one"], summary["three"]
        print(
            f"one process vs three sidecars (medians): CPU {one['cpu_s']:.1f} vs "
            f"{three['cpu_s']:.1f} s ({100 * (1 - one['cpu_s'] / three['cpu_s']):.0f} % less; "
            f"the work alone {one['work_cpu_s']:.1f} vs {three['work_cpu_s']:.1f} s), "
            f"peak RSS {one['peak_rss_mb']:.1f} vs {three['peak_rss_mb']:.1f} MB "
            f"({100 * (1 - one['peak_rss_mb'] / three['peak_rss_mb']):.0f} % less)"
        )
    return {
        "bench": "csi_one_process",
        "volumes": args.volumes,
        "runs": args.runs,
        "driver": "python (bench/csi_one_process.py --role driver)",
        "layouts": summary,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--role", choices=["bench", "driver"], default="bench")
    p.add_argument("--socket", help="driver role: the unix socket to serve on")
    p.add_argument("--volumes", type=int, default=1000)
    p.add_argument("--runs", type=int, default=1, help="runs per layout, interleaved")
    p.add_argument("--layout", choices=["both", "one", "three"], default="both")
    p.add_argument("--concurrency", type=int, default=32, help="the workload's requests in flight")
    args = p.parse_args()
    if args.role == "driver":
        asyncio.run(run_driver(args))
        return
    # The workload's own client logs nothing but warnings: stdout is the bench's report.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    result = asyncio.run(bench(args))
    print(json.dumps(result))


if __name__ == "__main__":
    main()

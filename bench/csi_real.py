"""The CSI provisioner sidecar against the Go external-provisioner on a real control plane.

One run of this script starts etcd + kube-apiserver + kube-controller-manager from an assets
directory (:class:`pyprovlib.testing.ControlPlane`, ``--assets``, default
``$PYPROVLIB_KUBE_ASSETS`` or ``/opt/kube-assets``), then measures, one after the other and
interleaved (go, py, py, go, ...), the two peers on the same work:

- ``go``: ``csi-provisioner`` from the assets directory (kubernetes-csi/external-provisioner);
- ``py``: ``python -m pyprovlib.csi.provisioner --provisioning-finalizer=false`` (upstream
  has no provisioning finalizer), started through this script's ``--role py-sidecar`` so
  ``--stages`` can record per-stage timestamps inside it; kubernetes-asyncio's generated
  modules load lazily there, as under ``python -m`` (``py+eager``: all of them at start-up).

Both talk to the Go ``hostpathplugin`` (a fresh process and state directory per run, the same
binary), with the same flags: ``--worker-threads`` (default 100, upstream's default),
unthrottled API clients, leader election off, every other flag at its default. Per run: a
namespace of its own, a warm-up claim whose PV is awaited (so start-up is not measured), then
``--volumes`` claims created at once (``--concurrency`` requests in flight), each
pre-annotated with ``volume.kubernetes.io/storage-provisioner`` so kube-controller-manager's
rate does not gate the start (as ``../shared/kube/README.md`` describes). Claim→PV is from the
moment this process sends a claim's POST to the moment its PV arrives on this process's PV
watch. The sidecar's CPU (user + system, /proc) is read when the warm-up is done, when every
PV has arrived, and once its events are written ("settled": two per claim, or none added for
``--settle`` seconds); peak RSS is its ``VmHWM``. Afterwards the sidecar and the driver are
stopped and the run's claims and PVs removed (finalizers stripped), so every run starts from
the same cluster state.

Usage::

    python bench/csi_real.py --volumes 1000 --runs 2
    python bench/csi_real.py --volumes 1000 --runs 1 --peers py --stages /tmp/stages

Prints human-readable lines, then exactly one line of JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
DRIVER = "hostpath.csi.k8s.io"
TOPOLOGY_KEY = "topology.hostpath.csi/node"
STORAGE_CLASS = "bench-hostpath"
ANNOTATION = "volume.kubernetes.io/storage-provisioner"


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def _proc_cpu(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def _proc_status_kb(pid: int, field: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


async def _gather_limited(n: int, limit: int, one: Callable[[int], Awaitable[None]]) -> None:
    semaphore = asyncio.Semaphore(limit)

    async def guarded(i: int) -> None:
        async with semaphore:
            await one(i)

    await asyncio.gather(*(guarded(i) for i in range(n)))


async def _stop(proc: asyncio.subprocess.Process, grace: float = 30.0) -> None:
    if proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), grace)
    except TimeoutError:
        proc.kill()
        await proc.wait()


class PVWatch:
    """This process's watch on PersistentVolumes: the time each claim's PV first arrived."""

    def __init__(self, api: Any) -> None:
        from pyprovlib.kube._resources import PERSISTENT_VOLUMES
        from pyprovlib.kube._rest import ResourceClient

        self.client = ResourceClient(api, PERSISTENT_VOLUMES)
        self.seen: dict[tuple[str, str], float] = {}
        self.changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        listed = await self.client.list()
        version = listed["metadata"]["resourceVersion"]
        self._task = asyncio.create_task(self._run(version))

    async def _run(self, version: str) -> None:
        while True:
            async with self.client.watch(resource_version=version) as stream:
                async for event in stream:
                    obj = event["object"]
                    version = obj["metadata"].get("resourceVersion", version)
                    if event["type"] != "ADDED":
                        continue
                    ref = obj["spec"].get("claimRef") or {}
                    key = (ref.get("namespace", ""), ref.get("name", ""))
                    self.seen.setdefault(key, time.monotonic())
                    self.changed.set()

    async def wait(self, keys: set[tuple[str, str]], limit: float, proc: Any) -> None:
        deadline = time.monotonic() + limit
        while not keys <= self.seen.keys():
            if proc.returncode is not None:
                raise RuntimeError(f"the sidecar exited ({proc.returncode})")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = len(keys - self.seen.keys())
                raise RuntimeError(f"{missing} PVs missing after {limit:.0f}s")
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), min(remaining, 1.0))

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


async def _prepare_cluster(api: Any, node: str) -> None:
    from pyprovlib.kube._resources import CSIDRIVERS, CSINODES, NODES, STORAGE_CLASSES
    from pyprovlib.kube._rest import ResourceClient

    await ResourceClient(api, NODES).patch(node, {"metadata": {"labels": {TOPOLOGY_KEY: node}}})
    await ResourceClient(api, CSIDRIVERS).create(
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "CSIDriver",
            "metadata": {"name": DRIVER},
            "spec": {"attachRequired": True, "podInfoOnMount": True},
        }
    )
    await ResourceClient(api, CSINODES).create(
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "CSINode",
            "metadata": {"name": node},
            "spec": {"drivers": [{"name": DRIVER, "nodeID": node, "topologyKeys": [TOPOLOGY_KEY]}]},
        }
    )
    await ResourceClient(api, STORAGE_CLASSES).create(
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": STORAGE_CLASS},
            "provisioner": DRIVER,
            "reclaimPolicy": "Delete",
            "volumeBindingMode": "Immediate",
        }
    )


def _claim(name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "annotations": {ANNOTATION: DRIVER},
        },
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": STORAGE_CLASS,
            "resources": {"requests": {"storage": "1Mi"}},
        },
    }


async def _start_driver(
    assets: Path, directory: Path, node: str
) -> tuple[asyncio.subprocess.Process, Path]:
    socket = directory / "csi.sock"
    state = directory / "state"
    state.mkdir(parents=True)
    log = (directory / "hostpathplugin.log").open("wb")
    proc = await asyncio.create_subprocess_exec(
        str(assets / "hostpathplugin"),
        f"--drivername={DRIVER}",
        f"--endpoint=unix://{socket}",
        f"--nodeid={node}",
        f"--statedir={state}",
        "--enable-attach=true",
        stdout=log,
        stderr=asyncio.subprocess.STDOUT,
    )
    log.close()
    async with asyncio.timeout(30):
        while not socket.exists():
            if proc.returncode is not None:
                raise RuntimeError("hostpathplugin exited: see " + str(directory))
            await asyncio.sleep(0.05)
    return proc, socket


def _parse_peer(peer: str) -> tuple[str, list[str], str | None]:
    """``go``, or ``py[+VARIANT...][@SRC]``: the kind, the variants (bench/variants.py) and
    another source tree's ``src`` directory to run the Python sidecar from."""
    spec, _, src = peer.partition("@")
    kind, *variants = spec.split("+")
    if kind not in ("go", "py") or (kind == "go" and (variants or src)):
        raise SystemExit(f"unknown peer {peer!r}: go, or py[+VARIANT...][@SRC]")
    return kind, variants, src or None


async def _start_sidecar(
    peer: str, args: argparse.Namespace, kubeconfig: Path, socket: Path, directory: Path, run: int
) -> asyncio.subprocess.Process:
    kind, variants, src = _parse_peer(peer)
    common = [
        f"--kubeconfig={kubeconfig}",
        f"--csi-address=unix://{socket}" if kind == "py" else f"--csi-address={socket}",
        f"--worker-threads={args.worker_threads}",
        "--leader-election=false",
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYPROVLIB_")}
    env["PYTHONUNBUFFERED"] = "1"
    if src:
        env["PYTHONPATH"] = src
    if args.scrape:
        common.append(f"--http-endpoint=127.0.0.1:{_metrics_port(run)}")
    if kind == "go":
        argv = [
            str(args.assets / "csi-provisioner"),
            *common,
            "--kube-api-qps=100000",
            "--kube-api-burst=100000",
            "--v=2",
        ]
    else:
        argv = [sys.executable, str(HERE), "--role", "py-sidecar"]
        if args.stages:
            argv += ["--stages", str(Path(args.stages) / f"run{run}-py.jsonl")]
        for variant in variants:
            argv += ["--variant", variant]
        argv += [
            "--",
            *common,
            "--kube-api-qps=0",
            "--provisioning-finalizer=false",
            "--log-format=json",
            "--log-level=warning",
        ]
    log = (directory / "sidecar.log").open("wb")
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=log, stderr=asyncio.subprocess.STDOUT, env=env
    )
    log.close()
    return proc


async def _events_settled(
    api: Any, namespace: str, args: argparse.Namespace, begin: float
) -> tuple[int, float]:
    """Wait until the run's events are written: two per claim (Provisioning and
    ProvisioningSucceeded; repeats are counted by the API server, not created), or no new one
    for ``--settle`` seconds. Returns their number and when the last count was reached."""
    from pyprovlib.kube._resources import EVENTS
    from pyprovlib.kube._rest import ResourceClient

    events = ResourceClient(api, EVENTS)
    wanted = 2 * (args.volumes + 1)  # the warm-up claim's too
    count, changed = -1, time.monotonic()
    while True:
        listed = await events.list(namespace)
        now = sum(
            e.get("reason") in ("Provisioning", "ProvisioningSucceeded")
            for e in listed.get("items") or []
        )
        if now != count:
            count, changed = now, time.monotonic()
        if count >= wanted or time.monotonic() - changed >= args.settle:
            return count, changed - begin
        await asyncio.sleep(0.5)


async def _cleanup(api: Any, namespace: str) -> None:
    """Remove the run's claims and PVs without a provisioner: strip finalizers, delete."""
    from pyprovlib.kube._errors import is_not_found
    from pyprovlib.kube._resources import NAMESPACES, PERSISTENT_VOLUME_CLAIMS, PERSISTENT_VOLUMES
    from pyprovlib.kube._rest import ResourceClient

    pvs = ResourceClient(api, PERSISTENT_VOLUMES)
    claims = ResourceClient(api, PERSISTENT_VOLUME_CLAIMS)
    mine = [
        pv["metadata"]["name"]
        for pv in (await pvs.list())["items"]
        if (pv["spec"].get("claimRef") or {}).get("namespace") == namespace
    ]
    names = [c["metadata"]["name"] for c in (await claims.list(namespace))["items"]]

    async def strip_pv(i: int) -> None:
        with contextlib.suppress(Exception):
            await pvs.patch(mine[i], {"metadata": {"finalizers": None}})
        with contextlib.suppress(Exception):
            await pvs.delete(mine[i])

    async def strip_claim(i: int) -> None:
        with contextlib.suppress(Exception):
            await claims.patch(names[i], {"metadata": {"finalizers": None}}, namespace=namespace)
        with contextlib.suppress(Exception):
            await claims.delete(names[i], namespace)

    await _gather_limited(len(mine), 32, strip_pv)
    await _gather_limited(len(names), 32, strip_claim)
    try:
        await ResourceClient(api, NAMESPACES).delete(namespace)
    except Exception as err:
        if not is_not_found(err):
            raise


async def run_once(
    peer: str, run: int, args: argparse.Namespace, api: Any, plane: Any, watch: PVWatch
) -> dict[str, Any]:
    from pyprovlib.kube._resources import NAMESPACES, PERSISTENT_VOLUME_CLAIMS
    from pyprovlib.kube._rest import ResourceClient

    node = plane.node_names[0]
    kind = _parse_peer(peer)[0]
    directory = Path(tempfile.mkdtemp(prefix=f"csi-real-{run}-{kind}-", dir=args.workdir))
    namespace = f"bench-{run}-{kind}"
    await ResourceClient(api, NAMESPACES).create(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
    )
    claims = ResourceClient(api, PERSISTENT_VOLUME_CLAIMS)
    driver, socket = await _start_driver(args.assets, directory, node)
    sidecar = await _start_sidecar(peer, args, plane.kubeconfig_path, socket, directory, run)
    try:
        start = time.monotonic()
        await claims.create(_claim("warmup", namespace), namespace)
        await watch.wait({(namespace, "warmup")}, 120.0, sidecar)
        startup = time.monotonic() - start
        await asyncio.sleep(args.quiet)
        spy = None
        if kind == "py" and args.py_spy:
            spy = await asyncio.create_subprocess_exec(
                args.py_spy_command,
                "record",
                "--pid",
                str(sidecar.pid),
                "--rate",
                str(args.py_spy_rate),
                "--format",
                "raw",
                "--output",
                f"{args.py_spy}.run{run}",
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
            )
            await asyncio.sleep(1.0)
        server0 = await _scrape_apiserver(api) if args.scrape else {}
        cpu0 = _proc_cpu(sidecar.pid) or 0.0
        rss_warm = _proc_status_kb(sidecar.pid, "VmRSS") or 0
        sent: dict[str, float] = {}

        async def create(i: int) -> None:
            name = f"claim-{i}"
            sent[name] = time.monotonic()
            await claims.create(_claim(name, namespace), namespace)

        begin = time.monotonic()
        await _gather_limited(args.volumes, args.concurrency, create)
        created = time.monotonic() - begin
        keys = {(namespace, name) for name in sent}
        await watch.wait(keys, args.timeout, sidecar)
        all_pvs = time.monotonic() - begin
        cpu1 = _proc_cpu(sidecar.pid) or 0.0
        scraped: dict[str, Any] = {}
        if args.scrape:
            server1 = await _scrape_apiserver(api)
            scraped = {
                **_histograms(await _scrape_sidecar(run), SIDECAR_SERIES),
                **_histograms_diff(server0, server1),
            }
        events_written, events_s = await _events_settled(api, namespace, args, begin)
        cpu2 = _proc_cpu(sidecar.pid) or 0.0
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            await spy.wait()
        hwm = _proc_status_kb(sidecar.pid, "VmHWM") or 0
        rss_settled = _proc_status_kb(sidecar.pid, "VmRSS") or 0
        latencies = [watch.seen[(namespace, name)] - t for name, t in sent.items()]
        last_claim = max(sent.values())
        after_last = max(watch.seen[k] for k in keys) - last_claim
    finally:
        await _stop(sidecar)
        await _stop(driver)
    await _cleanup(api, namespace)
    stages: dict[str, Any] = {}
    if kind == "py" and args.stages:
        trace = Path(args.stages) / f"run{run}-py.jsonl"
        if trace.exists():
            seen = {name: watch.seen[(namespace, name)] for name in sent}
            stages = _stage_table(trace, sent, seen)
    per = 1000 / args.volumes
    return {
        "peer": peer,
        "run": run,
        "startup_s": round(startup, 2),
        "created_s": round(created, 2),
        "all_pvs_s": round(all_pvs, 2),
        "last_pv_after_last_claim_s": round(after_last, 3),
        "p50_s": round(statistics.median(latencies), 3),
        "p90_s": round(_percentile(latencies, 0.90), 3),
        "p99_s": round(_percentile(latencies, 0.99), 3),
        "max_s": round(max(latencies), 3),
        "cpu_s_per_1000": round((cpu1 - cpu0) * per, 3),
        "cpu_settled_s_per_1000": round((cpu2 - cpu0) * per, 3),
        "events_per_volume": round(events_written / args.volumes, 2),
        "events_settled_s": round(events_s, 2),
        "peak_rss_mb": round(hwm / 1024, 1),
        "rss_before_mb": round(rss_warm / 1024, 1),
        "rss_settled_mb": round(rss_settled / 1024, 1),
        "directory": str(directory),
        "stages": stages,
        "scraped": scraped,
    }


# --------------------------------------------------------------------------------------------
# --scrape: the peers' own histograms (upstream's metric names, which both serve) and the API
# server's, so a stage can be compared between the Go and the Python sidecar
# --------------------------------------------------------------------------------------------

SIDECAR_SERIES = {
    "queue_wait": ("workqueue_queue_duration_seconds", {"name": "claims"}),
    "work": ("workqueue_work_duration_seconds", {"name": "claims"}),
    "create_volume": (
        "csi_sidecar_operations_seconds",
        {"method_name": "/csi.v1.Controller/CreateVolume"},
    ),
}
APISERVER_SERIES = {
    f"apiserver_post_{resource}": (
        "apiserver_request_duration_seconds",
        {"verb": "POST", "resource": resource},
    )
    for resource in ("persistentvolumes", "persistentvolumeclaims", "events")
}
Buckets = dict[str, tuple[list[tuple[float, float]], float, float]]


def _metrics_port(run: int) -> int:
    return 18_080 + run % 100


async def _scrape_sidecar(run: int) -> str:
    import aiohttp

    url = f"http://127.0.0.1:{_metrics_port(run)}/metrics"
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return await response.text()


async def _scrape_apiserver(api: Any) -> Buckets:
    from pyprovlib.kube._config import send_request

    response = await send_request(api, "GET", "/metrics")
    try:
        text = await response.text()
    finally:
        response.release()
    return _buckets(text, APISERVER_SERIES)


def _buckets(text: str, series: dict[str, tuple[str, dict[str, str]]]) -> Buckets:
    """Per named series: the cumulative buckets (upper bound, count), the sum and the count,
    added up over the label sets that match (e.g. every ``code`` of the API server)."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = {metric for metric, _ in series.values()}

    def name(line: str) -> str:
        metric = line.split("{", 1)[0].split(" ", 1)[0]
        for suffix in ("_bucket", "_sum", "_count"):
            metric = metric.removesuffix(suffix)
        return metric

    lines = [line for line in text.splitlines() if line.startswith("# ") or name(line) in wanted]
    out: Buckets = {}
    for family in text_string_to_metric_families("\n".join(lines) + "\n"):
        for key, (metric, labels) in series.items():
            if family.name != metric.removesuffix("_seconds") and family.name != metric:
                continue
            buckets: dict[float, float] = {}
            total = count = 0.0
            for sample in family.samples:
                if any(sample.labels.get(k) != v for k, v in labels.items()):
                    continue
                if sample.name.endswith("_bucket"):
                    bound = float(sample.labels["le"])
                    buckets[bound] = buckets.get(bound, 0.0) + sample.value
                elif sample.name.endswith("_sum"):
                    total += sample.value
                elif sample.name.endswith("_count"):
                    count += sample.value
            if count:
                out[key] = (sorted(buckets.items()), total, count)
    return out


def _histograms(text: str, series: dict[str, tuple[str, dict[str, str]]]) -> dict[str, Any]:
    return {key: _summary(*value) for key, value in _buckets(text, series).items()}


def _histograms_diff(before: Buckets, after: Buckets) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, (buckets, total, count) in after.items():
        old_buckets, old_total, old_count = before.get(key, ([], 0.0, 0.0))
        old = dict(old_buckets)
        diff = [(bound, value - old.get(bound, 0.0)) for bound, value in buckets]
        if count - old_count > 0:
            out[key] = _summary(diff, total - old_total, count - old_count)
    return out


def _quantile(buckets: list[tuple[float, float]], q: float) -> float:
    """Prometheus' ``histogram_quantile``: linear within the bucket the rank falls in."""
    total = buckets[-1][1]
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if bound == float("inf"):
                return lower_bound
            width = count - lower_count
            share = (rank - lower_count) / width if width else 0.0
            return lower_bound + (bound - lower_bound) * share
        lower_bound, lower_count = bound, count
    return lower_bound


def _summary(buckets: list[tuple[float, float]], total: float, count: float) -> dict[str, float]:
    return {
        "n": count,
        "mean_s": round(total / count, 4),
        "p50_s": round(_quantile(buckets, 0.5), 4),
        "p99_s": round(_quantile(buckets, 0.99), 4),
    }


STAGES = (
    "event",
    "worker",
    "provision",
    "csi_sent",
    "csi_answered",
    "pv_sent",
    "pv_answered",
    "pv_cached",
)


def _stage_table(
    trace: Path, sent: dict[str, float], seen: dict[str, float]
) -> dict[str, dict[str, float]]:
    """Per stage: p50/p99 of its time after the claim's POST, and of the step from the stage
    before it (the first occurrence of each stage per claim)."""
    first: dict[str, dict[str, float]] = {}
    workers: dict[str, int] = {}
    for line in trace.read_text().splitlines():
        record = json.loads(line)
        name = record["name"]
        if name not in sent:
            continue
        first.setdefault(name, {}).setdefault(record["stage"], record["t"])
        if record["stage"] == "worker":
            workers[name] = workers.get(name, 0) + 1
    table: dict[str, dict[str, float]] = {}
    previous = "sent"
    for stage in (*STAGES, "bench_seen"):
        offsets: list[float] = []
        steps: list[float] = []
        for name, t0 in sent.items():
            marks = {"sent": t0, **first.get(name, {}), "bench_seen": seen[name]}
            if stage in marks:
                offsets.append(marks[stage] - t0)
                if previous in marks:
                    steps.append(marks[stage] - marks[previous])
        if not offsets:
            continue
        table[stage] = {
            "claims": len(offsets),
            "p50_s": round(statistics.median(offsets), 4),
            "p99_s": round(_percentile(offsets, 0.99), 4),
            "step_p50_s": round(statistics.median(steps), 4) if steps else float("nan"),
            "step_p99_s": round(_percentile(steps, 0.99), 4) if steps else float("nan"),
        }
        previous = stage
    counts = list(workers.values()) or [0]
    table["worker_runs_per_claim"] = {"mean": round(statistics.mean(counts), 2), "max": max(counts)}
    return table


def _order(peers: list[str], runs: int) -> list[str]:
    order: list[str] = []
    for i in range(runs):
        order += peers if i % 2 == 0 else list(reversed(peers))
    return order


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    from pyprovlib.kube._config import ClientSettings, new_client
    from pyprovlib.testing._controlplane import ControlPlane

    async with ControlPlane.start(
        args.assets, controller_manager=True, scheduler=False, nodes=1, snapshot_crds=False
    ) as plane:
        api = await new_client(
            ClientSettings(kubeconfig=str(plane.kubeconfig_path), qps=0, burst=0)
        )
        async with api:
            await _prepare_cluster(api, plane.node_names[0])
            watch = PVWatch(api)
            await watch.start()
            results = []
            try:
                for run, peer in enumerate(_order(args.peers, args.runs)):
                    result = await run_once(peer, run, args, api, plane, watch)
                    print(
                        f"run {run} {peer}: p50 {result['p50_s']:.3f}s p99 {result['p99_s']:.3f}s "
                        f"(max {result['max_s']:.3f}s), every PV {result['all_pvs_s']:.2f}s "
                        f"after the first claim ({result['last_pv_after_last_claim_s']:.2f}s after "
                        f"the last; claims created in {result['created_s']:.2f}s), "
                        f"CPU {result['cpu_s_per_1000']:.2f}s per 1000 "
                        f"({result['cpu_settled_s_per_1000']:.2f}s settled, "
                        f"{result['events_per_volume']:.2f} events per volume by "
                        f"{result['events_settled_s']:.1f}s), "
                        f"peak RSS {result['peak_rss_mb']:.1f} MB "
                        f"({result['rss_before_mb']:.1f} before the claims, "
                        f"{result['rss_settled_mb']:.1f} settled)",
                        flush=True,
                    )
                    results.append(result)
                    for stage, figures in result["stages"].items():
                        print(f"    {stage:>14}: {figures}", flush=True)
                    for series, figures in result["scraped"].items():
                        print(f"    {series}: {figures}", flush=True)
            finally:
                await watch.close()
    summary: dict[str, Any] = {}
    for peer in args.peers:
        mine = [r for r in results if r["peer"] == peer]
        summary[peer] = {
            key: statistics.median(r[key] for r in mine)
            for key in (
                "p50_s",
                "p99_s",
                "all_pvs_s",
                "last_pv_after_last_claim_s",
                "cpu_s_per_1000",
                "cpu_settled_s_per_1000",
                "events_per_volume",
                "peak_rss_mb",
                "rss_before_mb",
                "rss_settled_mb",
            )
        }
    return {
        "bench": "csi_real",
        "volumes": args.volumes,
        "worker_threads": args.worker_threads,
        "concurrency": args.concurrency,
        "median": summary,
        "runs": results,
    }


# --------------------------------------------------------------------------------------------
# The Python sidecar, optionally with per-stage timestamps
# --------------------------------------------------------------------------------------------


def run_py_sidecar(stages: str | None, variants: list[str], argv: list[str]) -> int:
    # As `python -m pyprovlib.csi.provisioner` does before anything imports kubernetes-asyncio
    # (the first call in its __main__): its generated API and model modules
    # load on first use. Started as a script, the sidecar would otherwise import all ~830 of
    # them (~35 MB) and measure a process no user runs; the `eager` variant measures that one.
    if "eager" not in variants:
        import pyprovlib

        pyprovlib.enable_lazy_kubernetes_imports()
    if variants:
        import variants as changes  # bench/variants.py

        changes.install(variants)
    if stages:
        import stage_trace  # bench/stage_trace.py

        stage_trace.install(stages)
    from pyprovlib.csi.provisioner import main as sidecar_main

    return sidecar_main(argv)


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--role", choices=["bench", "py-sidecar"], default="bench")
    p.add_argument(
        "--assets",
        type=Path,
        default=Path(os.environ.get("PYPROVLIB_KUBE_ASSETS") or "/opt/kube-assets"),
    )
    p.add_argument("--volumes", type=int, default=1000)
    p.add_argument("--runs", type=int, default=2, help="runs per peer, interleaved")
    p.add_argument(
        "--peers",
        default="go,py",
        help="comma-separated: go, or py[+VARIANT...][@SRC] (bench/variants.py; SRC: another "
        "tree's src directory, e.g. a `git worktree` of the commit to compare with)",
    )
    p.add_argument("--worker-threads", type=int, default=100)
    p.add_argument("--concurrency", type=int, default=64, help="claim POSTs in flight")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--quiet", type=float, default=3.0, help="seconds after the warm-up")
    p.add_argument(
        "--settle",
        type=float,
        default=5.0,
        help="after the last PV, wait for the run's events until none was added for this long",
    )
    p.add_argument("--variant", action="append", default=[], help=argparse.SUPPRESS)
    p.add_argument("--stages", help="py: write per-stage timestamps (JSON lines) into this dir")
    p.add_argument(
        "--py-spy", metavar="FILE", help="py: sample the sidecar (raw stacks, FILE.runN)"
    )
    p.add_argument("--py-spy-command", default="py-spy")
    p.add_argument("--py-spy-rate", type=int, default=250)
    p.add_argument(
        "--scrape",
        action="store_true",
        help="both peers: serve --http-endpoint and read, when every PV is there, the "
        "sidecar's own histograms (claims queue wait and work, CreateVolume) and the API "
        "server's request latencies for the run (PV, claim and Event POSTs)",
    )
    p.add_argument("--workdir", help="where the per-run directories (logs, driver state) go")
    p.add_argument("sidecar_args", nargs="*")
    args = p.parse_args()
    if args.role == "py-sidecar":
        raise SystemExit(run_py_sidecar(args.stages, args.variant, args.sidecar_args))
    args.peers = [x for x in args.peers.split(",") if x]
    if args.stages:
        Path(args.stages).mkdir(parents=True, exist_ok=True)
    result = asyncio.run(bench(args))
    print(json.dumps(result))


if __name__ == "__main__":
    main()

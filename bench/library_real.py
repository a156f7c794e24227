"""The library path (ProvisionController) against sig-storage-lib-external-provisioner's Go
hostpath example on a real control plane, provisioning and deletion measured apart.

One run of this script starts etcd + kube-apiserver + kube-controller-manager from an assets
directory (:class:`pyprovlib.testing.ControlPlane`, ``--assets``, default
``$PYPROVLIB_KUBE_ASSETS`` or ``/opt/kube-assets``), then measures, interleaved (go, py, py,
go, ...), the two peers on the same work:

- ``go``: ``go-hostpath-provisioner`` from the assets directory (sig-storage-lib v13's hostpath
  example: directories under /tmp/hostpath-provisioner/, ``hostPath`` PVs);
- ``py``: ``python -m pyprovlib.examples.nfs`` on a local "export" (a directory of the run;
  ``nfs`` PVs naming 127.0.0.1), started through this script's ``--role py-nfs`` so bench
  variants (``py+NAME``, bench/variants.py) can be installed first; kubernetes-asyncio's
  modules load lazily, as under ``python -m``. ``py@SRC`` runs another tree's ``src``;
- ``bare``: ``bare_provisioner.py``, the same work for the same class through
  kubernetes-asyncio alone (two watches, the PV POST, the two Events, the PV DELETE, the
  directory made and archived in a worker thread), without anything a controller library
  adds: what the libraries cost on this very work, paced as the control plane paces it.

All with ``--threadiness`` workers (default 32), unthrottled API clients, leader election off,
each with a client certificate of its own (user ``bench-provisioner``), so the API server's
audit log (level Metadata for that user only) counts the requests each phase makes, by verb
and resource. Per run: a namespace of its own, a warm-up claim whose PV is awaited, then

1. **provisioning**: ``--volumes`` claims created at once (``--concurrency`` POSTs in flight),
   pre-annotated with ``volume.kubernetes.io/storage-provisioner``; the phase ends when every
   PV is there, every claim Bound by kube-controller-manager and the two events per claim
   written (or none added for ``--settle`` s), plus ``--quiet`` s;
2. **deletion**: every claim deleted at once; kube-controller-manager releases the PVs, the
   provisioner removes the directories and DELETEs the PVs; the phase ends when every PV is
   gone, plus ``--quiet`` s.

Per phase: the provisioner's CPU (user + system from /proc) per volume and the requests it
made per volume, by verb; claim→PV p50/p99 (the claim's POST sent → its PV on this process's
watch) and claim DELETE → PV gone; peak RSS (``VmHWM``). Beside them, the **floor**: what the
calls of each phase cost through kubernetes-asyncio alone (``ApiClient.request``, nothing of
pyprovlib; ``--concurrency-floor`` in flight, this process's event-loop thread's CPU), measured
in the same session before each round: provisioning = 1 PV POST + 2 Event POSTs + the watch
lines; deletion = 1 PV DELETE + the watch lines.

Usage::

    python bench/library_real.py --volumes 1000 --runs 3
    python bench/library_real.py --volumes 1000 --runs 2 --peers py,py@/tmp/before/src
    python bench/library_real.py --volumes 1000 --runs 1 --peers py --profile /tmp/prof

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
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent))

import csi_real  # noqa: E402 - bench/csi_real.py: /proc readers, process helpers
import library_floor  # noqa: E402 - bench/library_floor.py: the floor's measuring loop

ANNOTATION = "volume.kubernetes.io/storage-provisioner"
# The bare peer (bare_provisioner.py) does the NFS example's work for the NFS example's class.
PROVISIONER = {"go": "example.com/hostpath", "py": "pyprovlib.io/nfs", "bare": "pyprovlib.io/nfs"}
CLASS = {"go": "bench-go-hostpath", "py": "bench-py-nfs", "bare": "bench-py-nfs"}
USER = "bench-provisioner"
EVENT_REASONS = ("Provisioning", "ProvisioningSucceeded")
AUDIT_POLICY = f"""\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived", "ResponseStarted"]
rules:
- level: Metadata
  users: ["{USER}"]
- level: None
"""


class Volumes:
    """This process's watch on PersistentVolumes: per claim, when its PV arrived, when it was
    Bound and when it was deleted."""

    def __init__(self, api: Any) -> None:
        from pyprovlib.kube._resources import PERSISTENT_VOLUMES
        from pyprovlib.kube._rest import ResourceClient

        self.client = ResourceClient(api, PERSISTENT_VOLUMES)
        self.added: dict[tuple[str, str], float] = {}
        self.bound: dict[tuple[str, str], float] = {}
        self.deleted: dict[tuple[str, str], float] = {}
        self.changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        listed = await self.client.list()
        self._task = asyncio.create_task(self._run(listed["metadata"]["resourceVersion"]))

    async def _run(self, version: str) -> None:
        while True:
            async with self.client.watch(resource_version=version) as stream:
                async for event in stream:
                    obj = event["object"]
                    version = obj["metadata"].get("resourceVersion", version)
                    ref = (obj.get("spec") or {}).get("claimRef") or {}
                    key = (ref.get("namespace", ""), ref.get("name", ""))
                    now = time.monotonic()
                    if event["type"] == "ADDED":
                        self.added.setdefault(key, now)
                    if event["type"] == "DELETED":
                        self.deleted.setdefault(key, now)
                    elif (obj.get("status") or {}).get("phase") == "Bound":
                        self.bound.setdefault(key, now)
                    self.changed.set()

    async def wait(
        self,
        seen: dict[tuple[str, str], float],
        keys: set[tuple[str, str]],
        limit: float,
        proc: Any,
    ) -> None:
        deadline = time.monotonic() + limit
        while not keys <= seen.keys():
            if proc.returncode is not None:
                raise RuntimeError(f"the provisioner exited ({proc.returncode})")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RuntimeError(
                    f"{len(keys - seen.keys())} of {len(keys)} missing after {limit:.0f}s"
                )
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), min(remaining, 1.0))

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


async def _prepare_cluster(api: Any) -> None:
    from pyprovlib.kube._resources import STORAGE_CLASSES
    from pyprovlib.kube._rest import ResourceClient

    for kind in ("go", "py"):  # the bare peer uses py's class
        await ResourceClient(api, STORAGE_CLASSES).create(
            {
                "apiVersion": "storage.k8s.io/v1",
                "kind": "StorageClass",
                "metadata": {"name": CLASS[kind]},
                "provisioner": PROVISIONER[kind],
                "reclaimPolicy": "Delete",
                "volumeBindingMode": "Immediate",
            }
        )


def _claim(name: str, namespace: str, kind: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "annotations": {ANNOTATION: PROVISIONER[kind]},
        },
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": CLASS[kind],
            "resources": {"requests": {"storage": "1Mi"}},
        },
    }


def _write_kubeconfig(plane: Any, directory: Path) -> Path:
    import yaml

    cert, key = plane.issue_client_certificate(USER, USER, "system:masters")
    path = directory / "provisioner.kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "bench",
                        "cluster": {
                            "server": plane.url,
                            "certificate-authority": str(plane.directory / "ca.crt"),
                        },
                    }
                ],
                "users": [
                    {
                        "name": USER,
                        "user": {"client-certificate": str(cert), "client-key": str(key)},
                    }
                ],
                "contexts": [{"name": "bench", "context": {"cluster": "bench", "user": USER}}],
                "current-context": "bench",
            }
        )
    )
    return path


def _parse_peer(peer: str) -> tuple[str, list[str], str | None]:
    spec, _, src = peer.partition("@")
    kind, *variants = spec.split("+")
    if kind not in ("go", "py", "bare") or (kind != "py" and (variants or src)):
        raise SystemExit(f"unknown peer {peer!r}: go, bare, or py[+VARIANT...][@SRC]")
    return kind, variants, src or None


async def _start_provisioner(
    peer: str, args: argparse.Namespace, kubeconfig: Path, directory: Path, node: str
) -> asyncio.subprocess.Process:
    kind, variants, src = _parse_peer(peer)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYPROVLIB_")}
    env["PYTHONUNBUFFERED"] = "1"
    if src:
        env["PYTHONPATH"] = src
    if kind == "go":
        env["NODE_NAME"] = node
        argv = [
            str(args.assets / "go-hostpath-provisioner"),
            f"--kubeconfig={kubeconfig}",
            f"--threadiness={args.threadiness}",
            "--leader-election=false",
            "--kube-api-qps=100000",
            "--kube-api-burst=100000",
        ]
    elif kind == "bare":
        export = directory / "export"
        export.mkdir()
        argv = [
            sys.executable,
            str(HERE.parent / "bare_provisioner.py"),
            f"--kubeconfig={kubeconfig}",
            f"--export={export}",
            f"--threadiness={args.threadiness}",
        ]
    else:
        export = directory / "export"
        export.mkdir()
        argv = [sys.executable, str(HERE), "--role", "py-nfs"]
        for variant in variants:
            argv += ["--variant", variant]
        argv += [
            "--",
            f"--kubeconfig={kubeconfig}",
            f"--worker-threads={args.threadiness}",
            "--leader-election=false",
            "--kube-api-qps=0",
            "--nfs-server=127.0.0.1",
            "--nfs-path=/export",
            f"--nfs-mount-path={export}",
            "--log-format=json",
            "--log-level=warning",
        ]
    log = (directory / "provisioner.log").open("wb")
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=log, stderr=asyncio.subprocess.STDOUT, env=env
    )
    log.close()
    return proc


class Audit:
    """The provisioner's requests, from the API server's audit log (its user only)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def offset(self) -> int:
        try:
            return self.path.stat().st_size
        except FileNotFoundError:
            return 0

    def count(self, start: int, end: int) -> Counter[str]:
        counts: Counter[str] = Counter()
        with self.path.open("rb") as f:
            f.seek(start)
            data = f.read(end - start)
        for line in data.splitlines():
            entry = json.loads(line)
            ref = entry.get("objectRef") or {}
            resource = ref.get("resource", entry.get("requestURI", "?"))
            if ref.get("subresource"):
                resource += "/" + ref["subresource"]
            counts[f"{entry['verb']} {resource}"] += 1
        return counts


async def _events_settled(api: Any, namespace: str, wanted: int, settle: float) -> int:
    from pyprovlib.kube._resources import EVENTS
    from pyprovlib.kube._rest import ResourceClient

    events = ResourceClient(api, EVENTS)
    count, changed = -1, time.monotonic()
    while True:
        listed = await events.list(namespace)
        now = sum(e.get("reason") in EVENT_REASONS for e in listed.get("items") or [])
        if now != count:
            count, changed = now, time.monotonic()
        if count >= wanted or time.monotonic() - changed >= settle:
            return count
        await asyncio.sleep(0.5)


async def _profile_start(args: argparse.Namespace, pid: int, name: str) -> Any:
    if not args.profile:
        return None
    return await asyncio.create_subprocess_exec(
        args.py_spy_command,
        "record",
        "--pid",
        str(pid),
        "--rate",
        str(args.py_spy_rate),
        "--format",
        "raw",
        "--output",
        f"{args.profile}.{name}",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )


async def _profile_stop(spy: Any) -> None:
    if spy is not None:
        spy.send_signal(signal.SIGINT)
        await spy.wait()


def _per_volume(counts: Counter[str], volumes: int) -> dict[str, float]:
    return {k: round(v / volumes, 3) for k, v in sorted(counts.items())}


async def run_once(
    peer: str,
    run: int,
    args: argparse.Namespace,
    api: Any,
    plane: Any,
    watch: Volumes,
    audit: Audit,
) -> dict[str, Any]:
    from pyprovlib.kube._resources import NAMESPACES, PERSISTENT_VOLUME_CLAIMS
    from pyprovlib.kube._rest import ResourceClient

    node = plane.node_names[0]
    kind = _parse_peer(peer)[0]
    directory = Path(tempfile.mkdtemp(prefix=f"library-real-{run}-{kind}-", dir=args.workdir))
    namespace = f"lib-{run}-{kind}"
    await ResourceClient(api, NAMESPACES).create(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
    )
    claims = ResourceClient(api, PERSISTENT_VOLUME_CLAIMS)
    kubeconfig = _write_kubeconfig(plane, directory)
    proc = await _start_provisioner(peer, args, kubeconfig, directory, node)
    pid = proc.pid
    n = args.volumes
    try:
        await claims.create(_claim("warmup", namespace, kind), namespace)
        await watch.wait(watch.bound, {(namespace, "warmup")}, 120.0, proc)
        await asyncio.sleep(args.quiet)
        rss_idle = csi_real._proc_status_kb(pid, "VmRSS") or 0

        # -- provisioning ---------------------------------------------------------------------
        spy = await _profile_start(args, pid, f"run{run}-provision")
        a0 = audit.offset()
        cpu0 = csi_real._proc_cpu(pid) or 0.0
        sent: dict[str, float] = {}

        async def create(i: int) -> None:
            name = f"claim-{i}"
            sent[name] = time.monotonic()
            await claims.create(_claim(name, namespace, kind), namespace)

        begin = time.monotonic()
        await csi_real._gather_limited(n, args.concurrency, create)
        keys = {(namespace, name) for name in sent}
        await watch.wait(watch.added, keys, args.timeout, proc)
        all_pvs = time.monotonic() - begin
        cpu_pvs = csi_real._proc_cpu(pid) or 0.0
        await watch.wait(watch.bound, keys, args.timeout, proc)
        events = await _events_settled(api, namespace, 2 * (n + 1), args.settle)
        await asyncio.sleep(args.quiet)
        cpu1 = csi_real._proc_cpu(pid) or 0.0
        a1 = audit.offset()
        await _profile_stop(spy)
        hwm_provision = csi_real._proc_status_kb(pid, "VmHWM") or 0

        # -- deletion -------------------------------------------------------------------------
        spy = await _profile_start(args, pid, f"run{run}-delete")
        cpu2 = csi_real._proc_cpu(pid) or 0.0
        deleted_at: dict[str, float] = {}

        async def delete(i: int) -> None:
            name = f"claim-{i}"
            deleted_at[name] = time.monotonic()
            await claims.delete(name, namespace)

        begin = time.monotonic()
        await csi_real._gather_limited(n, args.concurrency, delete)
        await watch.wait(watch.deleted, keys, args.timeout, proc)
        all_gone = time.monotonic() - begin
        await asyncio.sleep(args.quiet)
        cpu3 = csi_real._proc_cpu(pid) or 0.0
        a2 = audit.offset()
        await _profile_stop(spy)
        hwm = csi_real._proc_status_kb(pid, "VmHWM") or 0
        rss_end = csi_real._proc_status_kb(pid, "VmRSS") or 0
    finally:
        await csi_real._stop(proc)
    await csi_real._cleanup(api, namespace)
    latencies = [watch.added[(namespace, k)] - t for k, t in sent.items()]
    gone = [watch.deleted[(namespace, k)] - t for k, t in deleted_at.items()]
    provision_requests = audit.count(a0, a1)
    delete_requests = audit.count(a1, a2)
    per = 1000 / n
    return {
        "peer": peer,
        "run": run,
        "all_pvs_s": round(all_pvs, 2),
        "p50_s": round(statistics.median(latencies), 3),
        "p99_s": round(csi_real._percentile(latencies, 0.99), 3),
        "delete_p50_s": round(statistics.median(gone), 3),
        "delete_p99_s": round(csi_real._percentile(gone, 0.99), 3),
        "all_gone_s": round(all_gone, 2),
        "cpu_to_last_pv_s_per_1000": round((cpu_pvs - cpu0) * per, 3),
        "cpu_provision_s_per_1000": round((cpu1 - cpu0) * per, 3),
        "cpu_delete_s_per_1000": round((cpu3 - cpu2) * per, 3),
        "events_per_volume": round(events / (n + 1), 2),
        "provision_requests_per_volume": _per_volume(provision_requests, n),
        "delete_requests_per_volume": _per_volume(delete_requests, n),
        "peak_rss_mb": round(hwm / 1024, 1),
        "peak_rss_provision_mb": round(hwm_provision / 1024, 1),
        "rss_idle_mb": round(rss_idle / 1024, 1),
        "rss_end_mb": round(rss_end / 1024, 1),
        "directory": str(directory),
    }


# --------------------------------------------------------------------------------------------
# The floor: the phases' calls through kubernetes-asyncio alone, in this process
# --------------------------------------------------------------------------------------------


def _nfs_pv(name: str, claim: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": name,
            "annotations": {"pv.kubernetes.io/provisioned-by": PROVISIONER["py"]},
        },
        "spec": {
            "capacity": {"storage": "1Mi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": CLASS["py"],
            "volumeMode": "Filesystem",
            "claimRef": {
                "kind": "PersistentVolumeClaim",
                "apiVersion": "v1",
                "namespace": library_floor.NAMESPACE,
                "name": claim,
                "uid": "6f1c2e8a-0000-4000-8000-000000000001",
                "resourceVersion": "12345",
            },
            "nfs": {"server": "127.0.0.1", "path": f"/export/{name}"},
        },
    }


async def floor(args: argparse.Namespace, kubeconfig: Path, round_: int) -> dict[str, float]:
    """CPU µs per call of a PV POST, an Event POST, a PV DELETE and a watch line's decode,
    through ``ApiClient.request`` with nothing of pyprovlib around it."""
    from kubernetes_asyncio import config
    from kubernetes_asyncio.client import ApiClient, Configuration

    from pyprovlib.kube._config import use_resolved_proxy

    configuration = Configuration()
    await config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    calls, concurrency = args.floor_calls, args.concurrency_floor
    async with ApiClient(configuration) as api:
        use_resolved_proxy(api)

        async def request(method: str, path: str, body: Any = None) -> Any:
            headers = {"Accept": "application/json", "Content-Type": "application/json"}
            response = await api.request(
                method,
                configuration.host + path,
                query_params=[],
                headers=headers,
                body=body,
                _preload_content=False,
            )
            try:
                data = await response.read()
                if response.status >= 400:
                    raise RuntimeError(f"{method} {path}: {response.status} {data[:200]!r}")
                return json.loads(data)
            finally:
                response.release()

        ns = library_floor.NAMESPACE
        with contextlib.suppress(RuntimeError):
            await request(
                "POST",
                "/api/v1/namespaces",
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
            )
        prefix = f"floor-{round_}-"

        async def post_pv(i: int) -> None:
            await request("POST", "/api/v1/persistentvolumes", _nfs_pv(f"{prefix}{i}", f"c{i}"))

        async def post_event(i: int) -> None:
            await request(
                "POST", f"/api/v1/namespaces/{ns}/events", library_floor._event(round_ * calls + i)
            )

        async def delete_pv(i: int) -> None:
            await request("DELETE", f"/api/v1/persistentvolumes/{prefix}{i}")

        pv_post = (await library_floor._measure(calls, concurrency, post_pv))[0]
        event_post = (await library_floor._measure(calls, concurrency, post_event))[0]
        pv_delete = (await library_floor._measure(calls, concurrency, delete_pv))[0]
        claim = await request(
            "POST",
            f"/api/v1/namespaces/{ns}/persistentvolumeclaims",
            _claim(f"sample-{round_}", ns, "py"),
        )
        line = json.dumps({"type": "MODIFIED", "object": claim}).encode()
        cpu0 = library_floor._cpu()
        for _ in range(calls * 5):
            json.loads(line)
        decode = (library_floor._cpu() - cpu0) / (calls * 5) * 1e6
    return {
        "pv_post": pv_post,
        "event_post": event_post,
        "pv_delete": pv_delete,
        "watch_line": decode,
    }


def _floor_per_volume(f: dict[str, float], watch_lines: int) -> tuple[float, float]:
    """CPU s per 1,000 volumes: provisioning (PV POST + 2 Event POSTs + watch lines) and
    deletion (PV DELETE + watch lines)."""
    provision = f["pv_post"] + 2 * f["event_post"] + watch_lines * f["watch_line"]
    delete = f["pv_delete"] + watch_lines * f["watch_line"]
    return provision / 1000, delete / 1000


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    from pyprovlib.kube._config import ClientSettings, new_client
    from pyprovlib.testing._controlplane import ControlPlane

    work = Path(tempfile.mkdtemp(prefix="library-real-", dir=args.workdir))
    (work / "audit-policy.yaml").write_text(AUDIT_POLICY)
    audit = Audit(work / "audit.log")
    async with ControlPlane.start(
        args.assets,
        controller_manager=True,
        scheduler=False,
        nodes=1,
        snapshot_crds=False,
        apiserver_args=[
            f"--audit-policy-file={work / 'audit-policy.yaml'}",
            f"--audit-log-path={audit.path}",
            "--audit-log-maxsize=0",
            "--audit-log-mode=blocking",
        ],
        controller_manager_args=(
            [f"--kube-api-qps={args.kcm_qps}", f"--kube-api-burst={2 * args.kcm_qps}"]
            if args.kcm_qps
            else []
        ),
    ) as plane:
        api = await new_client(
            ClientSettings(kubeconfig=str(plane.kubeconfig_path), qps=0, burst=0)
        )
        async with api:
            await _prepare_cluster(api)
            watch = Volumes(api)
            await watch.start()
            results: list[dict[str, Any]] = []
            floors: list[dict[str, float]] = []
            order = csi_real._order(args.peers, args.runs)
            try:
                for run, peer in enumerate(order):
                    if args.floor_calls and run % len(args.peers) == 0:
                        # Without this process's PV watch, whose decoding of the floor's own
                        # PVs would count in the floor.
                        await watch.close()
                        f = await floor(args, plane.kubeconfig_path, run)
                        watch = Volumes(api)
                        await watch.start()
                        floors.append(f)
                        print(
                            "floor: " + ", ".join(f"{k} {v:.0f} CPU µs" for k, v in f.items()),
                            flush=True,
                        )
                    result = await run_once(peer, run, args, api, plane, watch, audit)
                    results.append(result)
                    print(
                        f"run {run} {peer}: claim→PV p50 {result['p50_s']:.3f}s p99 "
                        f"{result['p99_s']:.3f}s (every PV {result['all_pvs_s']:.2f}s); CPU per "
                        f"1000: to the last PV {result['cpu_to_last_pv_s_per_1000']:.2f}s, "
                        f"provisioning {result['cpu_provision_s_per_1000']:.2f}s, deletion "
                        f"{result['cpu_delete_s_per_1000']:.2f}s (every PV gone "
                        f"{result['all_gone_s']:.2f}s, p99 {result['delete_p99_s']:.3f}s); "
                        f"peak RSS {result['peak_rss_mb']:.1f} MB (idle "
                        f"{result['rss_idle_mb']:.1f}); events/volume "
                        f"{result['events_per_volume']}",
                        flush=True,
                    )
                    for phase in ("provision", "delete"):
                        print(
                            f"    {phase} requests/volume: {result[phase + '_requests_per_volume']}"
                        )
            finally:
                await watch.close()
    keys = (
        "p50_s",
        "p99_s",
        "all_pvs_s",
        "delete_p50_s",
        "delete_p99_s",
        "all_gone_s",
        "cpu_to_last_pv_s_per_1000",
        "cpu_provision_s_per_1000",
        "cpu_delete_s_per_1000",
        "peak_rss_mb",
        "rss_idle_mb",
    )
    summary: dict[str, Any] = {}
    for peer in args.peers:
        mine = [r for r in results if r["peer"] == peer]
        summary[peer] = {key: statistics.median(r[key] for r in mine) for key in keys}
        summary[peer]["provision_requests_per_volume"] = mine[-1]["provision_requests_per_volume"]
        summary[peer]["delete_requests_per_volume"] = mine[-1]["delete_requests_per_volume"]
    floor_summary: dict[str, Any] = {}
    if floors:
        med = {k: statistics.median(f[k] for f in floors) for k in floors[0]}
        prov, dele = _floor_per_volume(med, args.watch_lines)
        floor_summary = {
            "calls_cpu_us": {k: round(v, 1) for k, v in med.items()},
            "provision_s_per_1000": round(prov, 3),
            "delete_s_per_1000": round(dele, 3),
        }
    return {
        "bench": "library_real",
        "volumes": args.volumes,
        "threadiness": args.threadiness,
        "concurrency": args.concurrency,
        "floor": floor_summary,
        "median": summary,
        "runs": results,
    }


def run_py_nfs(variants: list[str], argv: list[str]) -> int:
    # As `python -m pyprovlib.examples.nfs` does: kubernetes-asyncio's generated modules load
    # on first use (see csi_real.run_py_sidecar).
    import pyprovlib

    pyprovlib.enable_lazy_kubernetes_imports()
    if variants:
        import variants as changes  # bench/variants.py

        changes.install(variants)
    try:  # the module's name since issue 29 made the example's modules private
        from pyprovlib.examples.nfs._cli import main as nfs_main
    except ModuleNotFoundError:  # a tree from before (py@SRC)
        from pyprovlib.examples.nfs.cli import main as nfs_main  # type: ignore[no-redef]

    return nfs_main(argv)


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--role", choices=["bench", "py-nfs"], default="bench")
    p.add_argument(
        "--assets",
        type=Path,
        default=Path(os.environ.get("PYPROVLIB_KUBE_ASSETS") or "/opt/kube-assets"),
    )
    p.add_argument("--volumes", type=int, default=1000)
    p.add_argument("--runs", type=int, default=3, help="runs per peer, interleaved")
    p.add_argument(
        "--peers",
        default="go,py",
        help="comma-separated: go, bare (bare_provisioner.py), or py[+VARIANT...][@SRC]",
    )
    p.add_argument("--threadiness", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=64, help="claim POSTs/DELETEs in flight")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--quiet", type=float, default=2.0, help="seconds after each phase")
    p.add_argument("--settle", type=float, default=5.0, help="events: none added for this long")
    p.add_argument(
        "--kcm-qps",
        type=int,
        default=500,
        help="kube-controller-manager's --kube-api-qps (burst twice that; 0: its default 20, "
        "at which binding 1,000 claims and releasing their PVs take minutes each)",
    )
    p.add_argument("--floor-calls", type=int, default=1000, help="calls per floor round (0: none)")
    p.add_argument("--concurrency-floor", type=int, default=32)
    p.add_argument(
        "--watch-lines",
        type=int,
        default=3,
        help="watch events per volume per phase the floor counts (provisioning: claim ADDED, "
        "PV ADDED, PV Bound; deletion: claim, PV Released, PV DELETED)",
    )
    p.add_argument("--variant", action="append", default=[], help=argparse.SUPPRESS)
    p.add_argument(
        "--profile", metavar="FILE", help="py-spy each phase (raw stacks, FILE.runN-PHASE)"
    )
    p.add_argument("--py-spy-command", default="py-spy")
    p.add_argument("--py-spy-rate", type=int, default=250)
    p.add_argument("--workdir", help="where the per-run directories go")
    p.add_argument("provisioner_args", nargs="*")
    args = p.parse_args()
    if args.role == "py-nfs":
        raise SystemExit(run_py_nfs(args.variant, args.provisioner_args))
    args.peers = [x for x in args.peers.split(",") if x]
    result = asyncio.run(bench(args))
    print(json.dumps(result))


if __name__ == "__main__":
    main()

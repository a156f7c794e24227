"""Informer initial LIST + sync: wall and CPU seconds, memory per cached object.

By default the in-memory API server runs in a separate process (``python -m pyprovlib.testing``)
so this process measures only the informer. ``--kubeconfig`` measures against a real cluster
instead (``--seed`` creates the objects there under a run label and deletes them afterwards).

    python bench/informer_sync.py [--objects 10000] [--kind pvc|pv|both] [--kubeconfig PATH]

Prints human-readable lines, then one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import logging
import os
import platform
import re
import resource
import sys
import tempfile
import time
import tracemalloc
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import structlog
from kubernetes_asyncio.client import ApiClient

from pyprovlib.kube._config import ClientSettings, new_client
from pyprovlib.kube._informer import ResourceListerWatcher, SharedInformer
from pyprovlib.kube._objects import Obj
from pyprovlib.kube._resources import NAMESPACES, PERSISTENT_VOLUME_CLAIMS, PERSISTENT_VOLUMES
from pyprovlib.kube._rest import ResourceClient

LABEL = "bench.pyprovlib.io/run"


def pvc(i: int, ns: str, run: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": f"claim-{i:06d}",
            "namespace": ns,
            "labels": {LABEL: run, "app": "bench"},
            "annotations": {
                "volume.beta.kubernetes.io/storage-provisioner": "example.com/hostpath",
                "volume.kubernetes.io/storage-provisioner": "example.com/hostpath",
            },
        },
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}},
            "storageClassName": "standard",
            "volumeMode": "Filesystem",
        },
    }


def pv(i: int, run: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": f"pvc-{uuid.UUID(int=i)}",
            "labels": {LABEL: run},
            "annotations": {"pv.kubernetes.io/provisioned-by": "example.com/hostpath"},
            "finalizers": ["kubernetes.io/pv-protection"],
        },
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": "standard",
            "volumeMode": "Filesystem",
            "hostPath": {"path": f"/var/lib/hostpath/pvc-{i:06d}", "type": "DirectoryOrCreate"},
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": "bench",
                "name": f"claim-{i:06d}",
            },
        },
    }


@contextlib.asynccontextmanager
async def in_memory_server(workdir: Path) -> AsyncIterator[Path]:
    """Run ``python -m pyprovlib.testing`` in a child process; yield its kubeconfig."""
    kubeconfig = workdir / "kubeconfig"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "pyprovlib.testing",
        "--no-binder",
        "--port",
        "0",
        "--kubeconfig",
        str(kubeconfig),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(30):
            while True:
                line = (await proc.stdout.readline()).decode()
                if not line:
                    raise RuntimeError("the API server process exited before listening")
                if re.search(r"listening on http://\S+:\d+", line):
                    print(f"server: {line.strip()} (pid {proc.pid})")
                    break
        # Keep draining its stdout so the child never blocks on a full pipe.
        async with asyncio.TaskGroup() as tg:
            drain = tg.create_task(_drain(proc.stdout))
            try:
                yield kubeconfig
            finally:
                drain.cancel()
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                async with asyncio.timeout(10):
                    await proc.wait()
            except TimeoutError:
                proc.kill()
                await proc.wait()


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.read(65536):
        pass


async def seed(api: ApiClient, kind: str, n: int, ns: str, run: str) -> None:
    if kind == "pvc":
        client = ResourceClient(api, PERSISTENT_VOLUME_CLAIMS)
        objs = [pvc(i, ns, run) for i in range(n)]
    else:
        client = ResourceClient(api, PERSISTENT_VOLUMES)
        objs = [pv(i, run) for i in range(n)]
    it = iter(objs)

    async def worker() -> None:
        for obj in it:
            await client.create(obj)

    async with asyncio.TaskGroup() as tg:
        for _ in range(16):
            tg.create_task(worker())


async def cleanup(api: ApiClient, kind: str, ns: str, run: str) -> None:
    client = ResourceClient(api, PERSISTENT_VOLUME_CLAIMS if kind == "pvc" else PERSISTENT_VOLUMES)
    items = (await client.list(ns if kind == "pvc" else None, label_selector=f"{LABEL}={run}"))[
        "items"
    ]
    for item in items:
        meta = item["metadata"]
        if meta.get("finalizers"):
            with contextlib.suppress(Exception):
                await client.patch(
                    meta["name"],
                    {"metadata": {"finalizers": None}},
                    namespace=meta.get("namespace"),
                )
        with contextlib.suppress(Exception):
            await client.delete(meta["name"], meta.get("namespace"))


def informer_for(api: ApiClient, kind: str, ns: str | None, selector: str | None) -> SharedInformer:
    res = PERSISTENT_VOLUME_CLAIMS if kind == "pvc" else PERSISTENT_VOLUMES
    lw = ResourceListerWatcher(
        ResourceClient(api, res),
        namespace=ns if kind == "pvc" else None,
        label_selector=selector,
    )
    informer = SharedInformer(lw, name=res.plural)
    counts = {"add": 0}

    def on_add(obj: Obj) -> None:  # what a controller does: note the key
        counts["add"] += 1

    informer.add_event_handler(on_add=on_add)
    return informer


async def sync_once(informer: SharedInformer) -> tuple[float, float]:
    """Run ``informer`` until synced; return (wall, cpu) seconds; stop it again."""
    gc.collect()
    w0, c0 = time.perf_counter(), time.process_time()
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(informer.run())
        ok = await informer.wait_for_sync(timeout=600)
        w1, c1 = time.perf_counter(), time.process_time()
        task.cancel()
    if not ok:
        raise RuntimeError(f"{informer.name} did not sync")
    return w1 - w0, c1 - c0


async def measure(
    api: ApiClient, kind: str, ns: str | None, selector: str | None
) -> dict[str, Any]:
    # Timing without tracemalloc (it slows allocation-heavy code several times over).
    runs = [await sync_once(informer_for(api, kind, ns, selector)) for _ in range(3)]
    wall, cpu = min(r[0] for r in runs), min(r[1] for r in runs)
    # Memory: what a synced informer keeps (store, indexes), measured with tracemalloc.
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    informer = informer_for(api, kind, ns, selector)
    await sync_once(informer)
    gc.collect()
    retained = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    n = len(informer.store)
    return {
        "objects": n,
        "wall_s": round(wall, 4),
        "cpu_s": round(cpu, 4),
        "bytes_per_object": round(retained / max(n, 1)),
        "runs_wall_s": [round(r[0], 4) for r in runs],
        "runs_cpu_s": [round(r[1], 4) for r in runs],
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    kinds = ["pvc", "pv"] if args.kind == "both" else [args.kind]
    run = uuid.uuid4().hex[:8]
    ns = args.namespace
    async with contextlib.AsyncExitStack() as stack:
        if args.kubeconfig:
            kubeconfig = Path(args.kubeconfig)
            target = f"kubeconfig {kubeconfig}"
        else:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            kubeconfig = await stack.enter_async_context(in_memory_server(workdir))
            target = "in-memory API server (separate process)"
        api = await new_client(ClientSettings(kubeconfig=str(kubeconfig), qps=0))
        await stack.enter_async_context(api)
        seeded = not args.kubeconfig or args.seed
        selector = f"{LABEL}={run}" if args.kubeconfig and args.seed else None
        if seeded and "pvc" in kinds:
            with contextlib.suppress(Exception):
                await ResourceClient(api, NAMESPACES).create(
                    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
                )
        results: dict[str, Any] = {}
        for kind in kinds:
            if seeded:
                t0 = time.perf_counter()
                await seed(api, kind, args.objects, ns, run)
                print(f"seeded {args.objects} {kind}s in {time.perf_counter() - t0:.1f}s")
            try:
                r = await measure(api, kind, ns if selector else None, selector)
            finally:
                if args.kubeconfig and args.seed:
                    await cleanup(api, kind, ns, run)
            results[kind] = r
            print(
                f"{kind}: {r['objects']} objects synced in {r['wall_s']:.3f}s wall, "
                f"{r['cpu_s']:.3f}s CPU (best of 3), {r['bytes_per_object']} bytes per cached "
                "object (tracemalloc)"
            )
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS of this process: {peak_rss_mb:.1f} MB; target: {target}")
    return {
        "bench": "informer_sync",
        "objects": args.objects,
        "target": "kubeconfig" if args.kubeconfig else "in-memory",
        "kinds": results,
        "peak_rss_mb": round(peak_rss_mb, 1),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--objects", type=int, default=10000, help="objects per kind (default 10000)")
    p.add_argument("--kind", choices=["pvc", "pv", "both"], default="both")
    p.add_argument("--kubeconfig", help="measure against this cluster instead")
    p.add_argument(
        "--seed",
        action="store_true",
        help="with --kubeconfig: create the objects (labelled, deleted afterwards)",
    )
    p.add_argument("--namespace", default="bench", help="namespace of the claims (default bench)")
    return p.parse_args(argv)


if __name__ == "__main__":
    # Keep the library's info/debug lines out of the measurement and the output.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    result = asyncio.run(main(parse_args()))
    print(json.dumps(result, sort_keys=True))

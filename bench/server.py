"""Benchmark the in-memory API server itself: CPU per request by verb, per watch event per
watcher, per LIST item, and per provisioned volume with the PV binder.

The server runs in its own process (``python -m pyprovlib.testing``), so its CPU time (read
from ``/proc``) is the server's alone; this process drives it with a plain aiohttp session
(keep-alive, ``--concurrency`` requests in flight) and its own cost does not count. Phases:

- ``create``, ``get``, ``update_status``, ``merge_patch``, ``event_create``: N requests each,
  no watch open — server CPU µs per request;
- ``watch_event``: the ``update_status`` phase again with ``--watchers`` watches open on the
  claims — the extra CPU per event per watcher (encoding is shared, the write is not);
- ``list``: LISTs of the N claims — CPU µs per LIST item;
- ``provision`` (a server started with its PV binder): N claims of a class with an external
  provisioner; this process plays the provisioner (it creates each PV once the binder has
  annotated the claim) and waits until every claim is Bound — server + binder CPU ms per
  volume, what ``bench/provision.py``'s control plane costs per volume without the controller.

Each phase runs ``--repeat`` times on a fresh namespace; figures are medians (spread in the
human-readable lines). Usage::

    python bench/server.py --objects 2000 --watchers 5 --repeat 3

Prints human-readable lines, then exactly one line of JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

Obj = dict[str, Any]
PROVISIONER = "bench.example.com/server"


def _proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) of another process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.asynccontextmanager
async def server_process(binder: bool) -> AsyncIterator[tuple[str, int]]:
    """``python -m pyprovlib.testing`` in a child process; yields (url, pid)."""
    with tempfile.TemporaryDirectory(prefix="bench-server-") as tmp:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "pyprovlib.testing",
            "--port",
            "0",
            "--kubeconfig",
            str(Path(tmp) / "kubeconfig"),
            # kube-controller-manager's sync period, as in bench/provision.py
            "--binder-resync-period",
            "15",
            *([] if binder else ["--no-binder"]),
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
                    found = re.search(r"listening on (http://\S+:\d+)", line)
                    if found:
                        break
            yield found.group(1), proc.pid
        finally:
            if proc.returncode is None:
                proc.terminate()
                try:
                    async with asyncio.timeout(10):
                        await proc.wait()
                except TimeoutError:
                    proc.kill()
                    await proc.wait()


class Client:
    """Raw JSON requests over one keep-alive aiohttp session."""

    def __init__(self, url: str, concurrency: int) -> None:
        self.url = url
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency + 16))
        self.gate = asyncio.Semaphore(concurrency)

    async def close(self) -> None:
        await self.session.close()

    async def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        expect: tuple[int, ...] = (200, 201),
    ) -> Obj:
        async with self.gate:
            data = None if body is None else json.dumps(body).encode()
            async with self.session.request(
                method,
                self.url + path,
                data=data,
                headers={"Content-Type": content_type, "Accept": "application/json"},
            ) as resp:
                raw = await resp.read()
                if resp.status not in expect:
                    raise RuntimeError(f"{method} {path}: {resp.status} {raw[:300]!r}")
                out = json.loads(raw)
                return out if isinstance(out, dict) else {}


def claim(name: str, namespace: str, class_name: str = "standard") -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": namespace, "labels": {"bench": "server"}},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}},
            "storageClassName": class_name,
        },
    }


def event(i: int, namespace: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"claim-{i:06d}.{i:016x}", "namespace": namespace},
        "involvedObject": {
            "kind": "PersistentVolumeClaim",
            "namespace": namespace,
            "name": f"claim-{i:06d}",
            "apiVersion": "v1",
        },
        "reason": "ProvisioningSucceeded",
        "message": f"Successfully provisioned volume pvc-{i:06d}",
        "type": "Normal",
        "source": {"component": PROVISIONER},
        "firstTimestamp": "2026-01-01T00:00:00Z",
        "lastTimestamp": "2026-01-01T00:00:00Z",
        "count": 1,
    }


async def measure(pid: int, work: Callable[[], Awaitable[None]]) -> float:
    """Server CPU seconds spent while ``work`` runs."""
    before = _proc_cpu(pid)
    await work()
    await asyncio.sleep(0.05)  # the server finishes writing what it has answered
    return _proc_cpu(pid) - before


async def watch_count(
    client: Client, path: str, rv: str, expected: int, done: asyncio.Event
) -> None:
    """Open a watch from ``rv`` and count non-bookmark events until ``expected``."""
    seen = 0
    url = f"{client.url}{path}?watch=true&resourceVersion={rv}&allowWatchBookmarks=true"
    async with client.session.get(url) as resp:
        buf = b""
        async for chunk in resp.content.iter_any():
            lines = (buf + chunk).split(b"\n")
            buf = lines.pop()
            seen += sum(1 for line in lines if line and b'"BOOKMARK"' not in line[:20])
            if seen >= expected:
                done.set()
                return


async def request_phases(
    url: str, pid: int, n: int, watchers: int, concurrency: int, run: int
) -> dict[str, float]:
    """One run of the per-request phases on a fresh namespace; µs of server CPU per unit."""
    client = Client(url, concurrency)
    ns = f"bench-{run}-{os.getpid()}"
    claims = f"/api/v1/namespaces/{ns}/persistentvolumeclaims"
    out: dict[str, float] = {}
    try:
        await client.call("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
        names = [f"claim-{i:06d}" for i in range(n)]
        current: dict[str, Obj] = {}

        async def create() -> None:
            for obj in await asyncio.gather(
                *(client.call("POST", claims, claim(name, ns)) for name in names)
            ):
                current[obj["metadata"]["name"]] = obj

        out["create"] = await measure(pid, create) / n * 1e6

        async def get() -> None:
            await asyncio.gather(*(client.call("GET", f"{claims}/{name}") for name in names))

        out["get"] = await measure(pid, get) / n * 1e6

        async def update_status(phase: str) -> None:
            async def one(name: str) -> None:
                body = dict(current[name])
                body["status"] = {"phase": phase}
                current[name] = await client.call("PUT", f"{claims}/{name}/status", body)

            await asyncio.gather(*(one(name) for name in names))

        plain = await measure(pid, lambda: update_status("Lost"))
        out["update_status"] = plain / n * 1e6

        if watchers:
            listed = await client.call("GET", f"{claims}?limit=1")
            rv = listed["metadata"]["resourceVersion"]
            done = [asyncio.Event() for _ in range(watchers)]
            async with asyncio.TaskGroup() as tg:
                tasks = [tg.create_task(watch_count(client, claims, rv, n, d)) for d in done]
                await asyncio.sleep(0.2)  # every watch open

                async def watched() -> None:
                    await update_status("Pending")
                    for d in done:
                        await d.wait()

                with_watches = await measure(pid, watched)
                for t in tasks:
                    t.cancel()
            out["watch_event"] = (with_watches - plain) / (n * watchers) * 1e6

        async def merge_patch() -> None:
            await asyncio.gather(
                *(
                    client.call(
                        "PATCH",
                        f"{claims}/{name}",
                        {"metadata": {"labels": {"patched": "yes"}}},
                        content_type="application/merge-patch+json",
                    )
                    for name in names
                )
            )

        out["merge_patch"] = await measure(pid, merge_patch) / n * 1e6

        lists = 5

        async def list_all() -> None:
            for _ in range(lists):
                await client.call("GET", claims)

        out["list_item"] = await measure(pid, list_all) / (n * lists) * 1e6

        async def events() -> None:
            await asyncio.gather(
                *(
                    client.call("POST", f"/api/v1/namespaces/{ns}/events", event(i, ns))
                    for i in range(n)
                )
            )

        out["event_create"] = await measure(pid, events) / n * 1e6
        await client.call("DELETE", f"/api/v1/namespaces/{ns}")
    finally:
        await client.close()
    return out


async def provision_phase(url: str, pid: int, n: int, concurrency: int, run: int) -> float:
    """Server + binder CPU ms per volume: claims annotated by the binder, PVs created here
    (as an external provisioner would), every claim Bound."""
    client = Client(url, concurrency)
    ns = f"bench-prov-{run}-{os.getpid()}"
    cls = f"bench-{run}-{os.getpid()}"
    claims = f"/api/v1/namespaces/{ns}/persistentvolumeclaims"
    try:
        await client.call("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
        await client.call(
            "POST",
            "/apis/storage.k8s.io/v1/storageclasses",
            {"metadata": {"name": cls}, "provisioner": PROVISIONER, "reclaimPolicy": "Delete"},
        )
        listed = await client.call("GET", f"{claims}?limit=1")
        rv = listed["metadata"]["resourceVersion"]
        provisioned: set[str] = set()
        bound: set[str] = set()
        all_bound = asyncio.Event()
        pv_tasks: list[asyncio.Task[Obj]] = []

        async def play_provisioner() -> None:
            url_ = f"{client.url}{claims}?watch=true&resourceVersion={rv}"
            async with client.session.get(url_) as resp:
                buf = b""
                async for chunk in resp.content.iter_any():
                    lines = (buf + chunk).split(b"\n")
                    buf = lines.pop()
                    for line in lines:
                        if not line:
                            continue
                        obj = json.loads(line)["object"]
                        meta = obj["metadata"]
                        ann = meta.get("annotations") or {}
                        uid = meta["uid"]
                        if (obj.get("status") or {}).get("phase") == "Bound":
                            bound.add(uid)
                            if len(bound) >= n:
                                all_bound.set()
                                return
                        if (
                            ann.get("volume.kubernetes.io/storage-provisioner") == PROVISIONER
                            and uid not in provisioned
                        ):
                            provisioned.add(uid)
                            pv_tasks.append(asyncio.create_task(create_pv(obj)))

        async def create_pv(pvc: Obj) -> Obj:
            meta = pvc["metadata"]
            return await client.call(
                "POST",
                "/api/v1/persistentvolumes",
                {
                    "metadata": {
                        "name": f"pvc-{meta['uid']}",
                        "annotations": {"pv.kubernetes.io/provisioned-by": PROVISIONER},
                    },
                    "spec": {
                        "capacity": {"storage": "1Gi"},
                        "accessModes": ["ReadWriteOnce"],
                        "persistentVolumeReclaimPolicy": "Delete",
                        "storageClassName": cls,
                        "hostPath": {"path": f"/tmp/{meta['uid']}"},
                        "claimRef": {
                            "kind": "PersistentVolumeClaim",
                            "apiVersion": "v1",
                            "namespace": ns,
                            "name": meta["name"],
                            "uid": meta["uid"],
                            "resourceVersion": meta["resourceVersion"],
                        },
                    },
                },
            )

        async def work() -> None:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(play_provisioner())
                await asyncio.sleep(0.2)
                await asyncio.gather(
                    *(client.call("POST", claims, claim(f"c-{i:06d}", ns, cls)) for i in range(n))
                )
                async with asyncio.timeout(300):
                    await all_bound.wait()
            await asyncio.gather(*pv_tasks)

        cpu = await measure(pid, work)
        await client.call("DELETE", f"/api/v1/namespaces/{ns}")
        await client.call("DELETE", f"/apis/storage.k8s.io/v1/storageclasses/{cls}")
        return cpu / n * 1e3
    finally:
        await client.close()


def _summary(values: list[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    runs: dict[str, list[float]] = {}
    async with server_process(binder=False) as (url, pid):
        for run in range(args.repeat):
            for key, value in (
                await request_phases(url, pid, args.objects, args.watchers, args.concurrency, run)
            ).items():
                runs.setdefault(key, []).append(value)
    provision: list[float] = []
    if args.volumes:
        async with server_process(binder=True) as (url, pid):
            for run in range(args.repeat):
                provision.append(
                    await provision_phase(url, pid, args.volumes, args.concurrency, run)
                )
    result: dict[str, Any] = {
        "bench": "server",
        "objects": args.objects,
        "watchers": args.watchers,
        "concurrency": args.concurrency,
        "repeat": args.repeat,
        "cpu_us": {k: round(_summary(v)[0], 1) for k, v in runs.items()},
    }
    for key, values in runs.items():
        med, lo, hi = _summary(values)
        unit = (
            "per event per watcher"
            if key == "watch_event"
            else "per item"
            if key == "list_item"
            else "per request"
        )
        print(f"{key:14s} {med:8.1f} CPU µs {unit} (runs {lo:.1f}-{hi:.1f})")
    if provision:
        med, lo, hi = _summary(provision)
        result["volumes"] = args.volumes
        result["provision_cpu_ms_per_volume"] = round(med, 3)
        print(
            f"provision      {med:8.3f} CPU ms per volume, server + PV binder, "
            f"{args.volumes} claims (runs {lo:.3f}-{hi:.3f})"
        )
    return result


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--objects", type=int, default=2000, help="claims per request phase")
    p.add_argument("--watchers", type=int, default=5, help="watches open in watch_event")
    p.add_argument("--volumes", type=int, default=1000, help="claims in the provision phase")
    p.add_argument("--concurrency", type=int, default=32, help="requests in flight")
    p.add_argument("--repeat", type=int, default=3)
    return p


if __name__ == "__main__":
    started = time.monotonic()
    figures = asyncio.run(main(_parser().parse_args()))
    figures["wall_s"] = round(time.monotonic() - started, 1)
    print(json.dumps(figures))

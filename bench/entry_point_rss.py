"""Peak RSS of a ``python -m`` entry point with N claims and N PVs in its caches.

Starts ``python -m pyprovlib.testing`` (no binder), fills it with N PersistentVolumeClaims of
another provisioner's class and N Available PersistentVolumes, then runs
``python -m pyprovlib.examples.hostpath`` (node mode, unthrottled) against it until its
``/readyz`` answers 200 (every informer synced) and a few seconds more, and reads the entry
point's peak RSS (``VmHWM``) from ``/proc``. The entry point is started as a user would start
it, so what it imports on start-up (the lazy kubernetes-asyncio imports of pyprovlib's entry
points, or not) is in the figure.

    python bench/entry_point_rss.py --objects 1000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import yaml


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def _status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


async def _fill(server: str, n: int) -> None:
    claims = f"{server}/api/v1/namespaces/default/persistentvolumeclaims"
    volumes = f"{server}/api/v1/persistentvolumes"

    def claim(i: int) -> dict[str, Any]:
        return {
            "metadata": {"name": f"claim-{i}", "labels": {"app": "bench"}},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}},
                "storageClassName": "someone-else",
            },
        }

    def volume(i: int) -> dict[str, Any]:
        return {
            "metadata": {"name": f"pv-{i}", "annotations": {"example.com/owner": "bench"}},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "hostPath": {"path": f"/tmp/pv-{i}"},
                "storageClassName": "someone-else",
            },
        }

    async with aiohttp.ClientSession() as session:
        sem = asyncio.Semaphore(32)

        async def post(url: str, body: dict[str, Any]) -> None:
            async with sem, session.post(url, json=body) as resp:
                if resp.status >= 300:
                    raise RuntimeError(f"POST {url}: {resp.status} {await resp.text()}")

        await asyncio.gather(*(post(claims, claim(i)) for i in range(n)))
        await asyncio.gather(*(post(volumes, volume(i)) for i in range(n)))


async def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        kubeconfig = Path(tmp) / "kubeconfig"
        server_proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "pyprovlib.testing",
            "--port",
            "0",
            "--no-binder",
            "--kubeconfig",
            str(kubeconfig),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        controller = None
        try:
            async with asyncio.timeout(60):
                while not kubeconfig.exists() or not kubeconfig.read_text():  # noqa: ASYNC110 - a file, not an event
                    await asyncio.sleep(0.05)
            server = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
            await _fill(server, args.objects)
            port = _free_port()
            env = {k: v for k, v in os.environ.items() if k != "PYPROVLIB_EAGER_KUBERNETES_IMPORTS"}
            if args.eager:
                env["PYPROVLIB_EAGER_KUBERNETES_IMPORTS"] = "1"
            started = time.monotonic()
            controller = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "pyprovlib.examples.hostpath",
                "--kubeconfig",
                str(kubeconfig),
                "--mode",
                "node",
                "--node-name",
                "bench-node",
                "--kube-api-qps",
                "0",
                "--http-endpoint",
                f"127.0.0.1:{port}",
                "--log-level",
                "warning",
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
                env=env,
            )
            async with aiohttp.ClientSession() as session, asyncio.timeout(120):
                while True:
                    try:
                        async with session.get(f"http://127.0.0.1:{port}/readyz") as resp:
                            if resp.status == 200:
                                break
                    except aiohttp.ClientError:
                        pass
                    await asyncio.sleep(0.1)
            ready_s = time.monotonic() - started
            await asyncio.sleep(args.settle)
            pid = controller.pid
            return {
                "bench": "entry_point_rss",
                "entry_point": "python -m pyprovlib.examples.hostpath",
                "objects": args.objects,
                "eager_env": args.eager,
                "ready_s": round(ready_s, 2),
                "rss_mb": round(_status_kb(pid, "VmRSS") / 1024, 1),
                "peak_rss_mb": round(_status_kb(pid, "VmHWM") / 1024, 1),
            }
        finally:
            for proc in (controller, server_proc):
                if proc is not None and proc.returncode is None:
                    proc.terminate()
                    try:
                        async with asyncio.timeout(20):
                            await proc.wait()
                    except TimeoutError:
                        proc.kill()
                        await proc.wait()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--objects", type=int, default=1000, help="claims, and as many PVs")
    p.add_argument("--settle", type=float, default=3.0, help="seconds after /readyz")
    p.add_argument("--eager", action="store_true", help="set PYPROVLIB_EAGER_KUBERNETES_IMPORTS=1")
    result = asyncio.run(run(p.parse_args()))
    print(
        f"{result['entry_point']}: {result['objects']} claims + PVs cached, ready after "
        f"{result['ready_s']} s, RSS {result['rss_mb']} MB, peak {result['peak_rss_mb']} MB"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()

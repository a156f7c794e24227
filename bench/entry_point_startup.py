"""Start-up time and peak RSS of ``python -m pyprovlib.csi``, with and without the lazy
kubernetes-asyncio imports (issue 29: is the eager import cheap enough to do without them?).

Two measurements, each ``--repeat`` times per mode, the modes interleaved (lazy, eager, lazy,
...), medians reported:

- ``help``: ``python -m pyprovlib.csi --help`` to its exit: wall time, CPU and peak RSS (the
  child's rusage).
- ``start``: ``python -m pyprovlib.csi`` (all three controllers) against the standalone
  in-memory API server and the Python hostpath CSI driver (both started once, beforehand),
  from exec until its ``/readyz`` answers 200 (the CSI driver probed, every informer synced):
  wall time and CPU (user + system, /proc) to then, and its peak RSS (``VmHWM``) ``--settle``
  seconds later.

The eager mode sets ``PYPROVLIB_EAGER_KUBERNETES_IMPORTS=1``: kubernetes-asyncio's client
packages import all ~830 generated API and model modules, as in any process that does not call
``pyprovlib.enable_lazy_kubernetes_imports()``.

    python bench/entry_point_startup.py --repeat 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

EAGER_ENV = "PYPROVLIB_EAGER_KUBERNETES_IMPORTS"
MODES = ("lazy", "eager")


def _env(mode: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != EAGER_ENV}
    if mode == "eager":
        env[EAGER_ENV] = "1"
    return env


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def help_run(mode: str) -> dict[str, float]:
    """``python -m pyprovlib.csi --help``: wall seconds and peak RSS (MB) to its exit."""
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "pyprovlib.csi", "--help"],
        stdout=subprocess.DEVNULL,
        env=_env(mode),
    )
    _pid, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"--help exited with {proc.returncode}")
    cpu = usage.ru_utime + usage.ru_stime
    return {"wall_s": wall, "cpu_s": cpu, "peak_rss_mb": usage.ru_maxrss / 1024}


async def _stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.terminate()
        try:
            async with asyncio.timeout(20):
                await proc.wait()
        except TimeoutError:
            proc.kill()
            await proc.wait()


async def start_run(mode: str, kubeconfig: Path, endpoint: str, settle: float) -> dict[str, float]:
    """``python -m pyprovlib.csi`` from exec to its /readyz: seconds, then its peak RSS."""
    port = _free_port()
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "pyprovlib.csi",
        "--kubeconfig",
        str(kubeconfig),
        "--csi-address",
        endpoint,
        "--kube-api-qps",
        "0",
        "--http-endpoint",
        f"127.0.0.1:{port}",
        "--log-level",
        "warning",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
        env=_env(mode),
    )
    try:
        async with aiohttp.ClientSession() as session, asyncio.timeout(120):
            while True:
                if proc.returncode is not None:
                    raise RuntimeError(f"python -m pyprovlib.csi exited with {proc.returncode}")
                try:
                    async with session.get(f"http://127.0.0.1:{port}/readyz") as resp:
                        if resp.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.02)
        ready = time.monotonic() - started
        cpu = _cpu_s(proc.pid)
        await asyncio.sleep(settle)
        return {"ready_s": ready, "cpu_s": cpu, "peak_rss_mb": _status_kb(proc.pid, "VmHWM") / 1024}
    finally:
        await _stop(proc)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    helps: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    starts: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    for _ in range(args.repeat):
        for mode in MODES:
            helps[mode].append(await asyncio.to_thread(help_run, mode))
    with tempfile.TemporaryDirectory() as tmp:
        kubeconfig = Path(tmp) / "kubeconfig"
        sock = Path(tmp) / "csi.sock"
        endpoint = f"unix://{sock}"
        server = await asyncio.create_subprocess_exec(
            sys.executable,
            *("-m", "pyprovlib.testing", "--port", "0", "--no-binder"),
            *("--kubeconfig", str(kubeconfig)),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        driver = await asyncio.create_subprocess_exec(
            sys.executable,
            *("-m", "pyprovlib.examples.csi_hostpath", "--endpoint", endpoint),
            *("--nodeid", "bench-node", "--statedir", f"{tmp}/state", "--log-level", "warning"),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        try:
            async with asyncio.timeout(60):
                while not kubeconfig.exists() or not kubeconfig.read_text():  # noqa: ASYNC110 - a file, not an event
                    await asyncio.sleep(0.05)
                while not sock.exists():  # noqa: ASYNC110 - a file, not an event
                    await asyncio.sleep(0.05)
            for _ in range(args.repeat):
                for mode in MODES:
                    starts[mode].append(await start_run(mode, kubeconfig, endpoint, args.settle))
        finally:
            await _stop(driver)
            await _stop(server)

    def median(runs: list[dict[str, float]], key: str) -> float:
        return round(statistics.median(r[key] for r in runs), 3)

    return {
        "bench": "entry_point_startup",
        "entry_point": "python -m pyprovlib.csi",
        "repeat": args.repeat,
        **{
            f"help_{m}": {
                "wall_s": median(helps[m], "wall_s"),
                "cpu_s": median(helps[m], "cpu_s"),
                "peak_rss_mb": median(helps[m], "peak_rss_mb"),
            }
            for m in MODES
        },
        **{
            f"start_{m}": {
                "ready_s": median(starts[m], "ready_s"),
                "cpu_s": median(starts[m], "cpu_s"),
                "peak_rss_mb": median(starts[m], "peak_rss_mb"),
            }
            for m in MODES
        },
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=5, help="runs per mode and measurement")
    p.add_argument("--settle", type=float, default=2.0, help="seconds after /readyz")
    result = asyncio.run(run(p.parse_args()))
    for m in MODES:
        h, s = result[f"help_{m}"], result[f"start_{m}"]
        print(
            f"{m:>5}: --help {h['wall_s']} s (CPU {h['cpu_s']} s), peak {h['peak_rss_mb']} MB; "
            f"start to /readyz {s['ready_s']} s (CPU {s['cpu_s']} s), "
            f"peak {s['peak_rss_mb']} MB"
        )
    print(json.dumps(result))


if __name__ == "__main__":
    main()

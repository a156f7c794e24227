"""Run the ``e2e`` tests in real-cluster mode against a standalone in-memory API server.

``python tests/e2e/standalone.py [--rounds N] [-- PYTEST_ARGS...]`` starts
``python -m pyprovlib.testing --scheduler --nodes 2`` (API server, PV binder, pod scheduler and
two Ready nodes, in a process of its own) with a kubeconfig in a temporary directory, runs
``pytest -m e2e`` with ``PYPROVLIB_E2E_KUBECONFIG`` naming it ``N`` times (default 2) against
the same server, so state accumulates as on a shared cluster, then stops the server. It prints
each round's wall time and exits non-zero if a round failed. ``nox -s e2e_standalone`` runs it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

ENV_KUBECONFIG = "PYPROVLIB_E2E_KUBECONFIG"
READY_LINE = "pyprovlib apiserver listening on"
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2, help="pytest runs against one server")
    p.add_argument(
        "--nodes",
        type=int,
        default=2,
        help="Ready nodes the server registers (tests placing claims on two nodes need 2)",
    )
    p.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    return p


async def _read(path: Path) -> str:
    return await asyncio.to_thread(path.read_text, errors="replace")


async def _wait_ready(log_path: Path, server: asyncio.subprocess.Process) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.returncode is not None:
            output = (await _read(log_path))[-4000:]
            raise RuntimeError(f"the API server exited with {server.returncode}:\n{output}")
        if READY_LINE in await _read(log_path):
            return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"the API server did not start within {START_TIMEOUT_S}s; see {log_path}")


async def _stop(server: asyncio.subprocess.Process) -> None:
    if server.returncode is not None:
        return
    server.send_signal(signal.SIGTERM)
    try:
        async with asyncio.timeout(STOP_TIMEOUT_S):
            await server.wait()
    except TimeoutError:
        server.kill()
        await server.wait()


async def main(argv: list[str]) -> int:
    """Start the server, run the rounds, stop the server; the exit status."""
    args = _parser().parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="pyprovlib-e2e-") as tmp:
        kubeconfig = Path(tmp) / "kubeconfig"
        log_path = Path(tmp) / "apiserver.log"
        with log_path.open("wb") as log:
            server = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "pyprovlib.testing",
                "--kubeconfig",
                str(kubeconfig),
                "--scheduler",
                "--nodes",
                str(args.nodes),
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
            )
        try:
            await _wait_ready(log_path, server)
            print(f"standalone API server ready (kubeconfig {kubeconfig})", flush=True)
            env = {**os.environ, ENV_KUBECONFIG: str(kubeconfig)}
            failed = 0
            for round_ in range(1, args.rounds + 1):
                started = time.monotonic()
                pytest = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "pytest", "-m", "e2e", *args.pytest_args, env=env
                )
                status = await pytest.wait()
                took = time.monotonic() - started
                print(f"e2e round {round_}/{args.rounds}: exit {status} in {took:.1f}s", flush=True)
                failed += status != 0
            if server.returncode is not None:
                print(f"the API server died (exit {server.returncode}); see its log", flush=True)
                failed += 1
            return 1 if failed else 0
        finally:
            with contextlib.suppress(ProcessLookupError):
                await _stop(server)


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))

"""Serve the in-memory API server standalone so kubectl and other real clients can use it.

``python -m pyprovlib.testing --port PORT --kubeconfig FILE [--no-binder]`` writes a kubeconfig
naming the server, prints where it listens, and serves until SIGTERM or SIGINT.

``python -m pyprovlib.testing --binder-only --kubeconfig FILE`` runs only the PV binder
(kube-controller-manager's part) against the API server that kubeconfig names, in its own
process — as in a real cluster, where it is not the API server's process that binds.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Sequence

from pyprovlib.testing.server import ApiServer

__all__ = ["main", "run"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m pyprovlib.testing",
        description="Serve pyprovlib's in-memory Kubernetes API server over HTTP.",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=0, help="port to listen on (0: a free one)")
    p.add_argument("--kubeconfig", help="write a kubeconfig naming the server to this file")
    p.add_argument(
        "--no-binder",
        dest="binder",
        action="store_false",
        help="do not run the PV binder (kube-controller-manager's PV controller)",
    )
    p.add_argument(
        "--binder-only",
        action="store_true",
        help="run only the PV binder, against the server named by --kubeconfig",
    )
    p.add_argument(
        "--binder-resync-period",
        type=float,
        default=2.0,
        help=(
            "seconds between the PV binder's full resyncs (default 2, quick recovery in "
            "tests; kube-controller-manager's --pvclaimbinder-sync-period is 15)"
        ),
    )
    p.add_argument(
        "--watch-window",
        type=int,
        default=10000,
        help="events kept for resuming watches (older resourceVersions get 410)",
    )
    return p


async def _run_binder(kubeconfig: str, resync_period: float, stop: asyncio.Event) -> None:
    from kubernetes_asyncio.client import ApiClient, Configuration
    from kubernetes_asyncio.config import load_kube_config

    from pyprovlib.testing.binder import PVBinder

    configuration = Configuration()
    await load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    async with ApiClient(configuration) as api:
        binder = PVBinder(api, resync_period=resync_period)
        await binder.start()
        try:
            print(f"pyprovlib PV binder running against {configuration.host}", flush=True)
            await stop.wait()
        finally:
            await binder.stop()


async def run(args: argparse.Namespace) -> int:
    """Serve (or bind) until SIGTERM/SIGINT; returns the exit status."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        if args.binder_only:
            if not args.kubeconfig:
                print("--binder-only needs --kubeconfig naming the API server", file=sys.stderr)
                return 2
            await _run_binder(args.kubeconfig, args.binder_resync_period, stop)
            return 0
        async with ApiServer(
            host=args.host,
            port=args.port,
            binder=args.binder,
            watch_window=args.watch_window,
            binder_resync_period=args.binder_resync_period,
        ) as server:
            where = f"pyprovlib apiserver listening on {server.url}"
            if args.kubeconfig:
                path = server.write_kubeconfig(args.kubeconfig)
                where += f" (kubeconfig {path})"
            print(where, flush=True)  # the one line callers wait for
            await stop.wait()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point (``pyprovlib-apiserver``)."""
    args = _parser().parse_args(argv)
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())

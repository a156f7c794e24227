"""Serve the in-memory API server standalone so kubectl and other real clients can use it.

``python -m pyprovlib.testing --port PORT --kubeconfig FILE [--no-binder]`` writes a kubeconfig
naming the server, prints where it listens, and serves until SIGTERM or SIGINT.
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
        "--watch-window",
        type=int,
        default=10000,
        help="events kept for resuming watches (older resourceVersions get 410)",
    )
    return p


async def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT; returns the exit status."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        async with ApiServer(
            host=args.host, port=args.port, binder=args.binder, watch_window=args.watch_window
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

"""Serve the in-memory API server standalone so kubectl and other real clients can use it.

``python -m pyprovlib.testing --port PORT --kubeconfig FILE [--no-binder] [--scheduler]
[--nodes N]`` writes a kubeconfig naming the server, prints where it listens, and serves until
SIGTERM or SIGINT. The kubeconfig file appears (atomically) only once the server is ready, so a
script can wait for it. ``--scheduler`` and ``--nodes`` make it closer to a real cluster: a pod
scheduler selecting nodes for ``WaitForFirstConsumer`` claims, and Ready nodes to select.

``python -m pyprovlib.testing --binder-only --kubeconfig FILE`` runs only the PV binder
(kube-controller-manager's part) against the API server that kubeconfig names, in its own
process — as in a real cluster, where it is not the API server's process that binds; with
``--scheduler`` the pod scheduler too. ``--scheduler-only`` runs only the pod scheduler
(kube-scheduler's part).

The same command is installed as ``pyprovlib-apiserver``; each names itself as it was called.
Both start in :mod:`pyprovlib.testing.__main__`, which turns on the lazy kubernetes-asyncio
imports before this module (and with it the client) is imported.
A port already in use, a kubeconfig that cannot be written or read end in one line naming the
flag and the fix (exit status 1), never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from kubernetes_asyncio.client import ApiClient

from pyprovlib._errors import PyprovlibError
from pyprovlib.runtime._flag_parser import add_version_flag
from pyprovlib.testing._scheduler import PodScheduler
from pyprovlib.testing._server import ApiServer

__all__ = ["main", "run"]

MODULE_PROG = "python -m pyprovlib.testing"
"""The program's name when run with ``python -m``."""


class CommandError(PyprovlibError):
    """A problem the user can fix, said in one line (``prog: error: ...``); exit ``status``:
    1, or 2 for a usage error (flags that do not go together)."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid port {text!r}: a number, 0 to 65535") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"invalid port {port}: 0 to 65535 (0: a free one)")
    return port


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid count {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"invalid count {value}: must not be negative")
    return value


def _parser(prog: str = MODULE_PROG) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Serve pyprovlib's in-memory Kubernetes API server over HTTP.",
        allow_abbrev=False,
    )
    add_version_flag(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument(
        "--port",
        type=_port,
        default=0,
        help="port to listen on (default 0: a free one, which the kubeconfig names)",
    )
    p.add_argument(
        "--kubeconfig",
        help="write a kubeconfig naming the server to this file once the server is ready "
        "(wait for the file to appear before using it)",
    )
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
        "--scheduler-only",
        action="store_true",
        help="run only the pod scheduler, against the server named by --kubeconfig",
    )
    p.add_argument(
        "--scheduler",
        action="store_true",
        help=(
            "run a pod scheduler (kube-scheduler's volume binding): sets selected-node on "
            "WaitForFirstConsumer claims of pending pods"
        ),
    )
    p.add_argument(
        "--nodes",
        type=_count,
        default=0,
        help="register this many Ready nodes, pyprovlib-node-1..N (default 0)",
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


async def _run_controllers(
    kubeconfig: str,
    resync_period: float,
    stop: asyncio.Event,
    *,
    binder: bool,
    scheduler: bool,
) -> None:
    """Run the PV binder and/or the pod scheduler against the server ``kubeconfig`` names."""
    from kubernetes_asyncio.client import ApiClient

    from pyprovlib.kube._config import ClientSettings, ConfigError, load_configuration
    from pyprovlib.testing._binder import PVBinder

    try:
        configuration, _ = await load_configuration(ClientSettings(kubeconfig=kubeconfig))
    except ConfigError as err:
        raise CommandError(
            f"{'; '.join(err.tried)}; name the kubeconfig the API server wrote"
        ) from None
    async with ApiClient(configuration) as api:
        pv_binder = PVBinder(api, resync_period=resync_period) if binder else None
        pod_scheduler = PodScheduler(api) if scheduler else None
        if pv_binder is not None:
            await pv_binder.start()
        try:
            if pod_scheduler is not None:
                await pod_scheduler.start()
            try:
                what = " and ".join(
                    n for n, on in (("PV binder", binder), ("pod scheduler", scheduler)) if on
                )
                print(f"pyprovlib {what} running against {configuration.host}", flush=True)
                await stop.wait()
            finally:
                if pod_scheduler is not None:
                    await pod_scheduler.stop()
        finally:
            if pv_binder is not None:
                await pv_binder.stop()


def _node(name: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"},
        },
    }


async def _register_nodes(api: ApiClient, count: int) -> None:
    """Create Ready nodes, as kubelets registering with the cluster would."""
    from pyprovlib.kube._resources import NODES
    from pyprovlib.kube._rest import ResourceClient

    nodes = ResourceClient(api, NODES)
    ready = {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]}
    for i in range(1, count + 1):
        name = f"pyprovlib-node-{i}"
        await nodes.create(_node(name))
        await nodes.patch(
            name,
            {"status": ready},
            subresource="status",
        )


def _publish_kubeconfig(server: ApiServer, target: str) -> Path:
    # Written last, once the server (nodes, scheduler) is ready, and renamed into place so a
    # script waiting for the file (`until [ -s kubeconfig ]`) never reads half of it.
    path = Path(target)
    partial = path.with_name(f".{path.name}.partial")
    try:
        server.write_kubeconfig(partial)
        partial.replace(path)
    except OSError as err:
        with contextlib.suppress(OSError):
            partial.unlink()
        raise CommandError(
            f"cannot write --kubeconfig {target}: {_reason(err)}; name a file in a directory "
            "this process can write to"
        ) from None
    return path


def _reason(err: OSError) -> str:
    # asyncio's bind errors carry the address in strerror too: the errno's text is enough.
    return os.strerror(err.errno).lower() if err.errno else str(err)


async def _start_server(args: argparse.Namespace, stack: contextlib.AsyncExitStack) -> ApiServer:
    try:
        server: ApiServer = await stack.enter_async_context(
            ApiServer(
                host=args.host,
                port=args.port,
                binder=args.binder,
                watch_window=args.watch_window,
                binder_resync_period=args.binder_resync_period,
            )
        )
    except OSError as err:
        where = f"{args.host}:{args.port}"
        reason = _reason(err)
        if args.port:
            fix = "pick another --port, or leave it out to get a free one"
        else:
            fix = "check --host names an address of this machine"
        raise CommandError(f"cannot listen on {where}: {reason}; {fix}") from None
    return server


async def run(args: argparse.Namespace, prog: str = MODULE_PROG) -> int:
    """Serve (or bind) until SIGTERM/SIGINT; returns the exit status. A problem the user can
    fix (a busy port, a kubeconfig that cannot be written or read) is one line on stderr,
    naming ``prog``, and status 1."""
    try:
        return await _run(args)
    except CommandError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return err.status


async def _run(args: argparse.Namespace) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        if args.binder_only or args.scheduler_only:
            if not args.kubeconfig:
                flag = "--binder-only" if args.binder_only else "--scheduler-only"
                raise CommandError(f"{flag} needs --kubeconfig naming the API server", status=2)
            await _run_controllers(
                args.kubeconfig,
                args.binder_resync_period,
                stop,
                binder=args.binder_only,
                scheduler=args.scheduler_only or args.scheduler,
            )
            return 0
        async with contextlib.AsyncExitStack() as stack:
            server = await _start_server(args, stack)
            api = await stack.enter_async_context(server.api_client())
            if args.nodes:
                await _register_nodes(api, args.nodes)
            scheduler = PodScheduler(api) if args.scheduler else None
            if scheduler is not None:
                await scheduler.start()
            try:
                where = f"pyprovlib apiserver listening on {server.url}"
                if args.kubeconfig:
                    path = _publish_kubeconfig(server, args.kubeconfig)
                    where += f" (kubeconfig {path})"
                print(where, flush=True)  # the one line callers wait for
                await stop.wait()
            finally:
                if scheduler is not None:
                    await scheduler.stop()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    return 0


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """Parse ``argv`` and serve; ``prog`` defaults to the name the program was called by. The
    ``pyprovlib-apiserver`` command and ``python -m pyprovlib.testing`` call it from
    :mod:`pyprovlib.testing.__main__`."""
    if prog is None:
        prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else MODULE_PROG
    args = _parser(prog).parse_args(argv)
    try:
        return asyncio.run(run(args, prog))
    except KeyboardInterrupt:  # before the signal handlers were installed
        return 130

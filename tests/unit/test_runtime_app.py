"""pyprovlib.runtime.run_async in-process: startup, the factory contract, exit codes, cleanup.
Signals and HTTP probes of a running process are in tests/integration/test_runtime_process.py.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import socket
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio.client import CoreV1Api
from prometheus_client import CollectorRegistry

from pyprovlib.runtime import RuntimeContext, add_flag, common_parser, run, run_async
from pyprovlib.runtime._app import EXIT_FAILURE, EXIT_OK
from pyprovlib.testing._server import ApiServer

# Each test leaves logging as it found it (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("restore_logging")


@pytest.fixture
async def kubeconfig(apiserver: ApiServer, tmp_path: Path) -> Path:
    return apiserver.write_kubeconfig(tmp_path / "kubeconfig")


class Recorder:
    """A controller that lists namespaces through the runtime's client, then returns or raises."""

    def __init__(self, ctx: RuntimeContext, *, fail: bool = False) -> None:
        self.ctx = ctx
        self.fail = fail
        self.namespaces: list[str] = []

    async def run(self) -> None:
        result = await CoreV1Api(self.ctx.api_client).list_namespace()
        self.namespaces = [ns.metadata.name for ns in result.items]
        if self.fail:
            raise RuntimeError("backend exploded")

    def stop(self) -> None:
        return None

    def healthy(self) -> bool:
        return True

    def ready(self) -> bool:
        return True


def events(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(x) for x in stream.getvalue().splitlines() if x.strip()]


def find(stream: io.StringIO, event: str) -> dict[str, Any]:
    line = next((x for x in events(stream) if x["event"] == event), None)
    assert line is not None, f"{event!r} not logged: {stream.getvalue()}"
    return line


async def go(
    factory: Any, kubeconfig: Path | str, *extra: str, **kw: Any
) -> tuple[int, io.StringIO]:
    stream = io.StringIO()
    code = await run_async(
        factory,
        argv=["--kubeconfig", str(kubeconfig), "--log-format=json", *extra],
        prog="test-ctl",
        log_stream=stream,
        registry=CollectorRegistry(),
        **kw,
    )
    return code, stream


async def test_context_and_clean_exit(kubeconfig: Path) -> None:
    made: list[Recorder] = []

    def factory(ctx: RuntimeContext) -> Recorder:
        made.append(Recorder(ctx))
        return made[0]

    parser = common_parser("test-ctl", "d", defaults={"worker_threads": 9})
    add_flag(parser, "--driver-name", default="", help="driver")
    code, stream = await go(factory, kubeconfig, "--driver-name=x.example.com", parser=parser)
    assert code == EXIT_OK
    (controller,) = made
    assert "default" in controller.namespaces
    ctx = controller.ctx
    assert ctx.options.workers == 9
    assert ctx.options.kubeconfig == str(kubeconfig)
    assert ctx.args.driver_name == "x.example.com"
    assert ctx.api_client.rest_client.pool_manager.closed  # the runtime closed its client
    starting = find(stream, "starting")
    assert starting["program"] == "test-ctl"
    assert starting["options"]["workers"] == 9
    find(stream, "the controller returned on its own: exiting")


async def test_async_factory(kubeconfig: Path) -> None:
    async def factory(ctx: RuntimeContext) -> Recorder:
        await asyncio.sleep(0)
        return Recorder(ctx)

    code, _ = await go(factory, kubeconfig)
    assert code == EXIT_OK


async def test_run_raising_exits_1_and_logs(kubeconfig: Path) -> None:
    code, stream = await go(lambda ctx: Recorder(ctx, fail=True), kubeconfig)
    assert code == EXIT_FAILURE
    failed = find(stream, "the controller failed")
    assert failed["level"] == "error"
    assert failed["error"] == "backend exploded"
    assert "RuntimeError: backend exploded" in failed["exception"]


async def test_factory_raising_exits_1(kubeconfig: Path) -> None:
    def factory(ctx: RuntimeContext) -> Recorder:
        raise ValueError("no CSI driver at /csi/csi.sock")

    code, stream = await go(factory, kubeconfig)
    assert code == EXIT_FAILURE
    assert "no CSI driver" in find(stream, "the controller factory failed")["exception"]


async def test_async_factory_raising_exits_1(kubeconfig: Path) -> None:
    async def factory(ctx: RuntimeContext) -> Recorder:
        raise ValueError("probe failed")

    code, stream = await go(factory, kubeconfig)
    assert code == EXIT_FAILURE
    assert find(stream, "the controller factory failed")["error"] == "probe failed"


async def test_factory_returning_a_non_controller_exits_1(kubeconfig: Path) -> None:
    code, stream = await go(lambda ctx: object(), kubeconfig)
    assert code == EXIT_FAILURE
    line = find(
        stream,
        "the controller factory returned something that is not a Controller "
        "(it needs run(), stop(), healthy() and ready())",
    )
    assert line["returned"] == "object"


async def test_unusable_kubeconfig_exits_1_without_calling_the_factory(tmp_path: Path) -> None:
    called: list[RuntimeContext] = []

    def factory(ctx: RuntimeContext) -> Recorder:
        called.append(ctx)
        return Recorder(ctx)

    code, stream = await go(factory, tmp_path / "missing")
    assert code == EXIT_FAILURE
    assert called == []
    assert find(stream, "cannot build the Kubernetes API client")["level"] == "error"


async def test_http_port_in_use_exits_1(kubeconfig: Path) -> None:
    made: list[Recorder] = []

    def factory(ctx: RuntimeContext) -> Recorder:
        made.append(Recorder(ctx))
        return made[0]

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, stream = await go(factory, kubeconfig, f"--http-endpoint=127.0.0.1:{port}")
    assert code == EXIT_FAILURE
    assert find(stream, "cannot start the HTTP server")["address"] == f"127.0.0.1:{port}"
    assert made[0].namespaces == []  # never started
    assert made[0].ctx.api_client.rest_client.pool_manager.closed


async def test_usage_errors_and_help_return_argparse_codes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert await run_async(Recorder, argv=["--bogus"], prog="p") == 2
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err
    assert await run_async(Recorder, argv=["--help"], prog="p") == 0
    assert "--shutdown-grace-period" in capsys.readouterr().out


def test_sync_run_wraps_run_async(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(Recorder, argv=["--version"], prog="sync-prog") == 0
    assert capsys.readouterr().out.startswith("sync-prog ")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Prober:
    """A controller that probes the runtime's HTTP server from inside run()."""

    def __init__(self, ctx: RuntimeContext, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.results: dict[str, int] = {}

    async def run(self) -> None:
        import aiohttp

        async with aiohttp.ClientSession() as session:
            for path in ("/metrics", "/healthz", "/readyz"):
                async with session.get(self.url + path) as resp:
                    self.results[path] = resp.status

    def stop(self) -> None:
        return None

    def healthy(self) -> bool:
        return True

    def ready(self) -> bool:
        return False


@pytest.mark.parametrize(
    ("flag", "expected"),
    [
        ("--http-endpoint", {"/metrics": 200, "/healthz": 200, "/readyz": 503}),
        ("--metrics-address", {"/metrics": 200, "/healthz": 404, "/readyz": 404}),
    ],
)
async def test_http_endpoint_modes(kubeconfig: Path, flag: str, expected: dict[str, int]) -> None:
    port = free_port()
    made: list[Prober] = []

    def factory(ctx: RuntimeContext) -> Prober:
        made.append(Prober(ctx, port))
        return made[0]

    code, _ = await go(factory, kubeconfig, f"{flag}=127.0.0.1:{port}")
    assert code == EXIT_OK
    assert made[0].results == expected


async def test_signal_during_async_factory_cancels_startup(kubeconfig: Path) -> None:
    entered = asyncio.Event()
    cancelled: list[bool] = []
    before = signal.getsignal(signal.SIGTERM)

    async def factory(ctx: RuntimeContext) -> Recorder:
        entered.set()
        try:
            await asyncio.Event().wait()  # e.g. waiting for a CSI driver that never comes
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        raise AssertionError("unreachable")

    async def send_sigterm() -> None:
        await entered.wait()
        # run_async installed its handler before calling the factory; never kill pytest itself.
        assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None)
        os.kill(os.getpid(), signal.SIGTERM)

    async with asyncio.TaskGroup() as tg:
        tg.create_task(send_sigterm())
        code, stream = await go(factory, kubeconfig)
    assert code == EXIT_OK
    assert cancelled == [True]
    find(stream, "signal received during startup: exiting")
    assert signal.getsignal(signal.SIGTERM) == before  # the previous handler is back

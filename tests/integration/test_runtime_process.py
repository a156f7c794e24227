"""pyprovlib.runtime as a real process: runtime_prog.py against the in-memory API server, with
HTTP probes over the network and real signals."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import textwrap
import time
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import aiohttp
import pytest
from run_support import run_python

from pyprovlib import testing
from pyprovlib.testing._server import ApiServer

PROG = Path(__file__).with_name("runtime_prog.py")
DEADLINE = 30.0


def clean_env() -> dict[str, str]:
    return testing.child_env()


async def http_port(prog: testing.ChildProcess) -> int:
    return int((await prog.wait_for("HTTP server listening"))["port"])


def program(*args: str) -> AbstractAsyncContextManager[testing.ChildProcess]:
    return testing.child_process(str(PROG), *args, stdout=asyncio.subprocess.PIPE)


@pytest.fixture
async def kubeconfig(apiserver: ApiServer, tmp_path: Path) -> Path:
    return apiserver.write_kubeconfig(tmp_path / "kubeconfig")


async def get(session: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    async with session.get(url) as resp:
        return resp.status, await resp.text()


async def test_probes_metrics_and_graceful_sigterm(kubeconfig: Path) -> None:
    async with (
        program(
            "--kubeconfig",
            str(kubeconfig),
            "--http-endpoint=127.0.0.1:0",
            "--log-format=json",
            "--finish-after=300ms",
        ) as prog,
        aiohttp.ClientSession() as session,
    ):
        base = f"http://127.0.0.1:{await http_port(prog)}"
        running = await prog.wait_for("controller running")
        assert running["namespaces"] >= 1  # the API client reached the in-memory server
        assert running["logger"] == "runtime-prog"

        assert await get(session, f"{base}/healthz") == (200, "ok")
        assert await get(session, f"{base}/readyz") == (200, "ok")
        status, metrics = await get(session, f"{base}/metrics")
        assert status == 200
        assert "runtime_prog_operations_total 1.0" in metrics

        prog.proc.send_signal(signal.SIGTERM)
        assert await prog.exit_code() == 0

    events = prog.events()
    order = ["stop requested", "operation finished", "stopped gracefully"]
    assert all(e in events for e in order), events
    assert [events.index(e) for e in order] == sorted(events.index(e) for e in order)
    received = prog.find("signal received: stopping gracefully")
    assert received is not None
    assert received["signal"] == "SIGTERM"


@pytest.mark.parametrize(
    ("second", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["int", "term"]
)
async def test_second_signal_exits_at_once(
    kubeconfig: Path, second: signal.Signals, code: int
) -> None:
    async with (
        program(
            "--kubeconfig",
            str(kubeconfig),
            "--http-endpoint=127.0.0.1:0",
            "--finish-after=1h",  # a stop that would never finish in time
            "--shutdown-grace-period=1h",
        ) as prog,
        aiohttp.ClientSession() as session,
    ):
        base = f"http://127.0.0.1:{await http_port(prog)}"
        await prog.wait_for("operation started")
        prog.proc.send_signal(signal.SIGTERM)
        await prog.wait_for("stop requested")

        # While stopping: still alive, no longer ready.
        assert await get(session, f"{base}/healthz") == (200, "ok")
        status, body = await get(session, f"{base}/readyz")
        assert status == 503
        assert "[-]shutdown failed: shutting down" in body

        started = time.monotonic()
        prog.proc.send_signal(second)
        assert await prog.exit_code() == code
        assert time.monotonic() - started < DEADLINE
    assert "operation finished" not in prog.events()
    line = prog.find("second signal received: cancelling in-flight work and exiting at once")
    assert line is not None
    assert line["exit_code"] == code


async def test_grace_period_expiry_cancels_and_fails(kubeconfig: Path) -> None:
    async with program(
        "--kubeconfig",
        str(kubeconfig),
        "--finish-after=1h",
        "--shutdown-grace-period=200ms",
    ) as prog:
        await prog.wait_for("operation started")
        prog.proc.send_signal(signal.SIGTERM)
        assert await prog.exit_code() == 1
    assert "shutdown grace period expired: cancelling in-flight work" in prog.events()
    assert "operation finished" not in prog.events()


async def test_controller_failure_exits_1_with_the_error(kubeconfig: Path) -> None:
    async with program("--kubeconfig", str(kubeconfig), "--fail") as prog:
        assert await prog.exit_code() == 1
    failed = prog.find("the controller failed")
    assert failed is not None
    assert failed["level"] == "error"
    assert "demo failure requested with --fail" in failed["error"]
    assert "RuntimeError" in failed["exception"]


async def test_env_configures_the_process(kubeconfig: Path) -> None:
    env_args = ["--fail"]
    # The program's own prefix, from its name (runtime-prog): pyprovlib's is not read.
    os_env = {
        "RUNTIME_PROG_KUBECONFIG": str(kubeconfig),
        "RUNTIME_PROG_LOG_LEVEL": "error",
        "PYPROVLIB_LOG_LEVEL": "debug",
    }
    code, _, err = await run_python(
        str(PROG), *env_args, timeout=DEADLINE, env={**clean_env(), **os_env}
    )
    assert code == 1
    lines = [json.loads(x) for x in err.splitlines() if x.strip()]
    # log level error from the environment: the info lines are gone, the failure remains.
    assert [line["event"] for line in lines] == ["the controller failed"]


async def test_help_lists_common_and_own_flags() -> None:
    env = {**clean_env(), "COLUMNS": "200"}
    code, text, _ = await run_python(str(PROG), "--help", timeout=DEADLINE, env=env)
    assert code == 0
    for flag in ("--kubeconfig", "--leader-election", "--http-endpoint", "--finish-after"):
        assert flag in text
    assert "RUNTIME_PROG_FINISH_AFTER" in text  # the program's own prefix
    assert "PYPROVLIB_" not in text


MY_DRIVER = """
import asyncio


class MyController:
    def __init__(self, api_client, workers):
        self.api_client = api_client
        self.workers = workers
        self._stop = asyncio.Event()

    async def run(self):
        print(f"running with {self.workers} workers", flush=True)
        await self._stop.wait()
        print("finished in-flight work", flush=True)

    def stop(self):
        self._stop.set()

    def healthy(self):
        return True

    def ready(self):
        return True
"""


def docstring_program() -> str:
    import pyprovlib.runtime

    doc = pyprovlib.runtime.__doc__ or ""
    block = doc.split("::\n\n", 1)[1]
    lines = []
    for line in block.splitlines():
        if line and not line.startswith("    "):
            break
        lines.append(line[4:])
    return textwrap.dedent("\n".join(lines))


async def test_the_docstring_program_runs(kubeconfig: Path, tmp_path: Path) -> None:
    code = docstring_program()
    assert "run(make_controller" in code
    assert len([x for x in code.splitlines() if x.strip()]) <= 12
    (tmp_path / "my_driver.py").write_text(MY_DRIVER)
    (tmp_path / "main.py").write_text(code)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(tmp_path / "main.py"),
        "--kubeconfig",
        str(kubeconfig),
        "--worker-threads=3",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**clean_env(), "PYTHONPATH": str(tmp_path)},
    )
    try:
        assert proc.stdout is not None
        first = await asyncio.wait_for(proc.stdout.readline(), DEADLINE)
        assert first.decode().strip() == "running with 3 workers"
        proc.send_signal(signal.SIGTERM)
        out, err = await asyncio.wait_for(proc.communicate(), DEADLINE)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, err.decode()
    assert out.decode().strip() == "finished in-flight work"
    assert '"event": "stopped gracefully"' in err.decode()

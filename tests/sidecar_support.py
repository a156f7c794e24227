"""What the attacher's and the resizer's tests share: their controller running once ready, the
poll they wait with, the runtime context a sidecar is built from, and the sidecar as a real
``python -m`` process against the test's cluster; for their tests with a Python CSI driver on a
unix socket, the socket's directory, the connection to the driver and the sidecar against it.

Here, at the root of ``tests/``, because ``tests/attach`` and ``tests/resize`` both use it and
pytest puts ``tests/`` (the directory of the root conftest) on ``sys.path``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import structlog
from prometheus_client import CollectorRegistry

from pyprovlib import testing
from pyprovlib.csi._connection import ConnectionOptions, CSIConnection, CSIMetrics
from pyprovlib.runtime import RuntimeContext
from pyprovlib.runtime._flags import parse_common
from pyprovlib.testing._cluster import TestCluster
from pyprovlib.testing._support import Runnable

T = TypeVar("T")
C = TypeVar("C", bound=Runnable)


def fast_values(retry_interval_max: float, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The options of a controller under test: retries from 10 ms up to
    ``retry_interval_max``, 4 workers, no resync, a 5 s timeout, a private metrics registry;
    ``overrides`` win."""
    values: dict[str, Any] = {
        "retry_interval_start": 0.01,
        "retry_interval_max": retry_interval_max,
        "workers": 4,
        "resync_period": 0.0,
        "timeout": 5.0,
        "registry": CollectorRegistry(),
    }
    values.update(overrides)
    return values


def running(controller: C) -> contextlib.AbstractAsyncContextManager[C]:
    """Run ``controller`` (or a sidecar) for the block once it is ready, then stop it
    gracefully (it must not have failed)."""
    return testing.running(controller, ready=True, stop_timeout=10)


def fast_leader_election(namespace: str) -> dict[str, Any]:
    """Controller options electing a leader on a Lease in ``namespace`` within a second, and
    noticing a lost Lease as fast."""
    return {
        "leader_election": True,
        "leader_election_namespace": namespace,
        "lease_duration": 1.0,
        "renew_deadline": 0.5,
        "retry_period": 0.1,
    }


@contextlib.asynccontextmanager
async def leading(controller: Any) -> AsyncIterator[asyncio.Task[None]]:
    """``controller.run()`` as a task, for the block once the controller leads (is ready);
    cancelled after the block unless it has ended."""
    task = asyncio.create_task(controller.run())
    try:
        await testing.eventually(controller.ready, timeout=15.0, message="leading")
        yield task
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def wait_for(
    predicate: Callable[[], Awaitable[T | None]],
    timeout: float = 15.0,
    message: str = "condition",
) -> T:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout`` seconds."""
    return await testing.eventually(predicate, timeout=timeout, message=message)


def sidecar_context(
    parser: argparse.ArgumentParser, argv: list[str], api_client: Any
) -> RuntimeContext:
    """The context ``python -m`` would build a sidecar from for ``argv``, on ``api_client``
    and a registry of its own."""
    options, args = parse_common(parser, argv)
    return RuntimeContext(
        options=options,
        args=args,
        api_client=api_client,
        log=structlog.get_logger("test"),
        registry=CollectorRegistry(),
    )


def kubeconfig_of(cluster: TestCluster, tmp_path: Path) -> Path:
    """A kubeconfig for a child process: the real cluster's, or one written for the in-memory
    server."""
    if cluster.is_real:
        assert cluster.kubeconfig is not None
        return cluster.kubeconfig
    assert cluster.server is not None
    path: Path = cluster.server.write_kubeconfig(tmp_path / "kubeconfig")
    return path


@contextlib.asynccontextmanager
async def sidecar_process(
    module: str, cluster: TestCluster, tmp_path: Path, *argv: str
) -> AsyncIterator[testing.ChildProcess]:
    """``python -m <module> --kubeconfig ... --log-format json argv...`` against ``cluster``,
    running for the block (killed after it if still running); its log collected."""
    async with testing.child_process(
        "-m",
        module,
        "--kubeconfig",
        str(kubeconfig_of(cluster, tmp_path)),
        "--log-format",
        "json",
        *argv,
    ) as child:
        yield child


@contextlib.contextmanager
def short_socket_dir() -> Iterator[Path]:
    """A fresh directory with a path short enough for a unix socket (108 bytes)."""
    directory = Path(tempfile.mkdtemp(prefix="ps-", dir="/tmp"))
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def operations_ok(registry: CollectorRegistry, driver: str, method: str) -> float | None:
    """csi-lib-utils' count of ``method`` calls (upstream's full gRPC name) to ``driver`` that
    returned OK, from ``registry``."""
    return registry.get_sample_value(
        "csi_sidecar_operations_seconds_count",
        {"driver_name": driver, "method_name": method, "grpc_status_code": "OK"},
    )


class DriverSidecar:
    """For a scenario with a Python CSI driver at ``endpoint``: a connection to the driver
    counting its calls in the scenario's ``registry``, and the sidecar ``sidecar_module`` as a
    ``python -m`` process against it. The scenario sets the attributes."""

    sidecar_module: ClassVar[str]
    cluster: TestCluster
    endpoint: str
    registry: CollectorRegistry

    async def connect(self, **options: Any) -> CSIConnection:
        """A connection to the driver (``async with`` closes it): a 5 s timeout and no exit on
        a lost connection unless ``options`` say otherwise."""
        options.setdefault("timeout", 5.0)
        options.setdefault("exit_on_connection_loss", False)
        return await CSIConnection.open(
            self.endpoint, ConnectionOptions(**options), metrics=CSIMetrics(self.registry)
        )

    def sidecar(
        self, tmp_path: Path, *argv: str
    ) -> contextlib.AbstractAsyncContextManager[testing.ChildProcess]:
        """``python -m <sidecar_module>`` on this driver, ``argv`` added."""
        return sidecar_process(
            self.sidecar_module, self.cluster, tmp_path, "--csi-address", self.endpoint, *argv
        )

    def context(self, parser: argparse.ArgumentParser, *argv: str) -> RuntimeContext:
        """The context ``python -m <sidecar_module>`` would build its sidecar from, on this
        driver with fast retries, ``argv`` added."""
        return sidecar_context(
            parser,
            ["--csi-address", self.endpoint, "--retry-interval-start", "50ms", *argv],
            self.cluster.api_client,
        )

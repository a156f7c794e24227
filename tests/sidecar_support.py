"""What the attacher's and the resizer's tests share: their controller running once ready, the
poll they wait with, the runtime context a sidecar is built from, and the sidecar as a real
``python -m`` process against the test's cluster.

Here, at the root of ``tests/``, because ``tests/attach`` and ``tests/resize`` both use it and
pytest puts ``tests/`` (the directory of the root conftest) on ``sys.path``.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import structlog
from prometheus_client import CollectorRegistry

from pyprovlib import testing
from pyprovlib.runtime import RuntimeContext
from pyprovlib.runtime._flags import parse_common
from pyprovlib.testing._cluster import TestCluster
from pyprovlib.testing._support import Runnable

T = TypeVar("T")
C = TypeVar("C", bound=Runnable)


def running(controller: C) -> contextlib.AbstractAsyncContextManager[C]:
    """Run ``controller`` (or a sidecar) for the block once it is ready, then stop it
    gracefully (it must not have failed)."""
    return testing.running(controller, ready=True, stop_timeout=10)


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

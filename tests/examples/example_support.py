"""What the example backends' tests share: their controller running with fast retries; the
classes and claims they make and the claim → PV → event waits, on kubernetes-asyncio models
(the examples' own object convention), on top of pyprovlib.testing's helpers; and the
``python -m pyprovlib.examples.<backend>`` processes their entry-point tests run."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from kubernetes_asyncio.client import (
    ApiClient,
    CoreV1Api,
    StorageV1Api,
    V1ObjectMeta,
    V1PersistentVolume,
    V1PersistentVolumeClaim,
    V1PersistentVolumeClaimSpec,
    V1StorageClass,
    V1VolumeResourceRequirements,
)
from run_support import run_python

from pyprovlib import testing
from pyprovlib._provisioner import Provisioner
from pyprovlib.controller._options import ProvisionControllerOptions
from pyprovlib.controller._provision import ProvisionController
from pyprovlib.kube._resources import PERSISTENT_VOLUMES, STORAGE_CLASSES
from pyprovlib.kube._workqueue import ItemExponentialFailureRateLimiter
from pyprovlib.testing._cluster import TestCluster


def fast_options(**kw: Any) -> ProvisionControllerOptions:
    # Retries within tens of milliseconds instead of upstream's 15 s first backoff.
    return ProvisionControllerOptions(
        leader_election=False,
        workers=2,
        rate_limiter=ItemExponentialFailureRateLimiter(0.05, 1.0),
        **kw,
    )


@contextlib.asynccontextmanager
async def running(
    client: ApiClient, name: str, provisioner: Provisioner, *, stop_timeout: float = 15, **kw: Any
) -> AsyncIterator[ProvisionController]:
    """A ProvisionController for ``provisioner`` with :func:`fast_options`, running."""
    controller = ProvisionController(client, name, provisioner, fast_options(**kw))
    async with testing.running(controller, stop_timeout=stop_timeout):
        yield controller


async def wait_bound(c: TestCluster, claim: str, timeout: float = 30) -> V1PersistentVolume:
    """Wait for ``claim`` to be Bound; return its PV."""
    bound = await testing.wait_bound(c, claim, timeout=timeout)
    return await CoreV1Api(c.api_client).read_persistent_volume(bound["spec"]["volumeName"])


async def wait_pv_gone(c: TestCluster, pv: str, timeout: float = 60) -> None:
    await testing.wait_deleted(c, PERSISTENT_VOLUMES, pv, timeout=timeout)


async def wait_event(
    c: TestCluster,
    name: str,
    reason: str,
    fragment: str,
    *,
    namespace: str | None = None,
    timeout: float = 30,
) -> str:
    """Wait for a ``reason`` event on ``name`` whose message contains ``fragment``; return
    the message."""
    event = await testing.wait_event(
        c, name, reason, fragment, namespace=namespace, timeout=timeout
    )
    return str(event.get("message"))


def claim_model(
    name: str,
    storage_class: str | None,
    size: str,
    access_modes: Iterable[str] = ("ReadWriteOnce",),
    volume_mode: str | None = None,
    **metadata: Any,
) -> V1PersistentVolumeClaim:
    """A claim of ``size`` from ``storage_class`` (None: no class named); ``metadata`` (labels,
    annotations) as :class:`V1ObjectMeta` takes it."""
    return V1PersistentVolumeClaim(
        metadata=V1ObjectMeta(name=name, **metadata),
        spec=V1PersistentVolumeClaimSpec(
            storage_class_name=storage_class,
            access_modes=list(access_modes),
            volume_mode=volume_mode,
            resources=V1VolumeResourceRequirements(requests={"storage": size}),
        ),
    )


async def create_claim(
    c: TestCluster, claim: V1PersistentVolumeClaim, namespace: str | None = None
) -> str:
    """Create ``claim`` in ``namespace`` (by default the cluster's); return its name."""
    await CoreV1Api(c.api_client).create_namespaced_persistent_volume_claim(
        namespace or c.namespace, claim
    )
    return str(claim.metadata.name)


async def create_class(c: TestCluster, prefix: str, provisioner: str, **fields: Any) -> str:
    """A uniquely named StorageClass of ``provisioner`` that deletes its volumes, removed when
    the test ends; ``fields`` as :class:`V1StorageClass` takes them. Returns its name."""
    name = c.unique_name(prefix)
    fields.setdefault("reclaim_policy", "Delete")
    await StorageV1Api(c.api_client).create_storage_class(
        V1StorageClass(metadata=V1ObjectMeta(name=name), provisioner=provisioner, **fields)
    )
    c.track(STORAGE_CLASSES, name)
    return name


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    """The process's umask is ``mask`` for the block (what the mode of a directory the
    examples make must not depend on)."""
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def tree(path: Path) -> list[str]:
    """Every path below ``path``, relative to it, sorted."""
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


# -- the entry points as processes ---------------------------------------------------------

_BACKEND_ENV_PREFIXES = ("NFS_", "CEPH_")
_BACKEND_ENV = ("NODE_NAME", "PROVISIONER_NAME")


def example_env(**extra: str) -> dict[str, str]:
    """:func:`pyprovlib.testing.child_env` without the backends' own variables either
    (``NODE_NAME``, ``NFS_SERVER``, ...): only the test configures the process. Plus
    ``extra``."""
    env = {
        k: v
        for k, v in testing.child_env().items()
        if not k.startswith(_BACKEND_ENV_PREFIXES) and k not in _BACKEND_ENV
    }
    env.update(extra)
    return env


UsageError = Callable[[Callable[[list[str]], object], list[str]], str]
"""``usage_error(main, argv)`` (the examples conftest's fixture): what ``main(argv)`` wrote to
stderr as it exited with a usage error."""


async def run_module(*argv: str, timeout: float = 60, **env: str) -> tuple[int, str, str]:
    """Run ``python argv...`` to its end in :func:`example_env` (wide help columns, plus
    ``env``); returns (exit code, stdout, stderr)."""
    return await run_python(*argv, timeout=timeout, env=example_env(COLUMNS="120", **env))


async def help_documents_every_flag(backend: str, parser: argparse.ArgumentParser) -> str:
    """``python -m pyprovlib.examples.<backend> --help`` names every long flag of ``parser``,
    and every flag but --help/--version states its default; returns the help text with its
    white space folded."""
    code, out, err = await run_module("-m", f"pyprovlib.examples.{backend}", "--help")
    assert code == 0, err
    for action in parser._actions:
        for flag in action.option_strings:
            if flag.startswith("--"):
                assert flag in out, flag
        if action.option_strings and action.dest not in ("help", "version"):
            assert "default:" in (action.help or ""), action.option_strings
    return " ".join(out.split())


@contextlib.asynccontextmanager
async def example_process(
    backend: str,
    kubeconfig: Path,
    *argv: str,
    stdout: int = asyncio.subprocess.DEVNULL,
    **env: str,
) -> AsyncIterator[testing.ChildProcess]:
    """``python -m pyprovlib.examples.<backend> --kubeconfig ... --log-format json argv...``
    running for the block, in :func:`example_env` plus ``env``; its stderr collected,
    ``stdout`` as :func:`pyprovlib.testing.child_process` takes it."""
    async with testing.child_process(
        "-m",
        f"pyprovlib.examples.{backend}",
        "--kubeconfig",
        str(kubeconfig),
        "--log-format",
        "json",
        *argv,
        env=example_env(**env),
        stdout=stdout,
    ) as child:
        yield child


async def wait_claim_bound(
    core: CoreV1Api,
    claim: str,
    namespace: str = "default",
    *,
    by: testing.ChildProcess | None = None,
    timeout: float = 30,
) -> V1PersistentVolumeClaim:
    """Wait until ``claim`` is Bound (``by`` the process, which fails the wait with its log
    when it exits first); return it."""

    async def bound() -> V1PersistentVolumeClaim | None:
        if by is not None and by.proc.returncode is not None:
            raise AssertionError(f"exited {by.proc.returncode}:\n{by.tail()}")
        pvc = await core.read_namespaced_persistent_volume_claim(claim, namespace)
        return pvc if pvc.status.phase == "Bound" else None

    return await testing.eventually(bound, timeout=timeout, message=f"claim {claim} Bound")


async def stops_on_sigterm(child: testing.ChildProcess) -> None:
    """SIGTERM stops ``child`` with exit code 0."""
    child.proc.send_signal(signal.SIGTERM)
    assert await child.exit_code() == 0, child.tail()

"""What the tests of the CSI entry points as real processes (``python -m
pyprovlib.csi.provisioner``, ``python -m pyprovlib.csi``) share: the objects they provision
(the ``csi`` StorageClass of the test driver, 1Gi claims in ``default``) and a wait that fails
at once, with the process's log, when the process exits first."""

from __future__ import annotations

import pathlib
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeVar

from csi_driver import DRIVER_NAME
from kubernetes_asyncio.client import ApiClient

from pyprovlib import testing
from pyprovlib.kube.objects import Obj
from pyprovlib.kube.resources import PERSISTENT_VOLUME_CLAIMS, STORAGE_CLASSES
from pyprovlib.kube.rest import ResourceClient

DEADLINE = 30.0
T = TypeVar("T")


def entry_point(
    module: str, kubeconfig: pathlib.Path, *args: str, terminate_timeout: float | None = None
) -> AbstractAsyncContextManager[testing.ChildProcess]:
    """``python -m <module>`` against ``kubeconfig``, logging JSON (collected) and retrying
    within tens of milliseconds, with ``args``; see :func:`pyprovlib.testing.child_process`."""
    return testing.child_process(
        "-m",
        module,
        "--kubeconfig",
        str(kubeconfig),
        "--log-format",
        "json",
        "--retry-interval-start",
        "10ms",
        "--retry-interval-max",
        "200ms",
        *args,
        terminate_timeout=terminate_timeout,
    )


async def create_class(api: ApiClient, **fields: Any) -> None:
    """The StorageClass ``csi`` of the test driver, plus ``fields``."""
    await ResourceClient(api, STORAGE_CLASSES).create(
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": "csi"},
            "provisioner": DRIVER_NAME,
            **fields,
        }
    )


async def create_claim(api: ApiClient, name: str, **spec: Any) -> ResourceClient:
    """A 1Gi ReadWriteOnce claim ``name`` of class ``csi`` in ``default`` (``spec`` adds spec
    fields); returns the claims' client."""
    claims = ResourceClient(api, PERSISTENT_VOLUME_CLAIMS)
    await claims.create(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "csi",
                "resources": {"requests": {"storage": "1Gi"}},
                **spec,
            },
        }
    )
    return claims


def status(obj: Obj) -> dict[str, Any]:
    value = obj.get("status")
    return value if isinstance(value, dict) else {}


async def until(
    probe: Callable[[], Awaitable[T | None]],
    what: str,
    process: testing.ChildProcess | None = None,
) -> T:
    """Poll ``probe`` until it returns something truthy, for :data:`DEADLINE` seconds; fails
    at once, with the log's tail, when ``process`` exits first."""

    async def check() -> T | None:
        value = await probe()
        if not value and process is not None and process.proc.returncode is not None:
            raise AssertionError(f"exited before {what}:\n{process.tail(20)}")
        return value

    return await testing.eventually(check, timeout=DEADLINE, message=what)


async def wait_claim_bound(
    claims: ResourceClient, name: str, process: testing.ChildProcess | None = None
) -> Obj:
    """Wait until the claim ``name`` in ``default`` is Bound; return it."""

    async def bound() -> Obj | None:
        claim = await claims.get(name, "default")
        return claim if status(claim).get("phase") == "Bound" else None

    return await until(bound, f"claim {name} bound", process)

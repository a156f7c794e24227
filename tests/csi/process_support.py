"""What the tests of the CSI entry points as real processes (``python -m
pyprovlib.csi.provisioner``, ``python -m pyprovlib.csi``) share: the objects they provision
(the ``csi`` StorageClass of the test driver, 1Gi claims in ``default``, the driver on
``node-1`` and attachments there), a wait that fails
at once, with the process's log, when the process exits first, and the stop of a process the
tests started themselves (the Go binaries)."""

from __future__ import annotations

import asyncio
import pathlib
import signal
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, TypeVar

import yaml
from claim_support import attachment_body, claim_body, class_body
from csi_driver import DRIVER_NAME
from kubernetes_asyncio.client import ApiClient

from pyprovlib import testing
from pyprovlib.kube import _resources as resources
from pyprovlib.kube._objects import Obj
from pyprovlib.kube._resources import (
    CSINODES,
    PERSISTENT_VOLUME_CLAIMS,
    STORAGE_CLASSES,
    VOLUME_ATTACHMENTS,
)
from pyprovlib.kube._rest import ResourceClient

DEADLINE = 30.0
T = TypeVar("T")


@dataclass(frozen=True)
class EntryPoint:
    """``python -m <module>`` with ``args`` after a test's own flags."""

    module: str
    args: tuple[str, ...] = ()

    def process(
        self, kubeconfig: pathlib.Path, *flags: str, env: Mapping[str, str] | None = None
    ) -> AbstractAsyncContextManager[testing.ChildProcess]:
        """:func:`entry_point` of this module with ``flags``, then ``args``."""
        return entry_point(self.module, kubeconfig, *flags, *self.args, env=env)


# The provisioner as the sidecar and as the combined process: a test taking the csi
# conftest's ``entry`` fixture runs on both.
PROVISIONER = EntryPoint("pyprovlib.csi.provisioner")
PROVISIONER_ENTRY_POINTS = (
    PROVISIONER,
    EntryPoint("pyprovlib.csi", ("--controllers=provisioner",)),
)


def entry_point(
    module: str,
    kubeconfig: pathlib.Path,
    *args: str,
    terminate_timeout: float | None = None,
    env: Mapping[str, str] | None = None,
) -> AbstractAsyncContextManager[testing.ChildProcess]:
    """``python -m <module>`` against ``kubeconfig``, logging JSON (collected) and retrying
    within tens of milliseconds, with ``args`` (and ``env`` added to
    :func:`pyprovlib.testing.child_env`); see :func:`pyprovlib.testing.child_process`."""
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
        env=testing.child_env(**(env or {})),
    )


async def terminate(process: asyncio.subprocess.Process, grace: float) -> None:
    """Stop ``process`` as a kubelet would: SIGTERM, then SIGKILL when it has not exited
    within ``grace`` seconds. Nothing when it has exited already."""
    if process.returncode is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        async with asyncio.timeout(grace):
            await process.wait()
    except TimeoutError:
        process.kill()
        await process.wait()


RBAC = pathlib.Path(__file__).resolve().parents[2] / "examples" / "csi-hostpath" / "rbac.yaml"


def rbac_granted() -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) of every rule of examples/csi-hostpath/rbac.yaml's roles."""
    out: set[tuple[str, str, str]] = set()
    for doc in yaml.safe_load_all(RBAC.read_text()):
        if doc and doc["kind"] in ("ClusterRole", "Role"):
            for rule in doc["rules"]:
                for group in rule["apiGroups"]:
                    for resource in rule["resources"]:
                        out.update((group, resource, verb) for verb in rule["verbs"])
    return out


def rbac_used(requests: Mapping[tuple[str, str], int]) -> set[tuple[str, str, str]]:
    """The (apiGroup, resource, verb) of requests as the in-memory server counts them
    (``server.requests.snapshot(user_agent)``)."""
    # The server counts by plural: "events" is the core group's (events.k8s.io's is not used).
    groups: dict[str, str] = {}
    for resource in sorted(resources.RESOURCES, key=lambda r: r.group != ""):
        groups.setdefault(resource.plural, resource.group)
    return {(groups[resource.partition("/")[0]], resource, verb) for verb, resource in requests}


async def create_class(api: ApiClient, **fields: Any) -> None:
    """The StorageClass ``csi`` of the test driver, plus ``fields``."""
    await ResourceClient(api, STORAGE_CLASSES).create(class_body("csi", DRIVER_NAME, **fields))


async def create_claim(api: ApiClient, name: str, **spec: Any) -> ResourceClient:
    """A 1Gi ReadWriteOnce claim ``name`` of class ``csi`` in ``default`` (``spec`` adds spec
    fields); returns the claims' client."""
    claims = ResourceClient(api, PERSISTENT_VOLUME_CLAIMS)
    await claims.create(claim_body(name, "csi", namespace="default", **spec))
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


async def register_node_1(api: ApiClient) -> None:
    """The CSINode of ``node-1``: the test driver runs there, as node ``node-1-id``."""
    await ResourceClient(api, CSINODES).create(
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "CSINode",
            "metadata": {"name": "node-1"},
            "spec": {"drivers": [{"name": DRIVER_NAME, "nodeID": "node-1-id"}]},
        }
    )


async def attach_to_node_1(
    api: ApiClient, name: str, volume: str, process: testing.ChildProcess | None = None
) -> Obj:
    """Create the VolumeAttachment ``name`` of the PV ``volume`` to ``node-1`` for the test
    driver, and wait until it is attached; return it."""
    attachments = ResourceClient(api, VOLUME_ATTACHMENTS)
    await attachments.create(attachment_body(name, DRIVER_NAME, "node-1", volume))

    async def attached() -> Obj | None:
        va = await attachments.get(name)
        return va if status(va).get("attached") else None

    return await until(attached, f"VolumeAttachment {name} attached", process)


async def wait_claim_bound(
    claims: ResourceClient, name: str, process: testing.ChildProcess | None = None
) -> Obj:
    """Wait until the claim ``name`` in ``default`` is Bound; return it."""

    async def bound() -> Obj | None:
        claim = await claims.get(name, "default")
        return claim if status(claim).get("phase") == "Bound" else None

    return await until(bound, f"claim {name} bound", process)

"""Harness for the CSIProvisioner end-to-end tests: the Python CSI driver on a unix socket, a
CSIConnection, a CSIProvisioner and a ProvisionController against a TestCluster; the Go
``hostpathplugin`` (kubernetes-csi/csi-driver-host-path, a grpc-go server) as a real peer; and
pre-provisioned VolumeSnapshots (snapshot.storage.k8s.io/v1) to restore from."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import lzma
import os
import pathlib
import shutil
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any

import claim_support
import pytest
from claim_support import class_body
from csi_driver import DriverState, Fault, serve_driver
from kubernetes_asyncio.client import ApiClient
from process_support import terminate
from prometheus_client import CollectorRegistry
from provision_support import fast_options
from task_support import informers_running
from topology_support import create_driver_node

from pyprovlib import testing
from pyprovlib.controller._provision import ProvisionController
from pyprovlib.csi._connection import ConnectionOptions, CSIConnection, CSIMetrics
from pyprovlib.csi.provisioner import CSIProvisioner, CSIProvisionerOptions
from pyprovlib.csi.provisioner._clone_controller import CloningProtectionController
from pyprovlib.kube._errors import is_not_found
from pyprovlib.kube._informer import SharedInformerFactory
from pyprovlib.kube._objects import Obj
from pyprovlib.kube._resources import (
    EVENTS,
    SECRETS,
    STORAGE_CLASSES,
    VOLUME_SNAPSHOT_CONTENTS,
    VOLUME_SNAPSHOTS,
)
from pyprovlib.kube._rest import ApiException, ResourceClient
from pyprovlib.kube._workqueue import ItemExponentialFailureRateLimiter
from pyprovlib.testing._cluster import TestCluster

# -- the Go hostpathplugin ----------------------------------------------------------------------

HOSTPATHPLUGIN = "hostpathplugin"
ASSETS_ENV = ("PYPROVLIB_KUBE_ASSETS", "KUBEBUILDER_ASSETS")
# Without an assets directory naming it: the compressed copy CI keeps beside the checkout.
SHARED_XZ = (
    pathlib.Path(__file__).resolve().parents[2].parent / "shared" / "kube" / "hostpathplugin.xz"
)
HOSTPATH_TOPOLOGY_KEY = "topology.hostpath.csi/node"


async def register_hostpath_node(api: ApiClient, driver: str, node: str) -> None:
    """The Node ``node`` labelled with the hostpath driver's topology key (its value the node's
    name, as the driver reports it) and its CSINode naming ``driver`` with that key: a Go
    sidecar finds no topology without them."""
    await create_driver_node(api, node, driver, HOSTPATH_TOPOLOGY_KEY)


def find_hostpathplugin(unpack_dir: pathlib.Path) -> pathlib.Path | None:
    """The Go hostpathplugin: from the assets directory of ``$PYPROVLIB_KUBE_ASSETS`` (or
    ``$KUBEBUILDER_ASSETS``), else unpacked from CI's compressed copy beside the checkout
    into ``unpack_dir``; None when neither exists."""
    return find_go_binary(HOSTPATHPLUGIN, unpack_dir)


def find_go_binary(name: str, unpack_dir: pathlib.Path) -> pathlib.Path | None:
    """A Go binary of the kit (``hostpathplugin``, ``csi-provisioner``, ...): from the assets
    directory of ``$PYPROVLIB_KUBE_ASSETS`` (or ``$KUBEBUILDER_ASSETS``), else unpacked from
    CI's compressed copy beside the checkout (``<name>.xz``) into ``unpack_dir``; None when
    neither exists."""
    for env in ASSETS_ENV:
        directory = os.environ.get(env)
        if directory and os.access(pathlib.Path(directory) / name, os.X_OK):
            return pathlib.Path(directory) / name
    packed = SHARED_XZ.with_name(f"{name}.xz")
    if not packed.is_file():
        return None
    target = unpack_dir / name
    if not target.exists():
        partial = unpack_dir / f"{name}.part"
        with lzma.open(packed) as src, partial.open("wb") as dst:
            shutil.copyfileobj(src, dst)
        partial.chmod(0o755)
        partial.rename(target)
    return target


@dataclass
class GoHostpath:
    """A running hostpathplugin: its endpoint, driver name, node id and state directory."""

    process: asyncio.subprocess.Process
    socket: pathlib.Path
    name: str
    node_id: str
    state_dir: pathlib.Path

    @property
    def endpoint(self) -> str:
        return str(self.socket)

    def volumes(self) -> dict[str, dict[str, Any]]:
        """The driver's volumes by id, from the state file it writes after every change."""
        path = self.state_dir / "state.json"
        for _attempt in range(1000):
            if not path.exists():
                return {}
            try:
                state = json.loads(path.read_text())
            except json.JSONDecodeError:
                # Read while the driver rewrites it in place (truncate, then write): again.
                continue
            return {v["VolID"]: v for v in state.get("Volumes") or []}
        raise AssertionError(f"{path} never held complete JSON")


@contextlib.asynccontextmanager
async def go_hostpath(
    binary: pathlib.Path,
    sock_dir: pathlib.Path,
    name: str,
    node_id: str,
    extra_args: tuple[str, ...] = (),
) -> AsyncIterator[GoHostpath]:
    """Run hostpathplugin on ``sock_dir/csi.sock`` (absolute: the Go side refuses relative
    endpoints) with attach and expansion on, and ``extra_args``; stopped (SIGTERM, then
    SIGKILL) on exit."""
    if not sock_dir.is_absolute():
        raise ValueError(f"hostpathplugin needs an absolute socket directory, not {sock_dir}")
    base = sock_dir
    socket = base / "csi.sock"
    state_dir = base / "state"
    state_dir.mkdir(exist_ok=True)
    log = (sock_dir / "hostpathplugin.log").open("wb")
    process = await asyncio.create_subprocess_exec(
        str(binary),
        f"--drivername={name}",
        f"--endpoint=unix://{socket}",
        f"--nodeid={node_id}",
        f"--statedir={state_dir}",
        "--enable-attach=true",
        "--v=3",
        *extra_args,
        stdout=log,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        async with asyncio.timeout(20):
            while not socket.exists():
                if process.returncode is not None:
                    output = (sock_dir / "hostpathplugin.log").read_text(errors="replace")
                    raise RuntimeError(f"hostpathplugin exited: {output[-2000:]}")
                await asyncio.sleep(0.05)
        yield GoHostpath(process, socket, name, node_id, state_dir)
    finally:
        await terminate(process, 10)
        log.close()


@dataclass
class Env:
    cluster: TestCluster
    driver: DriverState
    connection: CSIConnection
    provisioner: CSIProvisioner
    controller: ProvisionController
    cloning_protection: CloningProtectionController | None = None

    @property
    def name(self) -> str:
        return self.connection.driver_name


@contextlib.asynccontextmanager
async def csi_env(
    cluster: TestCluster,
    sock_dir: pathlib.Path,
    *,
    topology: bool = False,
    call_timeout: float = 5.0,
    options: CSIProvisionerOptions | None = None,
    shared_informers: bool = False,
    snapshots: bool = True,
    modify: bool = False,
    go: GoHostpath | None = None,
    state: DriverState | None = None,
    cloning_protection: bool = True,
    **controller_options: Any,
) -> AsyncIterator[Env]:
    """Driver, connection, provisioner and a running controller. ``shared_informers``: the
    provisioner reads classes, attachments, nodes from the controller's informer caches (the
    sidecar's set-up) instead of the API server. ``snapshots``: the driver declares
    CREATE_DELETE_SNAPSHOT; ``modify``: MODIFY_VOLUME. The driver gets a name of its own
    (``env.name``): on a shared cluster a fixed name would make this test's provisioner act on
    other tests' PVs. ``go``: talk to that running Go hostpathplugin instead of starting the
    Python driver (``env.driver`` is then an unused state). ``state``: the Python driver's
    state (its volumes), to serve it again after an earlier ``csi_env`` (a restart).
    ``cloning_protection``: run the cloning-protection controller beside the
    ProvisionController, as the sidecar does."""
    state = state or DriverState(
        name=go.name if go else f"{cluster.unique_name('test')}.csi.pyprovlib.io"
    )
    served = (
        contextlib.nullcontext()
        if go is not None
        else serve_driver(
            sock_dir, topology=topology, state=state, snapshots=snapshots, modify=modify
        )
    )
    async with served:
        connection = await CSIConnection.open(
            go.endpoint if go is not None else str(sock_dir / "csi.sock"),
            ConnectionOptions(timeout=call_timeout, backoff_start=0.01, backoff_max=0.05),
            metrics=CSIMetrics(None),
        )
        factory = SharedInformerFactory(cluster.api_client) if shared_informers else None
        try:
            provisioner = CSIProvisioner(
                cluster.api_client, connection, options, informer_factory=factory
            )
            settings: dict[str, Any] = {
                "rate_limiter": ItemExponentialFailureRateLimiter(0.01, 0.2),
                **controller_options,
            }
            controller = ProvisionController(
                cluster.api_client,
                connection.driver_name,
                provisioner,
                fast_options(**settings),
                informer_factory=factory,
            )
            provisioner.recorder = controller.recorder
            cloner = (
                provisioner.cloning_protection_controller(
                    controller.informer_factory,
                    rate_limiter=ItemExponentialFailureRateLimiter(0.01, 0.2),
                    registry=CollectorRegistry(),
                )
                if cloning_protection
                else None
            )
            if cloner is not None:
                controller.run_beside("cloning-protection", cloner.run)
            async with informers_running(factory), testing.running(controller):
                yield Env(cluster, state, connection, provisioner, controller, cloner)
        finally:
            connection.close()


async def create_class(env: Env, **extra: Any) -> str:
    name = env.cluster.unique_name("sc")
    body: Obj = class_body(name, env.name, **extra)
    await ResourceClient(env.cluster.api_client, STORAGE_CLASSES).create(body)
    env.cluster.track(STORAGE_CLASSES, name)
    return name


async def create_secret(env: Env, name: str, data: dict[str, str]) -> None:
    await ResourceClient(env.cluster.api_client, SECRETS).create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": env.cluster.namespace},
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
        }
    )


async def create_claim(env: Env, class_name: str, **options: Any) -> Obj:
    return await claim_support.create_claim(env.cluster, class_name, **options)


async def get_claim(env: Env, name: str) -> Obj | None:
    return await claim_support.get_claim(env.cluster, name)


async def get_volume(env: Env, name: str) -> Obj | None:
    return await claim_support.get_volume(env.cluster.api_client, name)


async def delete_claim(env: Env, name: str) -> None:
    await claim_support.delete_claim(env.cluster, name)


async def wait_bound(env: Env, name: str, timeout: float = 20.0) -> Obj:
    return await testing.wait_bound(env.cluster, name, timeout=timeout)


async def wait_volume_gone(env: Env, pv_name: str) -> None:
    async def gone() -> bool:
        return await get_volume(env, pv_name) is None

    await env.cluster.wait_for(gone, message=f"PV {pv_name} deleted")


async def events_of(env: Env, name: str) -> list[Obj]:
    return await testing.events_of(env.cluster, name)


async def all_events(env: Env) -> list[Obj]:
    events = await ResourceClient(env.cluster.api_client, EVENTS).list(env.cluster.namespace)
    return list(events["items"])


async def wait_event(env: Env, name: str, reason: str, contains: str = "") -> Obj:
    return await testing.wait_event(env.cluster, name, reason, contains)


async def failed_then_bound(
    env: Env, class_name: str, fault: Fault, contains: str
) -> tuple[Obj, Obj]:
    """A claim of ``class_name`` whose first CreateVolume fails with ``fault``, once it has a
    ProvisioningFailed event containing ``contains`` and a retry has bound it: (the claim as
    created, the event)."""
    env.driver.fail("CreateVolume", fault)
    claim = await create_claim(env, class_name)
    name = claim["metadata"]["name"]
    event = await wait_event(env, name, "ProvisioningFailed", contains)
    await wait_bound(env, name)
    return claim, event


async def set_finalizers(
    objects: ResourceClient, names: Iterable[str], finalizers: list[str] | None, namespace: str
) -> None:
    """Give each object ``names`` of ``objects`` in ``namespace`` the ``finalizers`` (None or
    empty: none), as another process would have left them."""
    for name in names:
        await objects.patch(name, {"metadata": {"finalizers": finalizers}}, namespace=namespace)


async def wait_until(env: Env, predicate: Any, message: str, timeout: float = 20.0) -> None:
    await testing.eventually(predicate, timeout=timeout, message=message)


# -- VolumeSnapshots -------------------------------------------------------------------------

SNAPSHOT_API_VERSION = "snapshot.storage.k8s.io/v1"


async def require_snapshot_crds(env: Env) -> None:
    """Skip the test on a cluster without the snapshot.storage.k8s.io/v1 CRDs."""
    try:
        await ResourceClient(env.cluster.api_client, VOLUME_SNAPSHOTS).list(
            env.cluster.namespace, limit=1
        )
    except ApiException as err:
        if is_not_found(err):
            pytest.skip("the cluster has no snapshot.storage.k8s.io/v1 VolumeSnapshot CRD")
        raise


@dataclass
class SnapshotObjects:
    """A VolumeSnapshot and the pre-provisioned VolumeSnapshotContent it binds to."""

    snapshot: str
    content: str


async def create_snapshot(
    env: Env,
    handle: str,
    *,
    restore_size: int | None = None,
    ready: bool = True,
    driver: str | None = None,
    source_volume_mode: str | None = None,
    content_annotations: dict[str, str] | None = None,
    bound: bool = True,
) -> SnapshotObjects:
    """A VolumeSnapshot of the driver's snapshot ``handle``, bound both ways to a
    pre-provisioned VolumeSnapshotContent (Retain: deleting it leaves the driver alone), with
    the statuses the snapshot controller and csi-snapshotter would write. ``driver`` defaults
    to the test's driver. ``bound=False`` names a content that does not exist, so the snapshot
    stays unbound."""
    api = env.cluster.api_client
    ns = env.cluster.namespace
    name = env.cluster.unique_name("snap")
    content_name = env.cluster.unique_name("snapcontent")
    snapshot = await ResourceClient(api, VOLUME_SNAPSHOTS).create(
        {
            "apiVersion": SNAPSHOT_API_VERSION,
            "kind": "VolumeSnapshot",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"source": {"volumeSnapshotContentName": content_name}},
        }
    )
    if not bound:
        return SnapshotObjects(name, content_name)
    spec: Obj = {
        "driver": driver or env.name,
        "deletionPolicy": "Retain",
        "source": {"snapshotHandle": handle},
        "volumeSnapshotRef": {
            "apiVersion": SNAPSHOT_API_VERSION,
            "kind": "VolumeSnapshot",
            "name": name,
            "namespace": ns,
            "uid": snapshot["metadata"]["uid"],
        },
    }
    if source_volume_mode is not None:
        spec["sourceVolumeMode"] = source_volume_mode
    await ResourceClient(api, VOLUME_SNAPSHOT_CONTENTS).create(
        {
            "apiVersion": SNAPSHOT_API_VERSION,
            "kind": "VolumeSnapshotContent",
            "metadata": {"name": content_name, "annotations": content_annotations or {}},
            "spec": spec,
        }
    )
    env.cluster.track(VOLUME_SNAPSHOT_CONTENTS, content_name)
    objects = SnapshotObjects(name, content_name)
    await set_snapshot_status(env, objects, handle=handle, ready=ready, restore_size=restore_size)
    return objects


async def set_snapshot_status(
    env: Env,
    objects: SnapshotObjects,
    *,
    handle: str,
    ready: bool,
    restore_size: int | None = None,
) -> None:
    """Write the statuses of a bound snapshot and its content (both, so a snapshot controller
    running on a real cluster copies the same values)."""
    api = env.cluster.api_client
    content_status: Obj = {"snapshotHandle": handle, "readyToUse": ready}
    snapshot_status: Obj = {"boundVolumeSnapshotContentName": objects.content, "readyToUse": ready}
    if restore_size is not None:
        content_status["restoreSize"] = restore_size
        snapshot_status["restoreSize"] = str(restore_size)
    await ResourceClient(api, VOLUME_SNAPSHOT_CONTENTS).patch(
        objects.content, {"status": content_status}, subresource="status"
    )
    await ResourceClient(api, VOLUME_SNAPSHOTS).patch(
        objects.snapshot,
        {"status": snapshot_status},
        namespace=env.cluster.namespace,
        subresource="status",
    )


async def get_snapshot(env: Env, name: str) -> Obj | None:
    try:
        return await ResourceClient(env.cluster.api_client, VOLUME_SNAPSHOTS).get(
            name, env.cluster.namespace
        )
    except ApiException as err:
        if is_not_found(err):
            return None
        raise


def snapshot_source(name: str) -> Obj:
    """A claim's ``dataSource`` naming the VolumeSnapshot ``name``."""
    return {"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": name}

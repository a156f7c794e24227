"""``python -m pyprovlib.examples.hostpath --demo``: the hostpath provisioner end to end, with no
cluster.

Starts pyprovlib.testing's in-memory API server with its PV binder (playing
kube-controller-manager), a temporary directory as basePath, a WaitForFirstConsumer
StorageClass, a Node and three claims; plays the scheduler by setting each claim's selected
node; runs the real :class:`~pyprovlib.ProvisionController` with the
node-mode provisioner; prints each claim going Pending -> Bound with its PV and directory; then
deletes one claim and shows its PV Released, deleted and its directory removed. Needs only
pyprovlib's runtime dependencies.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Callable

from kubernetes_asyncio.client import (
    ApiClient,
    CoreV1Api,
    StorageV1Api,
    V1Namespace,
    V1Node,
    V1ObjectMeta,
    V1PersistentVolumeClaim,
    V1PersistentVolumeClaimSpec,
    V1StorageClass,
    V1VolumeResourceRequirements,
)
from kubernetes_asyncio.client.exceptions import ApiException

from pyprovlib.controller._options import ProvisionControllerOptions
from pyprovlib.controller._provision import ProvisionController
from pyprovlib.examples.hostpath._provisioner import (
    DEFAULT_DIR_MODE,
    DEFAULT_PROVISIONER_NAME,
    NodeHostPathProvisioner,
)
from pyprovlib.runtime._logging import configure_logging
from pyprovlib.testing._binder import set_selected_node
from pyprovlib.testing._server import ApiServer

__all__ = ["DEMO_CLAIMS", "DEMO_TIMEOUT", "run_demo"]

DEMO_CLAIMS = 3
"""How many claims the demo provisions."""

DEMO_TIMEOUT = 30.0
"""Seconds the demo waits for every claim to be Bound."""

_NAMESPACE = "demo"
_NODE = "demo-node-1"
_CLASS = "demo-local"


async def _setup(client: ApiClient, base_path: str, claims: int) -> list[str]:
    core, storage = CoreV1Api(client), StorageV1Api(client)
    await core.create_namespace(V1Namespace(metadata=V1ObjectMeta(name=_NAMESPACE)))
    await core.create_node(
        V1Node(metadata=V1ObjectMeta(name=_NODE, labels={"kubernetes.io/hostname": _NODE}))
    )
    await storage.create_storage_class(
        V1StorageClass(
            metadata=V1ObjectMeta(name=_CLASS),
            provisioner=DEFAULT_PROVISIONER_NAME,
            parameters={"basePath": base_path},
            volume_binding_mode="WaitForFirstConsumer",
            reclaim_policy="Delete",
        )
    )
    names = [f"data-{i}" for i in range(claims)]
    for name in names:
        await core.create_namespaced_persistent_volume_claim(
            _NAMESPACE,
            V1PersistentVolumeClaim(
                metadata=V1ObjectMeta(name=name),
                spec=V1PersistentVolumeClaimSpec(
                    storage_class_name=_CLASS,
                    access_modes=["ReadWriteOnce"],
                    resources=V1VolumeResourceRequirements(requests={"storage": "1Gi"}),
                ),
            ),
        )
    return names


async def _watch_claims(
    client: ApiClient, names: list[str], wait_seconds: float, out: Callable[[str], None]
) -> bool:
    """Print each claim's phase changes until all are Bound; False on timeout."""
    core = CoreV1Api(client)
    # Every claim was created Pending (printed by run_demo); report changes from there.
    phases: dict[str, str] = dict.fromkeys(names, "Pending")
    deadline = time.monotonic() + wait_seconds
    interval = 0.02
    while True:
        listed = await core.list_namespaced_persistent_volume_claim(_NAMESPACE)
        for claim in listed.items:
            name = claim.metadata.name
            phase = (claim.status.phase if claim.status else None) or "Pending"
            if name not in names or phases.get(name) == phase:
                continue
            if phase == "Bound":
                pv = await core.read_persistent_volume(claim.spec.volume_name)
                path = pv.spec.local.path
                exists = await asyncio.to_thread(os.path.isdir, path)
                mode = (
                    f"{stat.S_IMODE((await asyncio.to_thread(os.stat, path)).st_mode):04o}"
                    if exists
                    else "missing"
                )
                out(
                    f"  claim {_NAMESPACE}/{name}: {phases.get(name, 'Pending')} -> Bound  "
                    f"(pv {pv.metadata.name}, {pv.spec.capacity['storage']}, directory {path} "
                    f"{'created, mode ' + mode if exists else 'MISSING'})"
                )
            else:
                out(f"  claim {_NAMESPACE}/{name}: {phase}")
            phases[name] = phase
        if all(phases.get(n) == "Bound" for n in names):
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(interval)
        interval = min(interval * 1.5, 0.25)


async def _delete_one(
    client: ApiClient, name: str, wait_seconds: float, out: Callable[[str], None]
) -> bool:
    """Delete one claim and follow its PV: Released, deleted, directory removed."""
    core = CoreV1Api(client)
    claim = await core.read_namespaced_persistent_volume_claim(name, _NAMESPACE)
    pv_name = claim.spec.volume_name
    path = (await core.read_persistent_volume(pv_name)).spec.local.path
    await core.delete_namespaced_persistent_volume_claim(name, _NAMESPACE)
    out(f"deleted claim {_NAMESPACE}/{name} (reclaim policy Delete)")
    seen: set[str] = set()
    deadline = time.monotonic() + wait_seconds
    while time.monotonic() < deadline:
        try:
            pv = await core.read_persistent_volume(pv_name)
        except ApiException as err:
            if err.status != 404:
                raise
            exists = await asyncio.to_thread(os.path.lexists, path)
            out(
                f"  pv {pv_name}: deleted; directory {path} "
                f"{'STILL THERE' if exists else 'removed'}"
            )
            return not exists
        phase = (pv.status.phase if pv.status else None) or "Pending"
        if phase not in seen:
            seen.add(phase)
            out(f"  pv {pv_name}: {phase}")
        await asyncio.sleep(0.05)
    return False


async def _print_failures(client: ApiClient, out: Callable[[str], None]) -> None:
    """Print the claims' warning events: what went wrong, in the controller's words."""
    events = await CoreV1Api(client).list_namespaced_event(_NAMESPACE)
    for ev in events.items:
        if ev.type == "Warning":
            out(f"  event on {ev.involved_object.name}: {ev.reason}: {ev.message}")


async def run_demo(
    *,
    claims: int = DEMO_CLAIMS,
    wait_seconds: float = DEMO_TIMEOUT,
    dir_mode: int = DEFAULT_DIR_MODE,
    out: Callable[[str], None] = print,
) -> int:
    """Run the demo; returns the process exit code (0 when every claim got Bound)."""
    # Quiet, human-readable logs: the printed lines are the demo's output.
    configure_logging("console", "warning")
    start = time.monotonic()
    base_path = await asyncio.to_thread(tempfile.mkdtemp, prefix="pyprovlib-demo-")
    try:
        async with ApiServer(binder=True) as server, server.api_client() as client:
            out(f"in-memory API server at {server.url}; basePath {base_path}")
            names = await _setup(client, base_path, claims)
            out(
                f"StorageClass {_CLASS} (provisioner {DEFAULT_PROVISIONER_NAME}, "
                f"WaitForFirstConsumer), node {_NODE}, {len(names)} claims created"
            )
            for name in names:
                out(f"  claim {_NAMESPACE}/{name}: Pending (no pod scheduled yet)")
            controller = ProvisionController(
                client,
                DEFAULT_PROVISIONER_NAME,
                NodeHostPathProvisioner(client, _NODE, dir_mode=dir_mode),
                ProvisionControllerOptions(leader_election=False, workers=2),
            )
            ok = deleted = False
            async with asyncio.TaskGroup() as tg:
                task = tg.create_task(controller.run(), name="provision-controller")
                try:
                    out(f"scheduler: selected node {_NODE} for each claim")
                    for name in names:
                        await set_selected_node(client, _NAMESPACE, name, _NODE)
                    ok = await _watch_claims(client, names, wait_seconds, out)
                    if ok:
                        deleted = await _delete_one(client, names[0], wait_seconds, out)
                    else:
                        await _print_failures(client, out)
                finally:
                    controller.stop()
                    try:
                        await asyncio.wait_for(asyncio.shield(task), 10)
                    except TimeoutError:
                        task.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await task
            listing = sorted(await asyncio.to_thread(os.listdir, base_path))
    finally:
        await asyncio.to_thread(shutil.rmtree, base_path, ignore_errors=True)
    elapsed = time.monotonic() - start
    if not ok:
        out(f"FAILED: not every claim was Bound within {wait_seconds:g}s (events above say why)")
        return 1
    if not deleted:
        out(f"FAILED: the deleted claim's volume was not cleaned up within {wait_seconds:g}s")
        return 1
    out(f"directories under basePath: {', '.join(listing)}")
    out(
        f"all {len(names)} claims Bound and one deleted again in {elapsed:.1f}s; stopped the "
        "controller and the server"
    )
    return 0

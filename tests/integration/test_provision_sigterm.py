"""Issue 9: SIGTERM during provisioning of 100 claims loses nothing and releases the Lease.

The NFS example (``python -m pyprovlib.examples.nfs``: the real runtime — flags, signals,
leader election on by default — around the real ProvisionController) runs as a child process
against the in-memory API server with its PV binder; a temporary directory stands for the
mounted export, so every asset is a directory we can count. 100 claims are created, the first
process gets SIGTERM once some PVs exist, and must exit 0 with the Lease released (empty
holderIdentity) and with no directory lacking its PV (in-flight operations finish). A second
process then takes the Lease at once and finishes the rest: every claim Bound to its own PV,
exactly one directory per PV, none without a PV.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, TypeVar

from claim_support import class_body
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException

from pyprovlib import testing
from pyprovlib.kube._config import request_json
from pyprovlib.kube._resources import NAMESPACES, STORAGE_CLASSES
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.testing._server import ApiServer

T = TypeVar("T")

PROVISIONER = "example.com/nfs-sigterm"
LEASE = PROVISIONER.replace("/", "-")
NAMESPACE = "sigterm"
CLASS = "nfs-sigterm"
CLAIMS = 100
# Some PVs must exist before the signal, many must still be missing: the client-side QPS limit
# keeps the first process from finishing everything before the signal lands, even unloaded.
SIGNAL_AFTER_PVS = 10
DEADLINE = 60.0


async def eventually(what: str, predicate: Callable[[], Awaitable[T]]) -> T:
    return await testing.eventually(predicate, timeout=DEADLINE, message=what)


Provisioner = testing.ChildProcess  # ``python -m pyprovlib.examples.nfs``, its log kept


def provisioner(kubeconfig: Path, export: Path) -> AbstractAsyncContextManager[Provisioner]:
    return testing.child_process(
        "-m",
        "pyprovlib.examples.nfs",
        "--kubeconfig",
        str(kubeconfig),
        "--provisioner-name",
        PROVISIONER,
        "--nfs-server",
        "nfs.example.test",
        "--nfs-path",
        "/exports/k8s",
        "--nfs-mount-path",
        str(export),
        "--leader-election-namespace",
        NAMESPACE,
        "--kube-api-qps",
        "40",
        "--kube-api-burst",
        "20",
        "--worker-threads",
        "4",
        "--log-format",
        "json",
    )


async def get(api: ApiClient, path: str) -> dict[str, Any]:
    return await request_json(api, "GET", path)


async def lease_holder(api: ApiClient) -> str:
    """The Lease's holderIdentity; "" when released or not created yet."""
    try:
        lease = await get(
            api, f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{LEASE}"
        )
    except ApiException as err:
        if err.status == 404:
            return ""
        raise
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


async def our_volumes(api: ApiClient) -> dict[str, dict[str, Any]]:
    """PVs whose claimRef points into the test namespace, by name."""
    listed = await get(api, "/api/v1/persistentvolumes")
    return {
        pv["metadata"]["name"]: pv
        for pv in listed.get("items") or []
        if ((pv.get("spec") or {}).get("claimRef") or {}).get("namespace") == NAMESPACE
    }


def assets(export: Path) -> set[str]:
    return {p.name for p in export.iterdir()}


def asset_of(pv: dict[str, Any]) -> str:
    return str(pv["spec"]["nfs"]["path"]).rsplit("/", 1)[-1]


async def test_sigterm_mid_provisioning_loses_nothing_and_releases_the_lease(
    apiserver_with_binder: ApiServer, tmp_path: Path
) -> None:
    kubeconfig = apiserver_with_binder.write_kubeconfig(tmp_path / "kubeconfig")
    export = tmp_path / "export"
    export.mkdir()
    async with apiserver_with_binder.api_client() as api:
        await ResourceClient(api, NAMESPACES).create({"metadata": {"name": NAMESPACE}})
        await ResourceClient(api, STORAGE_CLASSES).create(
            class_body(CLASS, PROVISIONER, reclaimPolicy="Delete")
        )

        async with provisioner(kubeconfig, export) as first:
            holder = await eventually("the first process to lead", lambda: lease_holder(api))

            gate = asyncio.Semaphore(16)

            async def create(i: int) -> None:
                async with gate:
                    await request_json(
                        api,
                        "POST",
                        f"/api/v1/namespaces/{NAMESPACE}/persistentvolumeclaims",
                        body={
                            "apiVersion": "v1",
                            "kind": "PersistentVolumeClaim",
                            "metadata": {"name": f"claim-{i:03d}"},
                            "spec": {
                                "storageClassName": CLASS,
                                "accessModes": ["ReadWriteMany"],
                                "resources": {"requests": {"storage": "1Gi"}},
                            },
                        },
                    )

            await asyncio.gather(*(create(i) for i in range(CLAIMS)))

            async def some_volumes() -> int:
                n = len(await our_volumes(api))
                return n if n >= SIGNAL_AFTER_PVS else 0

            at_signal = await eventually(f"{SIGNAL_AFTER_PVS} PVs", some_volumes)
            first.proc.send_signal(signal.SIGTERM)
            code = await first.exit_code(DEADLINE)
            assert code == 0, f"exit code {code}; log:\n{first.tail()}"
            assert any("stopped gracefully" in line for line in first.raw), first.tail()
            # Released on the way out, so a successor need not wait out the lease duration.
            assert await lease_holder(api) == "", f"Lease still held; log:\n{first.tail()}"
            assert holder

        volumes = await our_volumes(api)
        assert at_signal <= len(volumes) < CLAIMS, "the signal came after everything was done"
        # In-flight operations finished: every directory created so far has its PV.
        assert assets(export) == {asset_of(pv) for pv in volumes.values()}

        async with provisioner(kubeconfig, export) as second:

            async def all_bound() -> bool:
                claims = await get(api, f"/api/v1/namespaces/{NAMESPACE}/persistentvolumeclaims")
                items = claims.get("items") or []
                bound = [c for c in items if (c.get("status") or {}).get("phase") == "Bound"]
                return len(bound) == CLAIMS

            try:
                await eventually(f"all {CLAIMS} claims Bound", all_bound)
            except AssertionError as err:
                raise AssertionError(f"{err}; second process log:\n{second.tail()}") from None
            second.proc.send_signal(signal.SIGTERM)
            code = await second.exit_code(DEADLINE)
            assert code == 0, f"exit code {code}; log:\n{second.tail()}"
            assert await lease_holder(api) == ""

        claims = await get(api, f"/api/v1/namespaces/{NAMESPACE}/persistentvolumeclaims")
        volumes = await our_volumes(api)
        assert len(volumes) == CLAIMS
        for claim in claims["items"]:
            pv = volumes[claim["spec"]["volumeName"]]
            assert pv["spec"]["claimRef"]["uid"] == claim["metadata"]["uid"]
            assert pv["metadata"]["name"] == f"pvc-{claim['metadata']['uid']}"
        # Exactly one directory per PV, none without a PV.
        directories = sorted(p.name for p in export.iterdir())
        assert len(directories) == CLAIMS
        assert set(directories) == {asset_of(pv) for pv in volumes.values()}

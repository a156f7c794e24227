"""An inventory of what a test run leaves in a cluster: the objects of the kinds our tests
create, as ``kind namespace/name`` strings, so the run can compare the end with the start and
fail on anything new that is still there (a test suite pointed at a shared cluster must leave
nothing behind)."""

from __future__ import annotations

import asyncio
import time

from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException

from pyprovlib.testing._binder import HttpTransport

# (kind, collection path); namespaced collections are listed across all namespaces.
KINDS: tuple[tuple[str, str], ...] = (
    ("Namespace", "/api/v1/namespaces"),
    ("PersistentVolume", "/api/v1/persistentvolumes"),
    ("PersistentVolumeClaim", "/api/v1/persistentvolumeclaims"),
    ("Pod", "/api/v1/pods"),
    ("VolumeAttachment", "/apis/storage.k8s.io/v1/volumeattachments"),
    ("StorageClass", "/apis/storage.k8s.io/v1/storageclasses"),
    ("CSIDriver", "/apis/storage.k8s.io/v1/csidrivers"),
    ("CSIStorageCapacity", "/apis/storage.k8s.io/v1/csistoragecapacities"),
    ("VolumeAttributesClass", "/apis/storage.k8s.io/v1/volumeattributesclasses"),
    ("Lease", "/apis/coordination.k8s.io/v1/leases"),
    ("VolumeSnapshot", "/apis/snapshot.storage.k8s.io/v1/volumesnapshots"),
    ("VolumeSnapshotContent", "/apis/snapshot.storage.k8s.io/v1/volumesnapshotcontents"),
    ("VolumeSnapshotClass", "/apis/snapshot.storage.k8s.io/v1/volumesnapshotclasses"),
)
# Made by the cluster itself, not by tests: node heartbeats.
_IGNORED_NAMESPACES = {"kube-node-lease"}


async def inventory(api: ApiClient) -> set[str]:
    """Every object of :data:`KINDS` in the cluster (kinds the cluster does not serve are
    left out)."""
    http = HttpTransport(api)
    found: set[str] = set()
    for kind, path in KINDS:
        try:
            listing = await http.json("GET", path)
        except ApiException as err:
            if err.status == 404:
                continue
            raise
        for item in listing.get("items") or []:
            meta = item.get("metadata") or {}
            namespace = meta.get("namespace") or ""
            if namespace in _IGNORED_NAMESPACES:
                continue
            found.add(f"{kind} {namespace + '/' if namespace else ''}{meta.get('name')}")
    return found


async def left_behind(api: ApiClient, before: set[str], *, within: float = 120.0) -> list[str]:
    """What is in the cluster now that was not in ``before``, after waiting up to
    ``within`` seconds for deletions in progress (namespaces terminating, PVs released) to
    end."""
    deadline = time.monotonic() + within
    while True:
        new = sorted((await inventory(api)) - before)
        if not new or time.monotonic() > deadline:
            return new
        await asyncio.sleep(1.0)

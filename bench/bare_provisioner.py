"""The bare peer of ``library_real.py``: the library path's work through kubernetes-asyncio
alone, with the fewest moving parts, to measure what the libraries cost on that very work.

It does what ``python -m pyprovlib.examples.nfs`` does for the bench's claims and nothing else:

- a LIST + WATCH of PersistentVolumeClaims and one of PersistentVolumes, each line read from
  the response (aiohttp's ``StreamReader.readline``) and decoded with ``json.loads``, exactly
  as pyprovlib's ``WatchStream`` does;
- a claim of the bench's class (pre-annotated for ``pyprovlib.io/nfs``, no volume yet):
  a ``Provisioning`` Event, the directory made in a worker thread, the PV POSTed, a
  ``ProvisioningSucceeded`` Event — the calls and the thread trip the NFS example makes;
- a Released PV of ours with reclaim policy Delete: the directory archived (renamed, the
  example's default) in a worker thread, the PV DELETEd with a UID precondition.

``--threadiness`` workers take claims and PVs from one ``asyncio.Queue``, 4 writers the
Events from another (pyprovlib's controllers have 4 event writers). What it leaves out is
what a controller library adds: work queues of keys, retries and rate limits, caches and
indexes, expectations, metrics, logs, event correlation, leader election, validation,
finalizers. Each request goes
through ``ApiClient.request`` with ``_preload_content=False`` (no model conversion), as
pyprovlib's ``ResourceClient`` does. Not a provisioner anyone should run: errors end it.

Usage (library_real.py starts it as the ``bare`` peer)::

    python bench/bare_provisioner.py --kubeconfig FILE --export DIR [--threadiness 32]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

PROVISIONER = "pyprovlib.io/nfs"
CLASS = "bench-py-nfs"
ANN_STORAGE_PROVISIONER = "volume.kubernetes.io/storage-provisioner"
ANN_PROVISIONED_BY = "pv.kubernetes.io/provisioned-by"
EVENT_WRITERS = 4
HEADERS = {"Accept": "application/json", "Content-Type": "application/json"}
WATCH = [("watch", "true"), ("allowWatchBookmarks", "true")]


class Bare:
    def __init__(self, api: Any, host: str, export: Path) -> None:
        self.api = api
        self.host = host
        self.export = export
        self.work: asyncio.Queue[Any] = asyncio.Queue()  # coroutine functions and arguments
        self.events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()  # Event bodies to POST
        self.claims: set[str] = set()  # UIDs of claims provisioned (until they are deleted)
        self.volumes: set[str] = set()  # UIDs of PVs being or already deleted

    async def worker(self) -> None:
        while True:
            function, *arguments = await self.work.get()
            await function(*arguments)

    async def writer(self) -> None:
        while True:
            body = await self.events.get()
            await self.request(
                "POST", f"/api/v1/namespaces/{body['metadata']['namespace']}/events", body
            )

    async def request(self, method: str, path: str, body: Any = None) -> Any:
        response = await self.api.request(
            method,
            self.host + path,
            query_params=[],
            headers=HEADERS,
            body=body,
            _preload_content=False,
        )
        try:
            data = await response.read()
            if response.status == 404 and method == "DELETE":
                return None
            if response.status >= 400:
                raise RuntimeError(f"{method} {path}: {response.status} {data[:300]!r}")
            return json.loads(data)
        finally:
            response.release()

    async def watch(self, path: str, handle: Any) -> None:
        """LIST, then WATCH from the list's resourceVersion; relist when the watch fails."""
        while True:
            listed = await self.request("GET", path)
            for obj in listed["items"]:
                handle("ADDED", obj)
            version = listed["metadata"]["resourceVersion"]
            with contextlib.suppress(OSError, asyncio.TimeoutError, RuntimeError):
                while True:
                    response = await self.api.request(
                        "GET",
                        self.host + path,
                        query_params=[*WATCH, ("resourceVersion", version)],
                        headers=HEADERS,
                        _preload_content=False,
                    )
                    try:
                        while line := await response.content.readline():
                            event = json.loads(line.decode("utf-8"))
                            if event["type"] == "ERROR":
                                raise RuntimeError(f"watch {path}: {event['object']}")
                            obj = event["object"]
                            version = obj["metadata"]["resourceVersion"]
                            if event["type"] != "BOOKMARK":
                                handle(event["type"], obj)
                    finally:
                        response.close()

    # -- claims ----------------------------------------------------------------------------------

    def on_claim(self, kind: str, claim: dict[str, Any]) -> None:
        meta = claim["metadata"]
        if kind == "DELETED":
            self.claims.discard(meta["uid"])
            return
        spec = claim.get("spec") or {}
        if (
            spec.get("volumeName")
            or meta.get("deletionTimestamp")
            or spec.get("storageClassName") != CLASS
            or (meta.get("annotations") or {}).get(ANN_STORAGE_PROVISIONER) != PROVISIONER
            or meta["uid"] in self.claims
        ):
            return
        self.claims.add(meta["uid"])
        self.work.put_nowait((self.provision, claim))

    async def provision(self, claim: dict[str, Any]) -> None:
        meta = claim["metadata"]
        namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
        pv_name = f"pvc-{uid}"
        self.event(
            claim,
            "Provisioning",
            f'External provisioner is provisioning volume for claim "{namespace}/{name}"',
        )
        directory = f"{namespace}-{name}-{pv_name}"
        await asyncio.to_thread(os.mkdir, self.export / directory, 0o777)
        await self.request("POST", "/api/v1/persistentvolumes", _pv(pv_name, claim, directory))
        self.event(claim, "ProvisioningSucceeded", f"Successfully provisioned volume {pv_name}")

    def event(self, claim: dict[str, Any], reason: str, message: str) -> None:
        meta = claim["metadata"]
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "kind": "PersistentVolumeClaim",
                "apiVersion": "v1",
                "namespace": meta["namespace"],
                "name": meta["name"],
                "uid": meta["uid"],
                "resourceVersion": meta["resourceVersion"],
            },
            "reason": reason,
            "message": message,
            "type": "Normal",
            "source": {"component": f"{PROVISIONER}_bare"},
            "reportingComponent": f"{PROVISIONER}_bare",
            "reportingInstance": "",
            "count": 1,
            "firstTimestamp": now,
            "lastTimestamp": now,
        }
        self.events.put_nowait(body)

    # -- volumes ---------------------------------------------------------------------------------

    def on_volume(self, kind: str, volume: dict[str, Any]) -> None:
        meta = volume["metadata"]
        if kind == "DELETED":
            self.volumes.discard(meta["uid"])
            return
        if (
            (volume.get("status") or {}).get("phase") != "Released"
            or (volume.get("spec") or {}).get("persistentVolumeReclaimPolicy") != "Delete"
            or meta.get("deletionTimestamp")
            or (meta.get("annotations") or {}).get(ANN_PROVISIONED_BY) != PROVISIONER
            or meta["uid"] in self.volumes
        ):
            return
        self.volumes.add(meta["uid"])
        self.work.put_nowait((self.delete, volume))

    async def delete(self, volume: dict[str, Any]) -> None:
        meta = volume["metadata"]
        directory = Path(volume["spec"]["nfs"]["path"]).name
        await asyncio.to_thread(
            os.rename, self.export / directory, self.export / f"archived-{directory}"
        )
        await self.request(
            "DELETE",
            f"/api/v1/persistentvolumes/{meta['name']}",
            {
                "kind": "DeleteOptions",
                "apiVersion": "v1",
                "preconditions": {"uid": meta["uid"]},
            },
        )


def _pv(name: str, claim: dict[str, Any], directory: str) -> dict[str, Any]:
    meta = claim["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name, "annotations": {ANN_PROVISIONED_BY: PROVISIONER}},
        "spec": {
            "capacity": {"storage": claim["spec"]["resources"]["requests"]["storage"]},
            "accessModes": claim["spec"]["accessModes"],
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": CLASS,
            "volumeMode": "Filesystem",
            "claimRef": {
                "kind": "PersistentVolumeClaim",
                "apiVersion": "v1",
                "namespace": meta["namespace"],
                "name": meta["name"],
                "uid": meta["uid"],
                "resourceVersion": meta["resourceVersion"],
            },
            "nfs": {"server": "127.0.0.1", "path": f"/export/{directory}"},
        },
    }


async def main(args: argparse.Namespace) -> None:
    # kubernetes-asyncio's client package imports its ~830 generated modules (~70 MB); pyprovlib
    # loads them on first use, as its entry points do. The bare peer does too, so memory and
    # the cyclic collector's work compare on equal terms.
    import pyprovlib

    pyprovlib.enable_lazy_kubernetes_imports()
    from kubernetes_asyncio import config
    from kubernetes_asyncio.client import ApiClient, Configuration

    configuration = Configuration()
    await config.load_kube_config(config_file=args.kubeconfig, client_configuration=configuration)
    async with ApiClient(configuration) as api:
        bare = Bare(api, str(configuration.host), Path(args.export))
        tasks = [
            asyncio.create_task(bare.watch("/api/v1/persistentvolumeclaims", bare.on_claim)),
            asyncio.create_task(bare.watch("/api/v1/persistentvolumes", bare.on_volume)),
            *(asyncio.create_task(bare.worker()) for _ in range(args.threadiness)),
            *(asyncio.create_task(bare.writer()) for _ in range(EVENT_WRITERS)),
        ]
        try:  # any failure ends the process: the bench sees it exit
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()
        finally:
            for task in tasks:
                task.cancel()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--export", required=True)
    parser.add_argument("--threadiness", type=int, default=32)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main(parser.parse_args()))

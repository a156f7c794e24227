"""The PV binder's concurrent workers: a key is never synced by two workers at once (a key
changed mid-sync is synced again afterwards), static binding never gives one volume to two
claims, and the binder's client resolves its proxy once instead of per request."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
from kubernetes_asyncio.client import ApiClient

from pyprovlib import testing
from pyprovlib.kube._config import request_json
from pyprovlib.testing._binder import PVBinder
from pyprovlib.testing._server import ApiServer

T = TypeVar("T")
NS = "workers"


async def eventually(what: str, predicate: Callable[[], Awaitable[T]]) -> T:
    return await testing.eventually(predicate, timeout=20, message=what)


class WatchedBinder(PVBinder):
    """Records every key's overlapping syncs; each sync yields so overlaps would show."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.active: set[tuple[str, str]] = set()
        self.overlaps: list[tuple[str, str]] = []
        self.syncs: dict[tuple[str, str], int] = {}

    async def _sync(self, key: tuple[str, str]) -> None:
        if key in self.active:
            self.overlaps.append(key)
        self.active.add(key)
        self.syncs[key] = self.syncs.get(key, 0) + 1
        try:
            await asyncio.sleep(0.001)
            await super()._sync(key)
        finally:
            self.active.discard(key)


def claim(name: str, cls: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "storageClassName": cls,
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }


async def test_workers_never_sync_one_key_twice_at_once(apiserver: ApiServer) -> None:
    async with apiserver.api_client() as client, apiserver.api_client() as binder_client:
        binder = WatchedBinder(binder_client, workers=8)
        await binder.start()
        try:
            await request_json(
                client, "POST", "/api/v1/namespaces", body={"metadata": {"name": NS}}
            )
            await request_json(
                client,
                "POST",
                "/apis/storage.k8s.io/v1/storageclasses",
                body={"metadata": {"name": "fast"}, "provisioner": "example.com/p"},
            )
            path = f"/api/v1/namespaces/{NS}/persistentvolumeclaims"
            await asyncio.gather(
                *(
                    request_json(client, "POST", path, body=claim(f"c{i}", "fast"))
                    for i in range(40)
                )
            )
            # Label every claim repeatedly while the binder annotates them: each change
            # re-enqueues a key that may be mid-sync.
            for round_ in range(3):
                await asyncio.gather(
                    *(
                        request_json(
                            client,
                            "PATCH",
                            f"{path}/c{i}",
                            body={"metadata": {"labels": {"round": str(round_)}}},
                            content_type="application/merge-patch+json",
                        )
                        for i in range(40)
                    )
                )

            async def annotated() -> bool:
                listed = await request_json(client, "GET", path)
                return (
                    all(
                        "volume.kubernetes.io/storage-provisioner"
                        in (c["metadata"].get("annotations") or {})
                        and c["metadata"].get("labels", {}).get("round") == "2"
                        for c in listed["items"]
                    )
                    and len(listed["items"]) == 40
                )

            await eventually("every claim annotated", annotated)
        finally:
            await binder.stop()
    assert binder.overlaps == []
    assert len(binder.syncs) >= 40


async def test_static_binding_gives_one_volume_to_one_claim(
    apiserver_with_binder: ApiServer,
) -> None:
    async with apiserver_with_binder.api_client() as client:
        await request_json(client, "POST", "/api/v1/namespaces", body={"metadata": {"name": NS}})
        await request_json(
            client,
            "POST",
            "/api/v1/persistentvolumes",
            body={
                "metadata": {"name": "pv-static"},
                "spec": {
                    "storageClassName": "manual",
                    "capacity": {"storage": "1Gi"},
                    "accessModes": ["ReadWriteOnce"],
                    "hostPath": {"path": "/tmp/pv-static"},
                },
            },
        )

        async def available() -> bool:
            pv = await request_json(client, "GET", "/api/v1/persistentvolumes/pv-static")
            return (pv.get("status") or {}).get("phase") == "Available"

        await eventually("the volume Available", available)
        path = f"/api/v1/namespaces/{NS}/persistentvolumeclaims"
        await asyncio.gather(
            *(request_json(client, "POST", path, body=claim(f"c{i}", "manual")) for i in range(8))
        )

        async def one_bound() -> list[dict[str, Any]]:
            listed = await request_json(client, "GET", path)
            return [c for c in listed["items"] if (c.get("status") or {}).get("phase") == "Bound"]

        await eventually("a claim Bound", one_bound)
        # Every claim seen and synced since (none waiting to retry): had another one been
        # (wrongly) given the volume, it would be Bound by now.
        binder = apiserver_with_binder.binder
        assert binder is not None
        listed = await request_json(client, "GET", path)
        kind = {"apiVersion": "v1", "kind": "PersistentVolumeClaim"}
        written = [{**kind, **c} for c in listed["items"]]
        await testing.wait_idle(binder, *written, count_delayed=True)
        bound = await one_bound()
        pv = await request_json(client, "GET", "/api/v1/persistentvolumes/pv-static")
    assert len(bound) == 1
    assert bound[0]["spec"]["volumeName"] == "pv-static"
    assert pv["spec"]["claimRef"]["uid"] == bound[0]["metadata"]["uid"]


def test_workers_must_be_positive() -> None:
    with pytest.raises(ValueError, match="workers"):
        PVBinder(None, workers=0)


async def test_binder_client_resolves_its_proxy_once(apiserver: ApiServer) -> None:
    # A plain kubernetes-asyncio client (apiserver.api_client() resolves its proxy already).
    async with ApiClient(configuration=apiserver.configuration()) as client:
        assert client.rest_client.pool_manager.trust_env is True  # kubernetes-asyncio's default
        PVBinder(client)
        assert client.rest_client.pool_manager.trust_env is False
        assert not client.rest_client.proxy  # loopback: never proxied

"""The PV binder's idle()/caught_up(): what wait_idle needs to make "the binder did not do X" a
deterministic assertion instead of a sleep."""

from __future__ import annotations

from typing import Any

from pyprovlib.kube._config import request_json
from pyprovlib.testing._binder import ANN_STORAGE_PROVISIONER, PVBinder
from pyprovlib.testing._server import ApiServer
from pyprovlib.testing._support import wait_idle

NS = "idle"


def claim(name: str, cls: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "1Gi"}},
    }
    if cls is not None:
        spec["storageClassName"] = cls
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": spec,
    }


async def test_caught_up_follows_the_binder_cache(apiserver: ApiServer) -> None:
    async with apiserver.api_client() as client, apiserver.api_client() as binder_client:
        await request_json(client, "POST", "/api/v1/namespaces", body={"metadata": {"name": NS}})
        written = await request_json(
            client,
            "POST",
            f"/api/v1/namespaces/{NS}/persistentvolumeclaims",
            body=claim("seen", "fast"),
        )
        binder = PVBinder(binder_client)
        # Not started: it has seen nothing, and has nothing to do.
        assert not binder.caught_up(written)
        assert binder.idle()
        # Kinds it does not watch never hold a wait up.
        assert binder.caught_up({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {}})
        async with binder:
            await wait_idle(binder, written, timeout=20)
            assert binder.caught_up(written)
            later = {**written, "metadata": {**written["metadata"], "resourceVersion": "999999"}}
            assert not binder.caught_up(later)


async def test_a_claim_without_a_class_is_left_alone_once_the_binder_is_idle(
    apiserver: ApiServer,
) -> None:
    async with apiserver.api_client() as client, apiserver.api_client() as binder_client:
        await request_json(client, "POST", "/api/v1/namespaces", body={"metadata": {"name": NS}})
        await request_json(
            client,
            "POST",
            "/apis/storage.k8s.io/v1/storageclasses",
            body={"metadata": {"name": "fast"}, "provisioner": "example.com/p"},
        )
        async with PVBinder(binder_client) as binder:
            classless = await request_json(
                client,
                "POST",
                f"/api/v1/namespaces/{NS}/persistentvolumeclaims",
                body=claim("classless", ""),
            )
            wanted = await request_json(
                client,
                "POST",
                f"/api/v1/namespaces/{NS}/persistentvolumeclaims",
                body=claim("wanted", "fast"),
            )
            await wait_idle(binder, classless, wanted, timeout=20)
            path = f"/api/v1/namespaces/{NS}/persistentvolumeclaims"
            got = await request_json(client, "GET", f"{path}/classless")
            assert ANN_STORAGE_PROVISIONER not in (got["metadata"].get("annotations") or {})
            assert got["status"]["phase"] == "Pending"
            # The same wait is long enough for a claim the binder does act on.
            got = await request_json(client, "GET", f"{path}/wanted")
            assert got["metadata"]["annotations"][ANN_STORAGE_PROVISIONER] == "example.com/p"

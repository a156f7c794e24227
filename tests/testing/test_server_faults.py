"""Fault injection, latency, request counters, restart and the standalone module of
pyprovlib.testing.ApiServer."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path

import aiohttp
import pytest
from api_support import error_body
from claim_support import claim_body, class_body
from kubernetes_asyncio.client import ApiClient, CoreV1Api, StorageV1Api
from kubernetes_asyncio.client.exceptions import ApiException
from run_support import run_python
from standalone_support import first_line, standalone

from pyprovlib import testing
from pyprovlib.kube._errors import is_conflict, retry_after_seconds
from pyprovlib.testing._server import ApiServer

CLAIM = {
    "metadata": {"name": "c"},
    "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
}


async def test_fail_next_requests_matching(apiserver: ApiServer, kube_client: ApiClient) -> None:
    v1 = CoreV1Api(kube_client)
    apiserver.faults.fail(500, verb="create", resource="persistentvolumeclaims", count=2)
    for _ in range(2):
        with pytest.raises(ApiException) as e:
            await v1.create_namespaced_persistent_volume_claim("default", CLAIM)
        assert e.value.status == 500
        body = error_body(e.value)
        assert (body["kind"], body["reason"]) == ("Status", "InternalError")
    # other verbs/resources are untouched, and the third create goes through
    await v1.list_namespaced_config_map("default")
    await v1.create_namespaced_persistent_volume_claim("default", CLAIM)
    assert apiserver.requests.count("create", "persistentvolumeclaims") == 3


async def test_429_503_409_faults(apiserver: ApiServer, kube_client: ApiClient) -> None:
    v1 = CoreV1Api(kube_client)
    apiserver.faults.fail(429, verb="list", retry_after=7)
    with pytest.raises(ApiException) as e:
        await v1.list_namespace()
    assert e.value.status == 429
    assert retry_after_seconds(e.value) == 7
    assert error_body(e.value)["details"]["retryAfterSeconds"] == 7

    apiserver.faults.fail(503, resource="namespaces", verb="get", name="default")
    with pytest.raises(ApiException) as e:
        await v1.read_namespace("default")
    assert e.value.status == 503
    assert error_body(e.value)["reason"] == "ServiceUnavailable"
    await v1.read_namespace("kube-system")

    await v1.create_namespaced_persistent_volume_claim("default", CLAIM)
    apiserver.faults.fail(409, verb="patch", resource="persistentvolumeclaims/status")
    with pytest.raises(ApiException) as e:
        await v1.patch_namespaced_persistent_volume_claim_status(
            "c", "default", {"status": {"phase": "Bound"}}
        )
    assert is_conflict(e.value)
    # the main resource is a different counter key and is not affected
    await v1.patch_namespaced_persistent_volume_claim(
        "c", "default", {"metadata": {"labels": {"a": "b"}}}
    )

    apiserver.faults.fail(500, namespace="kube-system", count=None)
    for _ in range(3):
        with pytest.raises(ApiException):
            await v1.list_namespaced_config_map("kube-system")
    apiserver.faults.clear()
    await v1.list_namespaced_config_map("kube-system")


async def test_latency(apiserver: ApiServer, kube_client: ApiClient) -> None:
    v1 = CoreV1Api(kube_client)
    apiserver.faults.latency(0.3, verb="get", resource="namespaces", count=1)
    start = time.monotonic()
    await v1.read_namespace("default")
    assert time.monotonic() - start >= 0.3
    start = time.monotonic()
    await v1.read_namespace("default")
    assert time.monotonic() - start < 0.3


async def test_latency_matches_like_a_failure(apiserver: ApiServer, kube_client: ApiClient) -> None:
    """Latency takes the same match as a failure: here one object by name, every time."""
    v1 = CoreV1Api(kube_client)
    apiserver.faults.latency(0.3, verb="get", resource="namespaces", name="default")
    for _ in range(2):
        start = time.monotonic()
        await v1.read_namespace("kube-system")
        assert time.monotonic() - start < 0.3
        start = time.monotonic()
        await v1.read_namespace("default")
        assert time.monotonic() - start >= 0.3
    apiserver.faults.clear()
    start = time.monotonic()
    await v1.read_namespace("default")
    assert time.monotonic() - start < 0.3


async def test_counters_snapshot_reset_and_user_agents(apiserver: ApiServer) -> None:
    async with apiserver.api_client() as client:
        client.user_agent = "pyprovlib-test/1.0"
        v1 = CoreV1Api(client)
        await v1.list_namespace()
        await v1.create_namespaced_persistent_volume_claim("default", CLAIM)
        await v1.read_namespaced_persistent_volume_claim_status("c", "default")
        with pytest.raises(ApiException):
            await v1.read_namespaced_persistent_volume_claim("missing", "default")
        await StorageV1Api(client).list_storage_class()
    snap = apiserver.requests.snapshot()
    assert snap[("list", "namespaces")] == 1
    assert snap[("create", "persistentvolumeclaims")] == 1
    assert snap[("get", "persistentvolumeclaims/status")] == 1
    assert snap[("get", "persistentvolumeclaims")] == 1
    assert snap[("list", "storageclasses")] == 1
    assert apiserver.requests.count(verb="get") == 2
    assert apiserver.requests.count(resource="persistentvolumeclaims") == 2
    assert apiserver.requests.user_agents[-1] == "pyprovlib-test/1.0"
    apiserver.requests.reset()
    assert apiserver.requests.count() == 0


async def test_restart_keeps_state_and_ends_watches(apiserver: ApiServer) -> None:
    async with apiserver.api_client() as client:
        v1 = CoreV1Api(client)
        await v1.create_namespaced_persistent_volume_claim("default", CLAIM)
        port = apiserver.port
        async with (
            aiohttp.ClientSession() as session,
            session.get(
                apiserver.url + "/api/v1/persistentvolumeclaims", params={"watch": "1"}
            ) as resp,
        ):
            assert (await resp.content.readline()).startswith(b'{"type":"ADDED"')
            await apiserver.restart()
            assert await asyncio.wait_for(resp.content.read(), 5) == b""
        assert apiserver.port == port
        got = await v1.read_namespaced_persistent_volume_claim("c", "default")
        assert got.metadata.name == "c"
        assert apiserver.requests.count("watch", "persistentvolumeclaims") == 1


async def test_internal_errors_become_500_and_server_survives(apiserver: ApiServer) -> None:
    async with aiohttp.ClientSession() as session:
        # a body that is JSON but not an object cannot crash the server
        configmaps = apiserver.url + "/api/v1/namespaces/default/configmaps"
        for method, url, body in (
            ("POST", configmaps, b"[1, 2]"),
            ("PUT", configmaps + "/x", b'"str"'),
        ):
            async with session.request(
                method, url, data=body, headers={"Content-Type": "application/json"}
            ) as resp:
                assert resp.status == 400, (method, body)
        async with session.get(apiserver.url + "/healthz") as resp:
            assert resp.status == 200


async def test_standalone_module(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    async with standalone(kubeconfig, "--port", "0", "--no-binder") as server:
        assert server.port > 0
        config = json.loads(kubeconfig.read_text())
        assert config["clusters"][0]["cluster"]["server"] == server.url
        async with (
            aiohttp.ClientSession() as session,
            session.get(server.url + "/api/v1/namespaces") as r,
        ):
            assert r.status == 200
            assert len((await r.json())["items"]) == 4
        server.child.proc.send_signal(signal.SIGTERM)
        assert await server.child.exit_code(10) == 0


async def test_binder_in_its_own_process_binds_claims(tmp_path: Path) -> None:
    """``--binder-only`` runs the PV binder against a server in another process."""
    kubeconfig = tmp_path / "kubeconfig"
    async with (
        standalone(kubeconfig, "--no-binder") as server,
        testing.child_process(
            "-m",
            "pyprovlib.testing",
            "--binder-only",
            "--kubeconfig",
            str(kubeconfig),
            stdout=asyncio.subprocess.PIPE,
        ) as binder,
    ):
        started = await first_line(binder)
        assert f"PV binder running against {server.url}" in started
        url = server.url
        async with aiohttp.ClientSession() as session:
            sc = class_body("ext", "example.com/ext")
            async with session.post(url + "/apis/storage.k8s.io/v1/storageclasses", json=sc) as r:
                assert r.status == 201
            claim = claim_body("c1", "ext", namespace="default")
            claims = url + "/api/v1/namespaces/default/persistentvolumeclaims"
            async with session.post(claims, json=claim) as r:
                assert r.status == 201

            # The binder (another process) annotates the claim for the external provisioner.
            async def annotated() -> str | None:
                async with session.get(claims + "/c1") as r:
                    annotations = (await r.json())["metadata"].get("annotations") or {}
                return annotations.get("volume.kubernetes.io/storage-provisioner")

            provisioner = await testing.eventually(annotated, timeout=20, message="annotated")
            assert provisioner == "example.com/ext"
        binder.proc.send_signal(signal.SIGTERM)
        assert await binder.exit_code(10) == 0


async def test_binder_only_needs_a_kubeconfig() -> None:
    code, _, err = await run_python("-m", "pyprovlib.testing", "--binder-only", timeout=20)
    assert code == 2
    assert "--binder-only needs --kubeconfig" in err

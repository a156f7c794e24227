"""Provisioning through the CSI path takes one attempt, and one CreateVolume, per claim.

A cProfile of the CSI bench showed CSIProvisioner.provision and CSIConnection.create_volume
with ~2 ``ncalls`` per volume but grpclib's send_request with 1, which read like half the
attempts failing before the request was sent and being retried. They were not: cProfile counts
every resumption of a coroutine as a call (an async function suspended once shows 2). These
tests pin the real counts at the bench's concurrency, from what the controller, the connection
and the driver each record, so a retry that costs CPU without showing in the driver's figures
(a call failing before it is sent, a retryable error returned first) fails them.
"""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
from collections import Counter

import pytest
from csi_driver import Fault
from csi_e2e import Env, all_events, create_claim, create_class, csi_env, get_claim
from grpclib.const import Status
from prometheus_client import CollectorRegistry

from pyprovlib.controller._metrics import ProvisionMetrics
from pyprovlib.csi._proto.csi import v1
from pyprovlib.kube._objects import Obj
from pyprovlib.testing import wait_idle
from pyprovlib.testing._cluster import TestCluster

pytestmark = pytest.mark.e2e

CREATE_VOLUME = "/csi.v1.Controller/CreateVolume"


def connection_calls(env: Env) -> Counter[tuple[str, str]]:
    """The connection's calls by (method, gRPC status), from its operations histogram: every
    call the provisioner makes is counted there, sent or not."""
    calls: Counter[tuple[str, str]] = Counter()
    for metric in env.connection.metrics.operations_seconds.collect():
        for sample in metric.samples:
            if sample.name.endswith("_count") and sample.value:
                key = (sample.labels["method_name"], sample.labels["grpc_status_code"])
                calls[key] += int(sample.value)
    return calls


def attempts(registry: CollectorRegistry, class_name: str) -> tuple[float, float]:
    """The controller's (succeeded, failed) provisioning attempts for ``class_name``."""
    labels = {"class": class_name, "source": ""}
    succeeded = registry.get_sample_value(
        "controller_persistentvolumeclaim_provision_total", labels
    )
    failed = registry.get_sample_value(
        "controller_persistentvolumeclaim_provision_failed_total", labels
    )
    return succeeded or 0.0, failed or 0.0


async def create_and_bind(env: Env, class_name: str, count: int) -> list[Obj]:
    """``count`` claims created at once; returns them once every one is Bound and the
    controller is idle.

    First waits until the controller's cache has the class: a claim synced before that gets a
    "StorageClass not found" event and a retry (a binder in another process, as on a real
    cluster, can annotate the claims that early), which are not what these counts are about."""

    async def class_known() -> bool:
        return env.controller.class_informer.store.get_by_key(class_name) is not None

    await env.cluster.wait_for(class_known, timeout=30, message=f"class {class_name} cached")
    claims = await asyncio.gather(*(create_claim(env, class_name) for _ in range(count)))
    names = [c["metadata"]["name"] for c in claims]

    async def all_bound() -> list[Obj] | None:
        current = await asyncio.gather(*(get_claim(env, name) for name in names))
        if all(c is not None and (c.get("status") or {}).get("phase") == "Bound" for c in current):
            return [c for c in current if c is not None]
        return None

    bound: list[Obj] = await env.cluster.wait_for(
        all_bound, timeout=60, message=f"{count} claims Bound"
    )
    # A worker counts its attempt when its save returns; events are written in the background:
    # wait until the controller has done (and recorded) all it will, so the counts are final.
    await wait_idle(env.controller)
    return bound


def counted_env(
    kube_cluster: TestCluster, sock_dir: pathlib.Path, registry: CollectorRegistry
) -> contextlib.AbstractAsyncContextManager[Env]:
    """The provisioner with 16 workers on shared informers, its metrics in ``registry``."""
    return csi_env(
        kube_cluster,
        sock_dir,
        shared_informers=True,
        workers=16,
        metrics=ProvisionMetrics(registry),
    )


def create_requests_by_name(env: Env) -> Counter[str]:
    requests = env.driver.requests("CreateVolume")
    return Counter(r.name for r in requests if isinstance(r, v1.CreateVolumeRequest))


@pytest.mark.parametrize("claims", [16, 32])
async def test_one_attempt_and_one_create_volume_per_claim(
    kube_cluster: TestCluster, sock_dir: pathlib.Path, claims: int
) -> None:
    registry = CollectorRegistry()
    async with counted_env(kube_cluster, sock_dir, registry) as env:
        class_name = await create_class(env)
        bound = await create_and_bind(env, class_name, claims)

        assert attempts(registry, class_name) == (claims, 0)
        calls = connection_calls(env)
        assert calls[(CREATE_VOLUME, "OK")] == claims
        assert [k for k in calls if k[0] == CREATE_VOLUME and k[1] != "OK"] == []
        expected = {f"pvc-{c['metadata']['uid']}" for c in bound}
        assert create_requests_by_name(env) == Counter(dict.fromkeys(expected, 1))
        failures = [e for e in await all_events(env) if e.get("reason") == "ProvisioningFailed"]
        assert [e.get("message") for e in failures] == []


async def test_a_retried_claim_shows_in_every_count(
    kube_cluster: TestCluster, sock_dir: pathlib.Path
) -> None:
    """The counts above do see a retry: one CreateVolume failing Unavailable costs that claim a
    second attempt, in the controller's, the connection's and the driver's figures."""
    registry = CollectorRegistry()
    async with counted_env(kube_cluster, sock_dir, registry) as env:
        class_name = await create_class(env)
        env.driver.fail("CreateVolume", Fault(status=Status.UNAVAILABLE, message="restarting"))
        await create_and_bind(env, class_name, 16)

        assert attempts(registry, class_name) == (16, 1)
        calls = connection_calls(env)
        assert calls[(CREATE_VOLUME, "OK")] == 16
        assert calls[(CREATE_VOLUME, "Unavailable")] == 1
        by_name = create_requests_by_name(env)
        assert sorted(by_name.values()) == [1] * 15 + [2]

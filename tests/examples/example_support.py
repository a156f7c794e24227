"""What the example backends' end-to-end tests share: their controller running with fast
retries, and the claim → PV → event waits on kubernetes-asyncio models (the examples' own
object convention), on top of pyprovlib.testing's helpers."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from kubernetes_asyncio.client import ApiClient, CoreV1Api, V1PersistentVolume

from pyprovlib import testing
from pyprovlib.controller.options import ProvisionControllerOptions
from pyprovlib.controller.provision import ProvisionController
from pyprovlib.kube.resources import PERSISTENT_VOLUMES
from pyprovlib.kube.workqueue import ItemExponentialFailureRateLimiter
from pyprovlib.provisioner import Provisioner
from pyprovlib.testing.cluster import TestCluster


def fast_options(**kw: Any) -> ProvisionControllerOptions:
    # Retries within tens of milliseconds instead of upstream's 15 s first backoff.
    return ProvisionControllerOptions(
        leader_election=False,
        threadiness=2,
        rate_limiter=ItemExponentialFailureRateLimiter(0.05, 1.0),
        **kw,
    )


@contextlib.asynccontextmanager
async def running(
    client: ApiClient, name: str, provisioner: Provisioner, *, stop_timeout: float = 15, **kw: Any
) -> AsyncIterator[ProvisionController]:
    """A ProvisionController for ``provisioner`` with :func:`fast_options`, running."""
    controller = ProvisionController(client, name, provisioner, fast_options(**kw))
    async with testing.running(controller, stop_timeout=stop_timeout):
        yield controller


async def wait_bound(c: TestCluster, claim: str, timeout: float = 30) -> V1PersistentVolume:
    """Wait for ``claim`` to be Bound; return its PV."""
    bound = await testing.wait_bound(c, claim, timeout=timeout)
    return await CoreV1Api(c.api_client).read_persistent_volume(bound["spec"]["volumeName"])


async def wait_pv_gone(c: TestCluster, pv: str, timeout: float = 60) -> None:
    await testing.wait_deleted(c, PERSISTENT_VOLUMES, pv, timeout=timeout)


async def wait_event(
    c: TestCluster,
    name: str,
    reason: str,
    fragment: str,
    *,
    namespace: str | None = None,
    timeout: float = 30,
) -> str:
    """Wait for a ``reason`` event on ``name`` whose message contains ``fragment``; return
    the message."""
    event = await testing.wait_event(
        c, name, reason, fragment, namespace=namespace, timeout=timeout
    )
    return str(event.get("message"))

"""The ProvisionController's test kit shared by the provisioning tests of tests/integration:
an in-memory :class:`MemoryProvisioner`, :func:`fast_options`, a controller with a class of its
own (:func:`controller_for`), metrics samples and crash helpers (here at the root of ``tests/``,
which pytest puts on ``sys.path``)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from claim_support import class_body, create_claim, delete_claim
from kubernetes_asyncio.client import (
    V1HostPathVolumeSource,
    V1ObjectMeta,
    V1PersistentVolume,
    V1PersistentVolumeSpec,
)
from prometheus_client import CollectorRegistry

from pyprovlib._provisioner import Provisioner, ProvisionOptions
from pyprovlib.controller._metrics import ProvisionMetrics
from pyprovlib.controller._options import ProvisionControllerOptions
from pyprovlib.controller._provision import ProvisionController
from pyprovlib.kube._objects import Obj
from pyprovlib.kube._resources import PERSISTENT_VOLUMES, STORAGE_CLASSES
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.kube._workqueue import ItemExponentialFailureRateLimiter
from pyprovlib.testing import eventually, wait_bound, wait_deleted
from pyprovlib.testing._cluster import TestCluster


class MemoryProvisioner(Provisioner):
    """A backend keeping its assets in a dict (shareable between provisioner instances, like
    a storage system outliving a controller). ``provision`` is idempotent."""

    def __init__(self, assets: dict[str, Obj] | None = None) -> None:
        self.assets: dict[str, Obj] = {} if assets is None else assets
        self.calls: list[ProvisionOptions] = []
        self.deleted: list[str] = []

    async def provision(self, options: ProvisionOptions) -> V1PersistentVolume:
        self.calls.append(options)
        request = options.pvc.spec.resources.requests["storage"]
        self.assets.setdefault(options.pv_name, {"size": request})
        return V1PersistentVolume(
            metadata=V1ObjectMeta(name=options.pv_name),
            spec=V1PersistentVolumeSpec(
                access_modes=options.pvc.spec.access_modes,
                capacity={"storage": request},
                volume_mode=options.pvc.spec.volume_mode,
                host_path=V1HostPathVolumeSource(path=f"/tmp/pyprovlib/{options.pv_name}"),
            ),
        )

    async def delete(self, volume: V1PersistentVolume) -> None:
        self.deleted.append(volume.metadata.name)
        self.assets.pop(volume.metadata.name, None)


def fast_options(**kwargs: Any) -> ProvisionControllerOptions:
    """Options for tests: no leader election, private metrics, millisecond retries."""
    defaults: dict[str, Any] = {
        "leader_election": False,
        "metrics": ProvisionMetrics(CollectorRegistry()),
        "rate_limiter": ItemExponentialFailureRateLimiter(0.005, 0.1),
        "create_provisioned_pv_retry_count": 3,
        "create_provisioned_pv_interval": 0.01,
    }
    defaults.update(kwargs)
    return ProvisionControllerOptions(**defaults)


async def create_class(
    cluster: TestCluster, provisioner: str, *, name: str | None = None, **extra: Any
) -> str:
    class_name = name or cluster.unique_name("sc")
    body: Obj = class_body(class_name, provisioner, **extra)
    await ResourceClient(cluster.api_client, STORAGE_CLASSES).create(body)
    cluster.track(STORAGE_CLASSES, class_name)
    return class_name


async def bound_then_deleted(cluster: TestCluster, class_name: str) -> str:
    """Create a claim of ``class_name``, wait until it is Bound, delete it and wait until its
    PV is gone (the controller running). Returns the PV's name."""
    claim = await create_claim(cluster, class_name)
    await wait_bound(cluster, claim["metadata"]["name"])
    pv_name = f"pvc-{claim['metadata']['uid']}"
    await delete_claim(cluster, claim["metadata"]["name"])
    await wait_deleted(cluster, PERSISTENT_VOLUMES, pv_name)
    return pv_name


async def wait_ready(cluster: TestCluster, controller: ProvisionController) -> None:
    await eventually(controller.ready, message="controller ready")


def counter(metrics: ProvisionMetrics | None, name: str, **labels: str) -> float:
    """A sample of one of the controller's metrics from its private registry."""
    assert metrics is not None
    assert metrics.registry is not None
    value = metrics.registry.get_sample_value(f"controller_{name}", labels)
    return value or 0.0


async def kill(task: asyncio.Task[Any]) -> None:
    """Cancel a controller's ``run()`` task (a crash, as far as its code can tell) and wait
    for it to end."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def provisioner_name(cluster: TestCluster) -> str:
    return f"test.pyprovlib.io/{cluster.unique_name('p')}"


async def controller_for(
    cluster: TestCluster,
    provisioner: Provisioner,
    options: ProvisionControllerOptions | None = None,
    **class_extra: Any,
) -> tuple[ProvisionController, str]:
    """A controller of ``provisioner`` under a provisioner name of its own (with
    :func:`fast_options` unless ``options``), and a StorageClass for that name with
    ``class_extra``. Returns the controller and the class name."""
    name = provisioner_name(cluster)
    class_name = await create_class(cluster, name, **class_extra)
    controller = ProvisionController(
        cluster.api_client, name, provisioner, options or fast_options()
    )
    return controller, class_name

"""The capacity controller runs where upstream runs it: beside the provisioning loops and only
while the provisioner holds its Lease (``ProvisionController.run_beside``). Two replicas never
both write objects; the follower adopts the leader's objects when it takes over.
Runs in memory, and on a real cluster with ``PYPROVLIB_E2E_KUBECONFIG`` or
``PYPROVLIB_KUBE_ASSETS``."""

from __future__ import annotations

from typing import Any

import pytest
from capacity_support import FakeSource, cluster_for
from prometheus_client import CollectorRegistry
from task_support import informers_running

from pyprovlib import testing
from pyprovlib._provisioner import IgnoredError, Provisioner, ProvisionOptions
from pyprovlib.controller._capacity import Capacity, CapacityController, CapacityControllerOptions
from pyprovlib.controller._metrics import ProvisionMetrics
from pyprovlib.controller._options import ProvisionControllerOptions
from pyprovlib.controller._provision import ProvisionController
from pyprovlib.kube._informer import SharedInformerFactory
from pyprovlib.testing._cluster import TestCluster

pytestmark = pytest.mark.e2e


class NoProvisioner(Provisioner):
    """Provisions nothing: these tests are about the capacity controller beside it."""

    async def provision(self, options: ProvisionOptions) -> dict[str, Any]:
        raise IgnoredError("not in this test")

    async def delete(self, volume: Any) -> None:
        raise IgnoredError("not in this test")


def provision_options(**extra: Any) -> ProvisionControllerOptions:
    settings: dict[str, Any] = {
        "leader_election": False,
        "metrics": ProvisionMetrics(CollectorRegistry()),
        **extra,
    }
    return ProvisionControllerOptions(**settings)


async def test_only_the_leaders_capacity_controller_writes_and_the_follower_takes_over(
    kube_cluster: TestCluster,
) -> None:
    async with cluster_for(kube_cluster.api_client) as c:
        n1 = await c.driver_node("n1")
        fast = await c.storage_class("fast", "fast")
        sources = [FakeSource(), FakeSource(default=Capacity(50 << 30, None))]
        lease = {
            "leader_election": True,
            "leader_election_namespace": c.namespace,
            "lease_duration": 2.0,
            "renew_deadline": 1.5,
            "retry_period": 0.2,
        }
        factories = [SharedInformerFactory(c.api), SharedInformerFactory(c.api)]
        controllers = []
        capacities = []
        for source, factory in zip(sources, factories, strict=True):
            provisioner = ProvisionController(
                c.api,
                c.driver,
                NoProvisioner(),
                provision_options(**lease),
                informer_factory=factory,
            )
            capacity = CapacityController(
                c.api,
                c.driver,
                source,
                CapacityControllerOptions(
                    namespace=c.namespace,
                    retry_interval_start=0.01,
                    retry_interval_max=0.1,
                    registry=CollectorRegistry(),
                ),
                informer_factory=factory,
            )
            provisioner.run_beside("capacity", capacity.run)
            controllers.append(provisioner)
            capacities.append(capacity)
        async with (
            informers_running(factories[0]),
            informers_running(factories[1]),
            testing.running(controllers[0]),
            testing.running(controllers[1]),
        ):

            async def one_leader() -> bool:
                return sum(p.ready() for p in controllers) == 1

            await testing.eventually(one_leader, message="one leader")
            leader = 0 if controllers[0].ready() else 1
            follower = 1 - leader
            expected = "100Gi" if leader == 0 else "50Gi"
            maximum = "10Gi" if leader == 0 else None
            await c.wait_shapes([c.expect(fast, n1, expected, maximum)], "the leader's object")
            attempts = controllers[follower].lease_attempts
            await testing.eventually(
                lambda: controllers[follower].lease_attempts >= attempts + 3,
                message="the follower kept trying for the Lease",
            )
            assert sources[follower].calls == []
            assert not capacities[follower].ready()
            (before,) = await c.objects()

            controllers[leader].stop()
            other = "50Gi" if leader == 0 else "100Gi"
            other_max = None if leader == 0 else "10Gi"
            (after,) = await c.wait_shapes(
                [c.expect(fast, n1, other, other_max)], "the new leader's capacity"
            )
            # Adopted, not replaced: the same object, updated.
            assert after["metadata"]["uid"] == before["metadata"]["uid"]
            assert sources[follower].calls

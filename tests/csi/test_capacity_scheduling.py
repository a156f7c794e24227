"""kube-scheduler reads what ``--enable-capacity`` publishes: on a real control plane with
kube-scheduler (``PYPROVLIB_KUBE_ASSETS``), a driver reporting 2Gi on one node and 10Gi on the
other, ``python -m pyprovlib.csi.provisioner --enable-capacity`` and a CSIDriver with
``storageCapacity: true``:

- a 5Gi WaitForFirstConsumer claim is never provisioned on the 2Gi node: the scheduler picks
  the other, where it is provisioned and the pod bound;
- a 20Gi claim fits nowhere: its pod stays unschedulable with the scheduler's event, and the
  driver is never asked for it;
- the capacity left after the first volume (5Gi) is published at once, and a 4Gi claim fits
  only there.
"""

from __future__ import annotations

import contextlib
import pathlib
from collections.abc import AsyncIterator

import pytest
from claim_support import class_body, create_claim
from csi_driver import TOPOLOGY_KEY, DriverState, serve_driver

from pyprovlib import testing
from pyprovlib.kube._errors import is_not_found
from pyprovlib.kube._objects import Obj, name_of
from pyprovlib.kube._resources import (
    CSI_STORAGE_CAPACITIES,
    CSIDRIVERS,
    CSINODES,
    EVENTS,
    NODES,
    PERSISTENT_VOLUME_CLAIMS,
    PERSISTENT_VOLUMES,
    PODS,
    STORAGE_CLASSES,
)
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.testing._cluster import TestCluster

pytestmark = pytest.mark.e2e

GI = 1 << 30


@contextlib.asynccontextmanager
async def driver_on_nodes(
    cluster: TestCluster, driver: str, nodes: list[str]
) -> AsyncIterator[None]:
    """The nodes labelled with their name under :data:`TOPOLOGY_KEY` and their CSINodes
    listing ``driver`` with that key (what a node plugin's registration does); undone after."""
    api = cluster.api_client
    csinodes = ResourceClient(api, CSINODES)
    created: list[str] = []

    def entry(node: str) -> dict[str, object]:
        return {"name": driver, "nodeID": node, "topologyKeys": [TOPOLOGY_KEY]}

    try:
        for node in nodes:
            await ResourceClient(api, NODES).patch(
                node, {"metadata": {"labels": {TOPOLOGY_KEY: node}}}
            )
            try:
                current = await csinodes.get(node)
            except Exception as err:
                if not is_not_found(err):
                    raise
                await csinodes.create(
                    {
                        "apiVersion": "storage.k8s.io/v1",
                        "kind": "CSINode",
                        "metadata": {"name": node},
                        "spec": {"drivers": [entry(node)]},
                    }
                )
                created.append(node)
            else:
                current["spec"]["drivers"] = [*(current["spec"].get("drivers") or []), entry(node)]
                await csinodes.replace(current)
        yield
    finally:
        for node in nodes:
            with contextlib.suppress(Exception):
                await ResourceClient(api, NODES).patch(
                    node, {"metadata": {"labels": {TOPOLOGY_KEY: None}}}
                )
            with contextlib.suppress(Exception):
                if node in created:
                    await csinodes.delete(node)
                else:
                    current = await csinodes.get(node)
                    current["spec"]["drivers"] = [
                        d for d in current["spec"].get("drivers") or [] if d["name"] != driver
                    ]
                    await csinodes.replace(current)


async def pod(cluster: TestCluster, claim: str) -> str:
    created = await cluster.create_consumer_pod(claim)
    return name_of(created)


async def published(cluster: TestCluster) -> dict[str, str]:
    """Capacity per node, as the objects in the test's namespace say."""
    items = (
        await ResourceClient(cluster.api_client, CSI_STORAGE_CAPACITIES).list(cluster.namespace)
    )["items"]
    return {o["nodeTopology"]["matchLabels"][TOPOLOGY_KEY]: o["capacity"] for o in items}


async def wait_published(cluster: TestCluster, want: dict[str, str]) -> None:
    async def reached() -> bool:
        return await published(cluster) == want

    try:
        await testing.eventually(reached, timeout=60, message=f"capacity {want}")
    except AssertionError:
        raise AssertionError(f"want {want}, have {await published(cluster)}") from None


async def scheduled_node(cluster: TestCluster, name: str) -> str:
    async def bound() -> str | None:
        found = await ResourceClient(cluster.api_client, PODS).get(name, cluster.namespace)
        return (found.get("spec") or {}).get("nodeName") or None

    return await testing.eventually(bound, timeout=60, message=f"pod {name} bound to a node")


def volume_node(volume: Obj) -> str:
    (term,) = volume["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
    (expression,) = term["matchExpressions"]
    assert expression["key"] == TOPOLOGY_KEY
    (value,) = expression["values"]
    return str(value)


async def test_the_scheduler_places_claims_only_where_capacity_allows(
    kube_cluster: TestCluster, sock_dir: pathlib.Path
) -> None:
    plane = kube_cluster.control_plane
    if plane is None or not plane.run_scheduler:
        pytest.skip("needs kube-scheduler on a control plane (PYPROVLIB_KUBE_ASSETS with it)")
    api = kube_cluster.api_client
    small, large = (name_of(n) for n in await kube_cluster.ready_nodes(2))
    driver = f"{kube_cluster.unique_name('sched')}.csi.pyprovlib.io"
    state = DriverState(name=driver, capacity={small: 2 * GI, large: 10 * GI})
    await ResourceClient(api, CSIDRIVERS).create(
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "CSIDriver",
            "metadata": {"name": driver},
            # The scheduler reads CSIStorageCapacity only for a driver that says so.
            "spec": {"attachRequired": False, "storageCapacity": True},
        }
    )
    kube_cluster.track(CSIDRIVERS, driver)
    class_name = kube_cluster.unique_name("sched")
    await ResourceClient(api, STORAGE_CLASSES).create(
        class_body(class_name, driver, volumeBindingMode="WaitForFirstConsumer")
    )
    kube_cluster.track(STORAGE_CLASSES, class_name)
    assert kube_cluster.kubeconfig is not None
    async with (
        serve_driver(sock_dir, topology=True, state=state),
        driver_on_nodes(kube_cluster, driver, [small, large]),
        testing.child_process(
            "-m",
            "pyprovlib.csi.provisioner",
            f"--kubeconfig={kube_cluster.kubeconfig}",
            f"--csi-address=unix://{sock_dir / 'csi.sock'}",
            "--enable-capacity",
            "--capacity-ownerref-level=-1",
            "--capacity-poll-interval=1h",  # every refresh here is the provisioner's
            "--retry-interval-start=100ms",
            "--log-format=json",
            env=testing.child_env(NAMESPACE=kube_cluster.namespace),
            terminate_timeout=15,
        ) as process,
    ):
        await wait_published(kube_cluster, {small: "2Gi", large: "10Gi"})

        # 5Gi: more than the small node reports. The scheduler picks the large one.
        fits = await create_claim(kube_cluster, class_name, size="5Gi")
        fits_pod = await pod(kube_cluster, name_of(fits))
        bound = await testing.wait_bound(kube_cluster, name_of(fits), timeout=60)
        volume = await ResourceClient(api, PERSISTENT_VOLUMES).get(bound["spec"]["volumeName"])
        assert volume_node(volume) == large
        assert await scheduled_node(kube_cluster, fits_pod) == large
        (created,) = state.requests("CreateVolume")
        requirement = created.accessibility_requirements
        # The scheduler's choice comes first (the requisite lists every node without
        # --strict-topology).
        assert dict(requirement.preferred[0].segments) == {TOPOLOGY_KEY: large}

        # The large node has 5Gi left, published at once (no poll for an hour).
        await wait_published(kube_cluster, {small: "2Gi", large: "5Gi"})

        # 20Gi: fits nowhere. The pod stays unschedulable, the driver is never asked.
        too_big = await create_claim(kube_cluster, class_name, size="20Gi")
        stuck_pod = await pod(kube_cluster, name_of(too_big))
        await testing.wait_event(
            kube_cluster, stuck_pod, "FailedScheduling", "did not have enough free storage"
        )
        claim = await ResourceClient(api, PERSISTENT_VOLUME_CLAIMS).get(
            name_of(too_big), kube_cluster.namespace
        )
        annotations = claim["metadata"].get("annotations") or {}
        assert "volume.kubernetes.io/selected-node" not in annotations
        assert claim["status"]["phase"] == "Pending"

        # 4Gi: fits only where 5Gi are left.
        fits_again = await create_claim(kube_cluster, class_name, size="4Gi")
        again_pod = await pod(kube_cluster, name_of(fits_again))
        await testing.wait_bound(kube_cluster, name_of(fits_again), timeout=60)
        assert await scheduled_node(kube_cluster, again_pod) == large
        assert len(state.requests("CreateVolume")) == 2
        assert process.proc.returncode is None, process.tail()
        # Every event of the stuck pod says so; none placed it on the small node.
        events = (await ResourceClient(api, EVENTS).list(kube_cluster.namespace))["items"]
        scheduled = [
            e["message"]
            for e in events
            if e.get("reason") == "Scheduled" and e["involvedObject"]["name"] == stuck_pod
        ]
        assert scheduled == []

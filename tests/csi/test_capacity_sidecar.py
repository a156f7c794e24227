"""``--enable-capacity`` in ``python -m pyprovlib.csi.provisioner`` and ``python -m pyprovlib.csi``,
as real processes against the in-memory API server and the Python CSI test driver: objects
per class and node with the driver's GetCapacity, owned by the Deployment found from
``$POD_NAME``, refreshed right after a volume is created, deleted with their class, upstream's
metrics; what they ask the API server for is what examples/csi-hostpath/rbac.yaml grants; and
what is missing is refused at start with one line."""

from __future__ import annotations

import contextlib
import pathlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from csi_driver import DRIVER_NAME, TOPOLOGY_KEY, DriverState, serve_driver
from csi_full_driver import serve_full_driver
from process_support import (
    DEADLINE,
    create_claim,
    create_class,
    entry_point,
    rbac_granted,
    rbac_used,
    until,
    wait_claim_bound,
)
from topology_support import create_driver_node

from pyprovlib import testing
from pyprovlib.kube._config import DEFAULT_USER_AGENT, LimitedApiClient
from pyprovlib.kube._objects import Obj
from pyprovlib.kube._ratelimit import TokenBucket
from pyprovlib.kube._resources import (
    CSI_STORAGE_CAPACITIES,
    DEPLOYMENTS,
    PERSISTENT_VOLUME_CLAIMS,
    PODS,
    REPLICA_SETS,
    STORAGE_CLASSES,
)
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.testing._server import ApiServer

GI = 1 << 30
POD = "csi-hostpath-7c9d5-x2x9k"
NAMESPACE = "default"
CAPACITY_FLAGS = (
    "--enable-capacity",
    "--capacity-ownerref-level=2",
    "--capacity-poll-interval=1h",  # every refresh below is the provisioner's, not the poll's
    "--kube-api-capacity-qps=100",
    "--kube-api-capacity-burst=100",
)
ENV = {"NAMESPACE": NAMESPACE, "POD_NAME": POD}
TEST_USER_AGENT = "pyprovlib-tests (capacity)"


def own_client(server: ApiServer) -> LimitedApiClient:
    """The test's client: its requests are not the process's."""
    return LimitedApiClient(
        server.configuration(), limiter=TokenBucket(0, 0), user_agent=TEST_USER_AGENT
    )


async def deployment_chain(api: Any) -> Obj:
    """The Deployment, ReplicaSet and Pod the process pretends to run as (what the Deployment
    and ReplicaSet controllers make); returns the Deployment."""
    labels = {"app": "csi-hostpath"}
    template = {
        "metadata": {"labels": labels},
        "spec": {"containers": [{"name": "c", "image": "pyprovlib:dev"}]},
    }
    spec = {"selector": {"matchLabels": labels}, "template": template}

    def ref(obj: Obj, kind: str) -> dict[str, Any]:
        return {
            "apiVersion": "apps/v1",
            "kind": kind,
            "name": obj["metadata"]["name"],
            "uid": obj["metadata"]["uid"],
            "controller": True,
        }

    deployment = await ResourceClient(api, DEPLOYMENTS).create(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "csi-hostpath", "namespace": NAMESPACE},
            "spec": spec,
        }
    )
    replica_set = await ResourceClient(api, REPLICA_SETS).create(
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": {
                "name": "csi-hostpath-7c9d5",
                "namespace": NAMESPACE,
                "ownerReferences": [ref(deployment, "Deployment")],
            },
            "spec": spec,
        }
    )
    await ResourceClient(api, PODS).create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": POD,
                "namespace": NAMESPACE,
                "labels": labels,
                "ownerReferences": [ref(replica_set, "ReplicaSet")],
            },
            "spec": template["spec"],
        }
    )
    return deployment


async def node(api: Any, name: str, keys: list[str]) -> None:
    """A Node labelled with its name under :data:`TOPOLOGY_KEY`, and its CSINode."""
    await create_driver_node(api, name, DRIVER_NAME, TOPOLOGY_KEY, keys=keys)


async def capacities(api: Any) -> dict[str, Obj]:
    """The objects in ``default`` by the node of their topology ('' without)."""
    items = (await ResourceClient(api, CSI_STORAGE_CAPACITIES).list(NAMESPACE))["items"]
    return {
        ((o.get("nodeTopology") or {}).get("matchLabels") or {}).get(TOPOLOGY_KEY, ""): o
        for o in items
    }


async def wait_capacities(
    api: Any, want: dict[str, str], process: testing.ChildProcess
) -> dict[str, Obj]:
    async def reached() -> tuple[dict[str, Obj]] | None:
        found = await capacities(api)
        have = {node: o.get("capacity") for node, o in found.items()}
        return (found,) if have == want else None  # a tuple: {} is a state to wait for

    (found,) = await until(reached, f"CSIStorageCapacity objects {want}", process)
    return found


@contextlib.asynccontextmanager
async def http_metrics(process: testing.ChildProcess) -> AsyncIterator[str]:
    port = int((await process.wait_for("HTTP server listening"))["port"])
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://127.0.0.1:{port}/metrics") as response,
    ):
        yield await response.text()


async def test_the_provisioner_sidecar_publishes_and_refreshes_capacity(
    server: ApiServer, kubeconfig: pathlib.Path, sock_dir: pathlib.Path
) -> None:
    state = DriverState(capacity={"node-1": 10 * GI, "node-2": 20 * GI})
    async with own_client(server) as api, serve_driver(sock_dir, topology=True, state=state):
        deployment = await deployment_chain(api)
        await node(api, "node-1", [TOPOLOGY_KEY])
        await node(api, "node-2", [TOPOLOGY_KEY])
        await create_class(
            api, volumeBindingMode="WaitForFirstConsumer", parameters={"kind": "fast"}
        )
        async with entry_point(
            "pyprovlib.csi.provisioner",
            kubeconfig,
            f"--csi-address=unix://{sock_dir / 'csi.sock'}",
            "--http-endpoint=127.0.0.1:0",
            *CAPACITY_FLAGS,
            env=ENV,
        ) as process:
            found = await wait_capacities(api, {"node-1": "10Gi", "node-2": "20Gi"}, process)
            owner = {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "name": "csi-hostpath",
                "uid": deployment["metadata"]["uid"],
                "controller": True,
            }
            for obj in found.values():
                assert obj["metadata"]["ownerReferences"] == [owner]
                assert obj["metadata"]["labels"] == {
                    "csi.storage.k8s.io/drivername": DRIVER_NAME,
                    "csi.storage.k8s.io/managed-by": "external-provisioner",
                }
                assert obj["storageClassName"] == "csi"
                assert obj["maximumVolumeSize"] == obj["capacity"]
            (request, *_) = state.requests("GetCapacity")
            assert dict(request.parameters) == {"kind": "fast"}

            # A volume on node-1 (the scheduler's choice): its object is refreshed at once,
            # not at the next poll an hour away; node-2's is not asked again.
            asked = len(state.requests("GetCapacity"))
            claims = await create_claim(api, "data")
            await claims.patch(
                "data",
                {"metadata": {"annotations": {"volume.kubernetes.io/selected-node": "node-1"}}},
                namespace=NAMESPACE,
            )
            await wait_claim_bound(claims, "data", process)
            await wait_capacities(api, {"node-1": "9Gi", "node-2": "20Gi"}, process)
            # Asked again for node-1 only (once, or more if a busy machine made the
            # provisioning retry: each CreateVolume refreshes its segment).
            again = state.requests("GetCapacity")[asked:]
            assert again
            assert [dict(r.accessible_topology.segments) for r in again] == [
                {TOPOLOGY_KEY: "node-1"}
            ] * len(again)

            async with http_metrics(process) as metrics:
                assert "csistoragecapacities_desired_goal 2.0" in metrics
                assert "csistoragecapacities_desired_current 2.0" in metrics
                assert "csistoragecapacities_obsolete 0.0" in metrics
                assert 'workqueue_adds_total{name="csistoragecapacity"}' in metrics

            # The class goes: its objects go.
            await ResourceClient(api, PERSISTENT_VOLUME_CLAIMS).delete("data", NAMESPACE)
            await ResourceClient(api, STORAGE_CLASSES).delete("csi")
            await wait_capacities(api, {}, process)
        requests = server.requests.snapshot(DEFAULT_USER_AGENT)
        used = rbac_used(requests)
        assert used - rbac_granted() == set(), "requests the example RBAC does not allow"
        for verb in ("list", "watch", "create", "update", "delete"):
            assert ("storage.k8s.io", "csistoragecapacities", verb) in used
        assert {("", "pods", "get"), ("apps", "replicasets", "get")} <= used
        # One watch of the objects, in their namespace with the instance's labels; and the
        # classes, nodes and CSINodes the provisioner reads are the same informers' (one
        # LIST+WATCH each for both controllers).
        for resource in ("csistoragecapacities", "storageclasses", "nodes", "csinodes"):
            assert requests.get(("watch", resource)) == 1, (resource, requests)


async def test_the_combined_process_carries_capacity(
    server: ApiServer, kubeconfig: pathlib.Path, sock_dir: pathlib.Path
) -> None:
    """``python -m pyprovlib.csi``: a driver without topology gets one object per class, here
    an Immediate class (``--capacity-for-immediate-binding``)."""
    state = DriverState(capacity={"": 5 * GI})
    async with own_client(server) as api, serve_full_driver(sock_dir, state=state):
        await deployment_chain(api)
        await node(api, "node-1", [])
        await node(api, "node-2", [])
        await create_class(api)
        async with entry_point(
            "pyprovlib.csi",
            kubeconfig,
            f"--csi-address=unix://{sock_dir / 'csi.sock'}",
            "--capacity-for-immediate-binding",
            *CAPACITY_FLAGS,
            env=ENV,
            terminate_timeout=DEADLINE,
        ) as process:
            found = await wait_capacities(api, {"": "5Gi"}, process)
            assert found[""]["nodeTopology"] == {}
            claims = await create_claim(api, "data")
            await wait_claim_bound(claims, "data", process)
            # No topology on the volume: its class is refreshed.
            await wait_capacities(api, {"": "4Gi"}, process)
        assert rbac_used(server.requests.snapshot(DEFAULT_USER_AGENT)) - rbac_granted() == set()


@pytest.mark.parametrize(
    ("module", "env", "extra", "message"),
    [
        (
            "pyprovlib.csi.provisioner",
            {},
            (),
            "--enable-capacity needs the NAMESPACE environment variable",
        ),
        (
            "pyprovlib.csi",
            {"NAMESPACE": NAMESPACE},
            (),
            "--enable-capacity needs the POD_NAME environment variable",
        ),
        (
            "pyprovlib.csi.provisioner",
            {"NAMESPACE": NAMESPACE, "POD_NAME": "missing"},
            (),
            "cannot get Pod default/missing to find the owner",
        ),
        (
            "pyprovlib.csi.provisioner",
            {"NAMESPACE": NAMESPACE},
            ("--capacity-ownerref-level=-1",),
            "does not report the GET_CAPACITY controller capability",
        ),
        (
            "pyprovlib.csi",
            {"NAMESPACE": NAMESPACE},
            ("--capacity-ownerref-level=-1", "--kube-api-capacity-burst=0"),
            "--kube-api-capacity-burst must be at least 1 when --kube-api-capacity-qps is set",
        ),
    ],
)
async def test_what_capacity_needs_is_refused_at_start_in_one_line(
    server: ApiServer,
    kubeconfig: pathlib.Path,
    sock_dir: pathlib.Path,
    module: str,
    env: dict[str, str],
    extra: tuple[str, ...],
    message: str,
) -> None:
    async with serve_driver(sock_dir):  # no capacity: no GET_CAPACITY
        async with entry_point(
            module,
            kubeconfig,
            f"--csi-address=unix://{sock_dir / 'csi.sock'}",
            "--enable-capacity",
            *extra,
            env=env,
        ) as process:
            assert await process.exit_code() == 1
        errors = [line for line in process.lines if line.get("level") == "error"]
        assert len(errors) == 1, process.tail(20)
        assert message in errors[0]["event"], errors


@pytest.mark.parametrize("module", ["pyprovlib.csi.provisioner", "pyprovlib.csi"])
async def test_capacity_writes_with_a_client_and_budget_of_its_own(
    server: ApiServer,
    kubeconfig: pathlib.Path,
    sock_dir: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
    module: str,
) -> None:
    """As upstream's second clientset: the capacity controller writes through an API client
    of its own, limited by --kube-api-capacity-qps/-burst, not the provisioner's
    --kube-api-qps/-burst budget (nor in front of it); in the sidecar and in one process.
    The client is closed when the controller's run ends."""
    from pyprovlib._logging import get_logger
    from pyprovlib.csi import _combined as combined
    from pyprovlib.csi.provisioner._main import make_controller
    from pyprovlib.csi.provisioner._options import build_parser as sidecar_parser
    from pyprovlib.kube._config import new_client
    from pyprovlib.runtime import RuntimeContext
    from pyprovlib.runtime._flags import parse_common

    monkeypatch.setenv("NAMESPACE", NAMESPACE)
    argv = [
        f"--kubeconfig={kubeconfig}",
        f"--csi-address=unix://{sock_dir / 'csi.sock'}",
        "--enable-capacity",
        "--capacity-ownerref-level=-1",
        "--kube-api-qps=7",
        "--kube-api-burst=9",
        "--kube-api-capacity-qps=3",
        "--kube-api-capacity-burst=4",
    ]
    parser = combined.build_parser() if module == "pyprovlib.csi" else sidecar_parser()
    options, args = parse_common(parser, argv)
    state = DriverState(capacity={"": GI})
    async with (
        serve_full_driver(sock_dir, state=state),
        await new_client(options.client_settings()) as api,
    ):
        ctx = RuntimeContext(options=options, args=args, api_client=api, log=get_logger("t"))
        if module == "pyprovlib.csi":
            built: Any = await combined.build(ctx)
            provisioning = built.controllers["provisioner"]
        else:
            built = await make_controller(ctx)
            provisioning = built.controller
        capacity = provisioning.provisioner.capacity
        assert capacity is not None
        assert capacity.client not in (api, provisioning.client)
        assert capacity.client.limiter is not provisioning.client.limiter
        assert (capacity.client.limiter.qps, capacity.client.limiter.burst) == (3.0, 4)
        if module == "pyprovlib.csi":
            assert (provisioning.client.limiter.qps, provisioning.client.limiter.burst) == (
                7.0,
                9,
            )
        built.stop()
        await built.run()  # stopped before it ran: returns, closing what it opened
        assert capacity.client.rest_client.pool_manager.closed

"""``--node-deployment`` with ``--enable-capacity`` in ``python -m pyprovlib.csi.provisioner``
and ``python -m pyprovlib.csi``, as upstream composes them: three nodes, each with its own
test driver (reporting that node's segment and capacity) and its own sidecar. Each instance
asks GetCapacity for its own segment only, publishes the object of that segment under a
managed-by label of its own node, and never replaces or deletes another instance's objects."""

from __future__ import annotations

import contextlib
import pathlib

from claim_support import claim_body
from csi_driver import DRIVER_NAME, TOPOLOGY_KEY, DriverState, serve_driver, short_socket_dir
from process_support import EntryPoint, create_class, until

from pyprovlib import testing
from pyprovlib.controller._provision import ANN_SELECTED_NODE
from pyprovlib.csi.provisioner._capacity import managed_by_for_node
from pyprovlib.kube._config import LimitedApiClient
from pyprovlib.kube._objects import Obj
from pyprovlib.kube._ratelimit import TokenBucket
from pyprovlib.kube._resources import (
    CSI_STORAGE_CAPACITIES,
    PERSISTENT_VOLUME_CLAIMS,
    PERSISTENT_VOLUMES,
)
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.testing._server import ApiServer

GI = 1 << 30
NAMESPACE = "default"
NODES = {"node-a": 10, "node-b": 20, "node-c": 30}


def test_managed_by_is_unique_per_node_and_a_valid_label() -> None:
    assert managed_by_for_node("node-a") == "external-provisioner-node-a"
    long_node = "n" * 50
    value = managed_by_for_node(long_node)
    # The base is cut short and an 8-digit hash of it added: upstream's getNameWithMaxLength.
    assert len(value) == 63
    assert value.endswith("-" + long_node)
    assert value == f"ext-{value[4:12]}-{long_node}"
    assert set(value[4:12]) <= set("0123456789abcdef")
    # The hash is of the base alone, so it is the same for every node.
    assert managed_by_for_node("m" * 50)[4:12] == value[4:12]
    too_long = managed_by_for_node("x" * 80)
    assert len(too_long) == 29
    assert too_long.startswith("external-provisioner-")
    assert too_long != managed_by_for_node("y" * 80)


async def objects(api: object) -> dict[str, Obj]:
    items = (await ResourceClient(api, CSI_STORAGE_CAPACITIES).list(NAMESPACE))["items"]  # type: ignore[arg-type]
    return {
        ((o.get("nodeTopology") or {}).get("matchLabels") or {}).get(TOPOLOGY_KEY, ""): o
        for o in items
    }


async def test_each_node_publishes_only_its_segment(
    server: ApiServer, kubeconfig: pathlib.Path, tmp_path: pathlib.Path, entry: EntryPoint
) -> None:
    async with contextlib.AsyncExitStack() as stack:
        api = await stack.enter_async_context(
            LimitedApiClient(server.configuration(), limiter=TokenBucket(0, 0))
        )
        await create_class(api, volumeBindingMode="WaitForFirstConsumer")
        states: dict[str, DriverState] = {}
        processes: list[testing.ChildProcess] = []
        for node, size in NODES.items():
            (tmp_path / node).mkdir()
            directory = stack.enter_context(short_socket_dir(tmp_path / node))
            # Each driver reports capacity for every node: only the instance's own segment
            # may be asked for and published.
            states[node] = DriverState(capacity={n: (s + 1) * GI for n, s in NODES.items()})
            states[node].capacity[node] = size * GI  # type: ignore[index]
            await stack.enter_async_context(
                serve_driver(directory, topology=True, node=node, state=states[node])
            )
            processes.append(
                await stack.enter_async_context(
                    entry.process(
                        kubeconfig,
                        f"--csi-address=unix://{directory / 'csi.sock'}",
                        "--node-deployment",
                        "--enable-capacity",
                        "--capacity-ownerref-level=-1",
                        "--capacity-poll-interval=200ms",
                        env={"NAMESPACE": NAMESPACE, "NODE_NAME": node},
                    )
                )
            )

        want = {node: f"{size}Gi" for node, size in NODES.items()}

        async def published() -> tuple[dict[str, Obj]] | None:
            found = await objects(api)
            have = {n: o.get("capacity") for n, o in found.items()}
            return (found,) if have == want else None

        (first,) = await until(published, f"CSIStorageCapacity objects {want}", processes[0])
        for node, obj in first.items():
            assert obj["metadata"]["labels"] == {
                "csi.storage.k8s.io/drivername": DRIVER_NAME,
                "csi.storage.k8s.io/managed-by": f"external-provisioner-{node}",
            }
            assert obj["nodeTopology"] == {"matchLabels": {TOPOLOGY_KEY: node}}
            assert not obj["metadata"].get("ownerReferences")

        # Every instance polls several more times; the objects stay the same ones (no
        # instance deleted or recreated another's) and each driver was only ever asked for
        # its own node's segment.
        async def polled() -> bool:
            return all(len(s.requests("GetCapacity")) >= 4 for s in states.values())

        await until(polled, "three more GetCapacity polls per node", processes[0])
        after = await objects(api)
        assert {n: o["metadata"]["uid"] for n, o in after.items()} == {
            n: o["metadata"]["uid"] for n, o in first.items()
        }
        for node, state in states.items():
            segments = {
                tuple(sorted(r.accessible_topology.segments.items()))
                for r in state.requests("GetCapacity")
            }
            assert segments == {((TOPOLOGY_KEY, node),)}
        for process in processes:
            assert process.proc.returncode is None, process.tail(20)


async def test_an_immediate_claim_goes_to_the_node_with_room(
    server: ApiServer, kubeconfig: pathlib.Path, tmp_path: pathlib.Path, entry: EntryPoint
) -> None:
    """Upstream's checkNode: node-a's driver reports 1Gi free, node-b's 10Gi; a 5Gi claim of an
    Immediate class is taken by node-b's instance only, and node-a's never creates a volume."""
    rooms = {"node-a": 1 * GI, "node-b": 10 * GI}
    async with contextlib.AsyncExitStack() as stack:
        api = await stack.enter_async_context(
            LimitedApiClient(server.configuration(), limiter=TokenBucket(0, 0))
        )
        await create_class(api, volumeBindingMode="Immediate", parameters={"kind": "fast"})
        states: dict[str, DriverState] = {}
        processes: list[testing.ChildProcess] = []

        async def start(node: str) -> None:
            (tmp_path / node).mkdir()
            directory = stack.enter_context(short_socket_dir(tmp_path / node))
            states[node] = DriverState(capacity={node: rooms[node]})
            await stack.enter_async_context(
                serve_driver(directory, topology=True, node=node, state=states[node])
            )
            process = await stack.enter_async_context(
                entry.process(
                    kubeconfig,
                    f"--csi-address=unix://{directory / 'csi.sock'}",
                    "--node-deployment",
                    "--node-deployment-base-delay=10ms",
                    "--node-deployment-max-delay=200ms",
                    env={"NODE_NAME": node},
                )
            )
            await process.wait_for("node deployment")
            processes.append(process)

        # node-a alone first, so that it is the one to look at the claim: it must decline.
        await start("node-a")
        await ResourceClient(api, PERSISTENT_VOLUME_CLAIMS).create(
            claim_body("big", "csi", namespace=NAMESPACE, size="5Gi"), NAMESPACE
        )

        async def asked() -> bool:
            return bool(states["node-a"].requests("GetCapacity"))

        await until(asked, "node-a's GetCapacity for claim big", processes[0])
        await start("node-b")

        async def provisioned() -> list[Obj] | None:
            volumes = (await ResourceClient(api, PERSISTENT_VOLUMES).list())["items"]
            return volumes or None

        (volume,) = await until(provisioned, "a PersistentVolume for claim big", processes[1])
        claim = await ResourceClient(api, PERSISTENT_VOLUME_CLAIMS).get("big", NAMESPACE)
        assert claim["metadata"]["annotations"][ANN_SELECTED_NODE] == "node-b"
        assert len(states["node-b"].requests("CreateVolume")) == 1
        assert not states["node-a"].requests("CreateVolume")
        # node-a asked its driver, with the class's parameters and its own segment, and declined.
        (request, *_) = states["node-a"].requests("GetCapacity")
        assert dict(request.parameters) == {"kind": "fast"}
        assert dict(request.accessible_topology.segments) == {TOPOLOGY_KEY: "node-a"}
        assert volume["spec"]["capacity"]["storage"] == "5Gi"

"""``--node-deployment`` in ``python -m pyprovlib.csi.provisioner`` and ``python -m pyprovlib.csi``
as real processes: two nodes, each with its own test driver (a Node service reporting that
node's topology) and its own sidecar, against the in-memory API server. Each driver gets
CreateVolume and DeleteVolume only for its node's claims; Immediate claims are created once."""

from __future__ import annotations

import contextlib
import pathlib
from collections.abc import AsyncIterator

from claim_support import claim_body
from csi_driver import TOPOLOGY_KEY, DriverState, serve_driver, short_socket_dir
from kubernetes_asyncio.client import ApiClient
from process_support import PROVISIONER, EntryPoint, create_class, until

from pyprovlib import testing
from pyprovlib.controller._provision import ANN_SELECTED_NODE
from pyprovlib.kube._objects import Obj, name_of
from pyprovlib.kube._resources import (
    PERSISTENT_VOLUME_CLAIMS,
    PERSISTENT_VOLUMES,
)
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.testing._server import ApiServer

NODE_NAMES = ("node-a", "node-b")


def sidecar(
    entry: EntryPoint, kubeconfig: pathlib.Path, socket: pathlib.Path, node: str | None, *flags: str
) -> contextlib.AbstractAsyncContextManager[testing.ChildProcess]:
    return entry.process(
        kubeconfig,
        "--csi-address",
        f"unix://{socket}",
        "--node-deployment",
        *flags,
        env={"NODE_NAME": node} if node else None,
    )


@contextlib.asynccontextmanager
async def nodes_with_sidecars(
    tmp_path: pathlib.Path, kubeconfig: pathlib.Path, entry: EntryPoint, *flags: str
) -> AsyncIterator[dict[str, tuple[DriverState, testing.ChildProcess]]]:
    """Per node: a driver on its own socket and a sidecar with NODE_NAME set."""
    async with contextlib.AsyncExitStack() as stack:
        out = {}
        for node in NODE_NAMES:
            (tmp_path / node).mkdir()
            directory = stack.enter_context(short_socket_dir(tmp_path / node))
            state, _ = await stack.enter_async_context(
                serve_driver(directory, topology=True, node=node)
            )
            process = await stack.enter_async_context(
                sidecar(entry, kubeconfig, directory / "csi.sock", node, *flags)
            )
            out[node] = (state, process)
        for _, process in out.values():
            await process.wait_for("node deployment")
        yield out


async def create_objects(api: ApiClient, binding: str) -> None:
    await create_class(api, reclaimPolicy="Delete", volumeBindingMode=binding)


def claim_of(name: str, node: str | None) -> Obj:
    """A 1Gi claim of class ``csi`` in ``default``, its node selected when ``node``."""
    selected = {ANN_SELECTED_NODE: node} if node else None
    return claim_body(name, "csi", namespace="default", annotations=selected)


async def bound_claims(claims: ResourceClient, names: list[str]) -> dict[str, Obj] | None:
    listed = (await claims.list(namespace="default")).get("items") or []
    bound = {name_of(c): c for c in listed if (c.get("status") or {}).get("phase") == "Bound"}
    return bound if all(n in bound for n in names) else None


async def test_each_node_provisions_and_deletes_its_own_claims(
    server: ApiServer, kubeconfig: pathlib.Path, tmp_path: pathlib.Path, entry: EntryPoint
) -> None:
    async with (
        nodes_with_sidecars(tmp_path, kubeconfig, entry) as nodes,
        server.api_client() as api,
    ):
        await create_objects(api, "WaitForFirstConsumer")
        claims = ResourceClient(api, PERSISTENT_VOLUME_CLAIMS)
        placed = {f"claim-{i}": NODE_NAMES[i % 2] for i in range(6)}
        for name, node in placed.items():
            await claims.create(claim_of(name, node))
        bound = await until(lambda: bound_claims(claims, list(placed)), "claims bound")
        volumes = ResourceClient(api, PERSISTENT_VOLUMES)
        for node in NODE_NAMES:
            state, _ = nodes[node]
            mine = {n for n, at in placed.items() if at == node}
            created = {
                r.parameters.get("csi.storage.k8s.io/pvc/name") or r.name
                for r in state.requests("CreateVolume")
            }
            assert len(state.volumes) == len(mine), created
            for name in mine:
                pv = await volumes.get(bound[name]["spec"]["volumeName"])
                terms = pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
                assert terms == [
                    {
                        "matchExpressions": [
                            {"key": TOPOLOGY_KEY, "operator": "In", "values": [node]}
                        ]
                    }
                ]
        for name in placed:
            await claims.delete(name, "default")

        async def all_deleted() -> bool:
            return all(not state.volumes for state, _ in nodes.values())

        await until(all_deleted, "volumes deleted by their nodes' sidecars")
        for state, _ in nodes.values():
            assert len(state.requests("DeleteVolume")) == len(state.requests("CreateVolume"))


async def test_immediate_claims_are_created_once(
    server: ApiServer, kubeconfig: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    async with (
        nodes_with_sidecars(
            tmp_path,
            kubeconfig,
            PROVISIONER,
            "--node-deployment-base-delay=50ms",
            "--node-deployment-max-delay=400ms",
        ) as nodes,
        server.api_client() as api,
    ):
        await create_objects(api, "Immediate")
        claims = ResourceClient(api, PERSISTENT_VOLUME_CLAIMS)
        names = [f"claim-{i}" for i in range(8)]
        for name in names:
            await claims.create(claim_of(name, None))
        bound = await until(lambda: bound_claims(claims, names), "claims bound")
    created = {node: len(state.volumes) for node, (state, _) in nodes.items()}
    assert sum(created.values()) == len(names)
    # Each instance knows its node from its driver: nobody reads, lists or watches Nodes.
    assert server.requests.count("list", "nodes") == 0
    assert server.requests.count("get", "nodes") == 0
    assert server.requests.count("list", "csinodes") == 0
    for name, claim in bound.items():
        owner = claim["metadata"]["annotations"][ANN_SELECTED_NODE]
        assert any(
            v.name == claim["spec"]["volumeName"] for v in nodes[owner][0].volumes.values()
        ), name


async def test_node_name_is_required(kubeconfig: pathlib.Path, sock_dir: pathlib.Path) -> None:
    async with sidecar(PROVISIONER, kubeconfig, sock_dir / "csi.sock", None) as process:
        assert await process.exit_code() != 0
    assert "NODE_NAME environment variable must be set" in process.tail()


async def test_leader_election_is_refused(kubeconfig: pathlib.Path, sock_dir: pathlib.Path) -> None:
    async with sidecar(
        PROVISIONER,
        kubeconfig,
        sock_dir / "csi.sock",
        "node-a",
        "--leader-election",
    ) as process:
        assert await process.exit_code() != 0
    assert "turn --leader-election off" in process.tail()


def test_flags_have_upstream_defaults() -> None:
    from pyprovlib.csi.provisioner._options import build_parser

    args = build_parser().parse_args([])
    assert args.node_deployment is False
    assert args.node_deployment_immediate_binding is True
    assert args.node_deployment_base_delay == 20.0
    assert args.node_deployment_max_delay == 60.0


async def test_one_process_runs_only_the_provisioner_per_node(
    kubeconfig: pathlib.Path, sock_dir: pathlib.Path
) -> None:
    combined = EntryPoint("pyprovlib.csi")
    async with sidecar(combined, kubeconfig, sock_dir / "csi.sock", "node-a") as process:
        assert await process.exit_code() != 0
    assert "use --controllers=provisioner there" in process.tail()

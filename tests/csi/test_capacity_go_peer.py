"""Side by side with Go on a real control plane: the Go hostpathplugin (with ``--capacity`` per
storage kind), the same classes and nodes; first the Go ``csi-provisioner --enable-capacity``,
then ``python -m pyprovlib.csi.provisioner --enable-capacity``, each publishing into a namespace
of its own. Both must produce the same CSIStorageCapacity objects (everything but names, uids,
resourceVersions and timestamps) at each stage: at start, after a class is added, after a node
is removed, and after the capacity changed (a volume created on one node).

Needs a real kube-apiserver (``PYPROVLIB_KUBE_ASSETS`` or ``PYPROVLIB_E2E_KUBECONFIG``: the Go
sidecar speaks protobuf, which the in-memory server does not) and the Go binaries
(``csi-provisioner`` and ``hostpathplugin`` in the same assets directory)."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import os
import pathlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from claim_support import class_body, create_claim
from csi_e2e import HOSTPATH_TOPOLOGY_KEY, find_go_binary, go_hostpath, register_hostpath_node
from process_support import terminate

from pyprovlib import testing
from pyprovlib.kube._errors import is_not_found
from pyprovlib.kube._objects import Obj
from pyprovlib.kube._quantity import parse_quantity
from pyprovlib.kube._resources import (
    CSI_STORAGE_CAPACITIES,
    CSINODES,
    NAMESPACES,
    NODES,
    PERSISTENT_VOLUME_CLAIMS,
    PERSISTENT_VOLUMES,
    STORAGE_CLASSES,
)
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.testing._cluster import TestCluster

pytestmark = pytest.mark.e2e

GI = 1 << 30
KINDS = {"fast": 100 * GI, "slow": 50 * GI}
POLL = "2s"
_VOLATILE = ("name", "namespace", "uid", "resourceVersion", "creationTimestamp", "managedFields")


@pytest.fixture
def go_provisioner(
    kube_cluster: TestCluster, tmp_path_factory: pytest.TempPathFactory
) -> pathlib.Path:
    if not kube_cluster.is_real or kube_cluster.kubeconfig is None:
        pytest.skip("needs a real kube-apiserver: the Go csi-provisioner speaks protobuf")
    binary = find_go_binary("csi-provisioner", tmp_path_factory.getbasetemp())
    if binary is None:
        pytest.skip(
            "no Go csi-provisioner: put csi-provisioner and hostpathplugin (built from"
            " kubernetes-csi) in the assets directory that PYPROVLIB_KUBE_ASSETS names"
        )
    return binary


def normalised(obj: Obj) -> str:
    """The object without what legitimately differs between two runs (as JSON, sortable)."""
    out = copy.deepcopy(obj)
    meta = out.get("metadata") or {}
    for key in _VOLATILE:
        meta.pop(key, None)
    meta.pop("ownerReferences", None)
    return json.dumps(out, sort_keys=True)


@dataclass
class Scene:
    """The cluster both provisioners see: the driver, its nodes and classes."""

    cluster: TestCluster
    driver: str
    nodes: list[str]
    classes: dict[str, str] = field(default_factory=dict)  # class name -> kind
    added_class: str = ""

    @property
    def api(self) -> Any:
        return self.cluster.api_client

    async def add_node(self, name: str) -> None:
        await register_hostpath_node(self.api, self.driver, name)

    async def remove_node(self, name: str) -> None:
        for resource in (CSINODES, NODES):
            await ResourceClient(self.api, resource).delete(name)

    async def add_class(self, name: str, kind: str, mode: str = "WaitForFirstConsumer") -> None:
        await ResourceClient(self.api, STORAGE_CLASSES).create(
            class_body(
                name,
                self.driver,
                volumeBindingMode=mode,
                reclaimPolicy="Delete",
                parameters={"kind": kind},
            )
        )
        self.cluster.track(STORAGE_CLASSES, name)
        if mode == "WaitForFirstConsumer":
            self.classes[name] = kind

    async def remove_class(self, name: str) -> None:
        await ResourceClient(self.api, STORAGE_CLASSES).delete(name)
        self.classes.pop(name, None)

    def expected(
        self, nodes: list[str], used: dict[str, int] | None = None
    ) -> list[tuple[Any, ...]]:
        """(class, node, capacity) of every object that should exist: what the hostpathplugin
        reports is its kind's capacity less the volumes of that kind, on every node."""
        used = used or {}
        return sorted(
            (name, node, KINDS[kind] - used.get(kind, 0))
            for name, kind in self.classes.items()
            for node in nodes
        )


async def objects(api: Any, namespace: str) -> list[Obj]:
    listed = await ResourceClient(api, CSI_STORAGE_CAPACITIES).list(namespace)
    return list(listed.get("items") or [])


def summary(items: list[Obj]) -> list[tuple[Any, ...]]:
    return sorted(
        (
            o["storageClassName"],
            o["nodeTopology"]["matchLabels"][HOSTPATH_TOPOLOGY_KEY],
            parse_quantity(o["capacity"]).value(),
        )
        for o in items
    )


async def reach_stage(
    api: Any, namespace: str, name: str, want: list[tuple[Any, ...]]
) -> list[str]:
    """Wait until the objects in ``namespace`` are ``want`` (see :func:`summary`); returns
    them normalised."""

    async def reached() -> list[Obj] | None:
        items = await objects(api, namespace)
        return items if summary(items) == want else None

    try:
        items = await testing.eventually(reached, timeout=60, message=f"stage {name}")
    except AssertionError:
        have = summary(await objects(api, namespace))
        raise AssertionError(f"stage {name}: want {want}, have {have}") from None
    return sorted(normalised(o) for o in items)


async def delete_claim_and_volume(scene: Scene, claim: str, volume: str) -> None:
    """Delete the claim and wait until the provisioner deleted its volume."""
    api = scene.api
    await ResourceClient(api, PERSISTENT_VOLUME_CLAIMS).delete(claim, scene.cluster.namespace)

    async def volume_gone() -> bool:
        try:
            await ResourceClient(api, PERSISTENT_VOLUMES).get(volume)
        except Exception as err:
            if is_not_found(err):
                return True
            raise
        return False

    await testing.eventually(volume_gone, timeout=60, message="the volume deleted")


Runner = Callable[[str], contextlib.AbstractAsyncContextManager[Any]]


async def run_stages(scene: Scene, runner: Runner, namespace: str) -> dict[str, list[str]]:
    """Start a provisioner publishing into ``namespace``, walk the stages, undo them; returns
    each stage's objects, normalised."""
    api = scene.api
    seen: dict[str, list[str]] = {}
    nodes = list(scene.nodes)

    async def stage(name: str, want: list[tuple[Any, ...]]) -> None:
        seen[name] = await reach_stage(api, namespace, name, want)

    async with runner(namespace):
        await stage("initial", scene.expected(nodes))

        added = scene.added_class  # the same name in every run: the objects compare equal
        await scene.add_class(added, "fast")
        await stage("class added", scene.expected(nodes))

        gone = nodes.pop()
        await scene.remove_node(gone)
        await stage("node removed", scene.expected(nodes))

        # A 10Gi volume of kind fast on the first node: every fast object says 90Gi (the
        # volume's node at once, the others by the poll).
        claim_name, volume = await fast_volume_on(scene, nodes[0])
        await stage("capacity changed", scene.expected(nodes, {"fast": 10 * GI}))

        # Back to the start for the next run: the volume deleted (by this provisioner), the
        # class gone, the node back.
        await delete_claim_and_volume(scene, claim_name, volume)
        await scene.remove_class(added)
    await scene.add_node(gone)
    return seen


async def fast_volume_on(scene: Scene, node: str) -> tuple[str, str]:
    """A 10Gi claim of the first class of kind fast, its node ``node`` selected, once bound:
    the claim's name and its volume's."""
    fast = next(name for name, kind in scene.classes.items() if kind == "fast")
    claim = await create_claim(
        scene.cluster,
        fast,
        size="10Gi",
        annotations={"volume.kubernetes.io/selected-node": node},
    )
    bound = await testing.wait_bound(scene.cluster, claim["metadata"]["name"], timeout=60)
    return claim["metadata"]["name"], bound["spec"]["volumeName"]


async def set_scene(
    cluster: TestCluster, prefix: str, *, nodes: int
) -> tuple[Scene, dict[str, str]]:
    """A driver and ``nodes`` nodes of its own (named after ``prefix``), the classes ``fast`` and
    ``slow``, and a namespace for each provisioner (``go``, ``py``: its namespace)."""
    driver = f"{cluster.unique_name(prefix)}.hostpath.csi"
    names = [cluster.unique_name(f"{prefix}-n{i}") for i in range(1, nodes + 1)]
    scene = Scene(cluster, driver, names, added_class=cluster.unique_name("fast2"))
    namespaces = {}
    for who in ("go", "py"):
        namespaces[who] = f"{cluster.namespace}-{prefix}-{who}"
        await ResourceClient(cluster.api_client, NAMESPACES).create(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespaces[who]}}
        )
        cluster.track(NAMESPACES, namespaces[who])
    for name in names:
        cluster.track(NODES, name)
        cluster.track(CSINODES, name)
        await scene.add_node(name)
    await scene.add_class(cluster.unique_name("fast"), "fast")
    await scene.add_class(cluster.unique_name("slow"), "slow")
    return scene, namespaces


@contextlib.asynccontextmanager
async def go_sidecar(
    binary: pathlib.Path,
    kubeconfig: pathlib.Path,
    socket: pathlib.Path,
    namespace: str,
    node: str | None = None,
    log_name: str = "go-csi-provisioner",
) -> AsyncIterator[None]:
    """The Go csi-provisioner; with ``node``, deployed on that node (``--node-deployment``)."""
    log = (socket.parent / f"{log_name}.log").open("wb")
    node_args = ["--node-deployment"] if node else []
    node_env = {"NODE_NAME": node} if node else {}
    process = await asyncio.create_subprocess_exec(
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--csi-address={socket}",
        *node_args,
        "--enable-capacity",
        "--capacity-ownerref-level=-1",
        f"--capacity-poll-interval={POLL}",
        "--retry-interval-start=100ms",
        "--v=3",
        stdout=log,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "NAMESPACE": namespace, **node_env},
    )
    try:
        yield
        assert process.returncode is None, "the Go csi-provisioner exited"
    finally:
        await terminate(process, 15)
        log.close()


@contextlib.asynccontextmanager
async def pyprovlib_sidecar(
    kubeconfig: pathlib.Path, socket: pathlib.Path, namespace: str, node: str | None = None
) -> AsyncIterator[testing.ChildProcess]:
    """``python -m pyprovlib.csi.provisioner``; with ``node``, deployed on that node."""
    node_args = ["--node-deployment"] if node else []
    node_env = {"NODE_NAME": node} if node else {}
    async with testing.child_process(
        "-m",
        "pyprovlib.csi.provisioner",
        f"--kubeconfig={kubeconfig}",
        f"--csi-address=unix://{socket}",
        *node_args,
        "--enable-capacity",
        "--capacity-ownerref-level=-1",
        f"--capacity-poll-interval={POLL}",
        "--retry-interval-start=100ms",
        "--log-format=json",
        env=testing.child_env(NAMESPACE=namespace, **node_env),
        terminate_timeout=15,
    ) as process:
        yield process
        assert process.proc.returncode is None, f"pyprovlib exited:\n{process.tail()}"


async def test_go_and_pyprovlib_publish_the_same_capacity(
    kube_cluster: TestCluster,
    sock_dir: pathlib.Path,
    go_provisioner: pathlib.Path,
    hostpathplugin_binary: pathlib.Path,
) -> None:
    kubeconfig = kube_cluster.kubeconfig
    assert kubeconfig is not None
    scene, namespaces = await set_scene(kube_cluster, "cap", nodes=3)
    driver, nodes = scene.driver, scene.nodes
    # Immediate binding: no object from either (the scheduler does not read them).
    await scene.add_class(kube_cluster.unique_name("now"), "fast", mode="Immediate")

    capacity_flags = [f"--capacity={kind}={size // GI}Gi" for kind, size in KINDS.items()]
    async with go_hostpath(
        hostpathplugin_binary, sock_dir, driver, nodes[0], extra_args=tuple(capacity_flags)
    ) as hostpath:
        socket = hostpath.socket
        go = await run_stages(
            scene,
            lambda ns: go_sidecar(go_provisioner, kubeconfig, socket, ns),
            namespaces["go"],
        )
        py = await run_stages(
            scene, lambda ns: pyprovlib_sidecar(kubeconfig, socket, ns), namespaces["py"]
        )
    assert list(go) == list(py) == ["initial", "class added", "node removed", "capacity changed"]
    for stage in go:
        assert py[stage] == go[stage], f"stage {stage!r} differs:\n go {go[stage]}\n py {py[stage]}"
    # What was compared: upstream's labels, generated names, the class, the node's segment,
    # capacity and maximumVolumeSize as the Go sidecar writes them.
    example = json.loads(go["initial"][0])
    assert example["metadata"]["labels"] == {
        "csi.storage.k8s.io/drivername": driver,
        "csi.storage.k8s.io/managed-by": "external-provisioner",
    }
    assert example["metadata"]["generateName"] == "csisc-"
    assert set(example) >= {"capacity", "maximumVolumeSize", "nodeTopology", "storageClassName"}


NodeRunner = Callable[[str, str, pathlib.Path], contextlib.AbstractAsyncContextManager[Any]]


async def run_node_stages(
    scene: Scene, sockets: dict[str, pathlib.Path], runner: NodeRunner, namespace: str
) -> dict[str, list[str]]:
    """``--node-deployment`` with ``--enable-capacity``: one provisioner per node, each on its
    node's driver, publishing into ``namespace``; walk the stages, undo them; returns each
    stage's objects, normalised."""
    api = scene.api
    seen: dict[str, list[str]] = {}
    nodes = list(scene.nodes)

    async def stage(name: str, want: list[tuple[Any, ...]]) -> None:
        seen[name] = await reach_stage(api, namespace, name, want)

    async with contextlib.AsyncExitStack() as stack:
        for node in nodes:
            await stack.enter_async_context(runner(namespace, node, sockets[node]))
        await stage("initial", scene.expected(nodes))

        await scene.add_class(scene.added_class, "fast")
        await stage("class added", scene.expected(nodes))

        # A 10Gi volume of kind fast for the first node, made by that node's instance: only
        # that node's fast objects go down (each node has a driver of its own).
        claim_name, volume = await fast_volume_on(scene, nodes[0])
        used = {nodes[0]: {"fast": 10 * GI}}
        want = sorted(row for node in nodes for row in scene.expected([node], used.get(node)))
        await stage("capacity changed", want)

        await delete_claim_and_volume(scene, claim_name, volume)
        await scene.remove_class(scene.added_class)
    return seen


async def test_node_deployment_publishes_the_same_capacity_as_go(
    kube_cluster: TestCluster,
    sock_dir: pathlib.Path,
    go_provisioner: pathlib.Path,
    hostpathplugin_binary: pathlib.Path,
) -> None:
    """Two nodes, each with its own hostpathplugin and its own provisioner (as a DaemonSet runs
    them): the Go instances and then pyprovlib's publish the same objects, each only its own
    node's segment, under a managed-by label of its node."""
    kubeconfig = kube_cluster.kubeconfig
    assert kubeconfig is not None
    scene, namespaces = await set_scene(kube_cluster, "ndcap", nodes=2)
    driver, nodes = scene.driver, scene.nodes

    def go_instance(namespace: str, node: str, socket: pathlib.Path) -> Any:
        return go_sidecar(
            go_provisioner, kubeconfig, socket, namespace, node=node, log_name=f"go-{node}"
        )

    def py_instance(namespace: str, node: str, socket: pathlib.Path) -> Any:
        return pyprovlib_sidecar(kubeconfig, socket, namespace, node=node)

    capacity_flags = tuple(f"--capacity={kind}={size // GI}Gi" for kind, size in KINDS.items())
    async with contextlib.AsyncExitStack() as stack:
        sockets = {}
        for index, node in enumerate(nodes):
            directory = sock_dir / f"n{index}"
            directory.mkdir()
            hostpath = await stack.enter_async_context(
                go_hostpath(hostpathplugin_binary, directory, driver, node, capacity_flags)
            )
            sockets[node] = hostpath.socket
        go = await run_node_stages(scene, sockets, go_instance, namespaces["go"])
        py = await run_node_stages(scene, sockets, py_instance, namespaces["py"])
    assert list(go) == list(py) == ["initial", "class added", "capacity changed"]
    for stage in go:
        assert py[stage] == go[stage], f"stage {stage!r} differs:\n go {go[stage]}\n py {py[stage]}"
    # What was compared includes upstream's per-node managed-by label.
    labels = {
        json.loads(o)["metadata"]["labels"]["csi.storage.k8s.io/managed-by"] for o in go["initial"]
    }
    assert labels == {f"external-provisioner-{node}" for node in nodes}

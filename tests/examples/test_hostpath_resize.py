"""hostpath volumes cannot grow: a claim of a hostpath class (``allowVolumeExpansion: true``)
that asks for more gets exactly one clear ``VolumeResizeFailed`` event from the resize controller
``python -m pyprovlib.examples.hostpath`` runs beside its provisioner — also with one node-mode
instance per node — and nothing is changed; ``--resize-events=false`` turns it off."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import pytest
import structlog
from example_support import claim_model, create_claim, create_class
from kubernetes_asyncio.client import (
    ApiClient,
    CoreV1Api,
    V1ObjectMeta,
    V1PersistentVolume,
)

from pyprovlib import testing
from pyprovlib.controller._provision import ProvisionController
from pyprovlib.controller._resize import REASON_VOLUME_RESIZE_FAILED
from pyprovlib.examples.hostpath._cli import build_parser, make_controller
from pyprovlib.examples.hostpath._resize import (
    NOT_EXPANDABLE_REASON,
    HostPathResizeController,
    HostPathResizer,
    volume_node,
)
from pyprovlib.kube._objects import Obj, name_of
from pyprovlib.kube._resources import PERSISTENT_VOLUME_CLAIMS
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.runtime import CompositeController, Controller, RuntimeContext
from pyprovlib.runtime._flags import parse_common
from pyprovlib.testing._cluster import TestCluster

pytestmark = pytest.mark.e2e

_TEXT = "hostpath volumes cannot be expanded"


@contextlib.asynccontextmanager
async def running_cli(c: TestCluster, *argv: str) -> AsyncIterator[Controller]:
    """The controller ``python -m pyprovlib.examples.hostpath <argv>`` would run, running."""
    options, args = parse_common(build_parser(), list(argv))
    ctx = RuntimeContext(
        options=options, args=args, api_client=c.api_client, log=structlog.stdlib.get_logger()
    )
    controller = make_controller(ctx)
    async with testing.running(controller):
        yield controller


def node_argv(provisioner: str, node: str, *extra: str) -> list[str]:
    return [
        "--provisioner-name",
        provisioner,
        "--mode",
        "node",
        "--node-name",
        node,
        "--leader-election=false",
        *extra,
    ]


async def make_expandable_class(c: TestCluster, provisioner: str, base: Path) -> str:
    return await create_class(
        c,
        "hostpath",
        provisioner,
        parameters={"basePath": str(base)},
        volume_binding_mode="WaitForFirstConsumer",
        allow_volume_expansion=True,
    )


async def bound_claim(c: TestCluster, sc: str, node: Obj) -> tuple[str, str]:
    """A 64Mi claim of ``sc`` with a consumer pod pinned to ``node``, once Bound: (claim, PV)."""
    core = CoreV1Api(c.api_client)
    claim = await create_claim(c, claim_model(c.unique_name("data"), sc, "64Mi"))
    await c.create_consumer_pod(claim, node=node)

    async def bound() -> Any:
        pvc = await core.read_namespaced_persistent_volume_claim(claim, c.namespace)
        if pvc.status and pvc.status.phase == "Bound":
            return str(pvc.spec.volume_name)
        return None

    return claim, await c.wait_for(bound, timeout=30, message=f"claim {claim} Bound")


async def grow(c: TestCluster, claim: str, size: str = "128Mi") -> None:
    await CoreV1Api(c.api_client).patch_namespaced_persistent_volume_claim(
        claim, c.namespace, {"spec": {"resources": {"requests": {"storage": size}}}}
    )


async def resize_events(c: TestCluster, claim: str) -> list[Any]:
    events = await CoreV1Api(c.api_client).list_namespaced_event(c.namespace)
    return [
        ev
        for ev in events.items
        if ev.involved_object.name == claim and ev.reason == REASON_VOLUME_RESIZE_FAILED
    ]


def parts(*controllers: Controller) -> list[Any]:
    """The controllers ``controllers`` run (a composite's parts), for :func:`wait_idle`."""
    out: list[Any] = []
    for controller in controllers:
        if isinstance(controller, CompositeController):
            out.extend(parts(*controller.controllers))
        else:
            out.append(controller)
    return out


async def wait_one_event(c: TestCluster, claim: str, *controllers: Controller) -> Any:
    async def found() -> Any:
        events = await resize_events(c, claim)
        return events[0] if events else None

    event = await c.wait_for(found, timeout=30, message=f"{REASON_VOLUME_RESIZE_FAILED} on {claim}")
    # Every instance (a second one, or a second look) has seen the grown claim and written
    # what it decided on, with no retry pending; then count.
    grown = await ResourceClient(c.api_client, PERSISTENT_VOLUME_CLAIMS).get(claim, c.namespace)
    for controller in parts(*controllers):
        await testing.wait_idle(controller, grown, count_delayed=True)
    events = await resize_events(c, claim)
    assert len(events) == 1, [(e.source, e.message, e.count) for e in events]
    assert (events[0].count or 1) == 1
    return event


async def assert_unchanged(c: TestCluster, claim: str, pv: str, size: str = "64Mi") -> None:
    core = CoreV1Api(c.api_client)
    pvc = await core.read_namespaced_persistent_volume_claim(claim, c.namespace)
    assert pvc.status.capacity["storage"] == size
    assert not pvc.status.conditions
    assert (await core.read_persistent_volume(pv)).spec.capacity["storage"] == size


async def test_growing_claim_gets_one_clear_event(
    kube_cluster: TestCluster, tmp_path: Path
) -> None:
    c = kube_cluster
    (node,) = await c.ready_nodes(1)
    provisioner = c.unique_name("pyprovlib.io/hostpath-resize")
    sc = await make_expandable_class(c, provisioner, tmp_path)
    async with running_cli(c, *node_argv(provisioner, name_of(node))) as controller:
        assert isinstance(controller, CompositeController)
        claim, pv = await bound_claim(c, sc, node)
        await grow(c, claim)
        event = await wait_one_event(c, claim, controller)
        assert event.type == "Warning"
        assert _TEXT in event.message
        assert pv in event.message
        assert "create a new claim" in event.message
        assert event.source.component == f"external-resizer {provisioner}"
        await assert_unchanged(c, claim, pv)
        pvc = await CoreV1Api(c.api_client).read_namespaced_persistent_volume_claim(
            claim, c.namespace
        )
        assert pvc.spec.resources.requests["storage"] == "128Mi"


async def test_one_event_per_claim_with_one_instance_per_node(
    kube_cluster: TestCluster, tmp_path: Path
) -> None:
    """Two DaemonSet pods: each claim is answered by its own node's instance only."""
    c = kube_cluster
    nodes = {name_of(node): node for node in await c.ready_nodes(2)}
    provisioner = c.unique_name("pyprovlib.io/hostpath-resize")
    classes = {}
    for node in nodes:
        (tmp_path / node).mkdir()
        classes[node] = await make_expandable_class(c, provisioner, tmp_path / node)
    node_a, node_b = nodes
    async with (
        running_cli(c, *node_argv(provisioner, node_a)) as first,
        running_cli(c, *node_argv(provisioner, node_b)) as second,
    ):
        claims = {node: await bound_claim(c, classes[node], nodes[node]) for node in classes}
        for claim, _ in claims.values():
            await grow(c, claim)
        for claim, pv in claims.values():
            event = await wait_one_event(c, claim, first, second)
            assert _TEXT in event.message
            await assert_unchanged(c, claim, pv)


async def test_resize_events_off(kube_cluster: TestCluster, tmp_path: Path) -> None:
    c = kube_cluster
    (node,) = await c.ready_nodes(1)
    provisioner = c.unique_name("pyprovlib.io/hostpath-resize")
    sc = await make_expandable_class(c, provisioner, tmp_path)
    argv = node_argv(provisioner, name_of(node), "--resize-events=false")
    async with running_cli(c, *argv) as controller:
        assert isinstance(controller, ProvisionController)
        claim, pv = await bound_claim(c, sc, node)
        await grow(c, claim)
        grown = await ResourceClient(c.api_client, PERSISTENT_VOLUME_CLAIMS).get(claim, c.namespace)
        await testing.wait_idle(controller, grown)
        assert await resize_events(c, claim) == []
        await assert_unchanged(c, claim, pv)


def test_helper_pod_mode_serves_every_node_under_leader_election() -> None:
    options, args = parse_common(
        build_parser(),
        ["--mode", "helper-pod", "--leader-election", "--provisioner-name", "example.com/local"],
    )
    # Nothing is called on the client: the controllers are built, not run.
    client = cast("ApiClient", object())
    ctx = RuntimeContext(
        options=options, args=args, api_client=client, log=structlog.stdlib.get_logger()
    )
    controller = make_controller(ctx)
    assert isinstance(controller, CompositeController)
    provision, resize = controller.controllers
    assert isinstance(provision, ProvisionController)
    assert isinstance(resize, HostPathResizeController)
    assert resize.options.leader_election
    assert resize.options.lease is None  # its own Lease: external-resizer-<name>
    assert isinstance(resize.resizer, HostPathResizer)
    assert resize.resizer.node is None
    assert not resize.options.handle_volume_in_use_error


def test_volume_node() -> None:
    affinity = {
        "required": {
            "nodeSelectorTerms": [
                {
                    "matchExpressions": [
                        {"key": "kubernetes.io/hostname", "operator": "In", "values": ["h1"]}
                    ]
                }
            ]
        }
    }
    annotated = {"metadata": {"annotations": {"pyprovlib.io/hostpath-node": "n1"}}}
    assert volume_node(annotated) == "n1"
    assert volume_node({"spec": {"nodeAffinity": affinity}}) == "h1"
    assert volume_node({}) is None
    resizer = HostPathResizer("p", "n1")
    assert resizer.serves(annotated)
    assert not resizer.serves({})
    assert HostPathResizer("p").serves({})
    model = V1PersistentVolume(
        metadata=V1ObjectMeta(annotations={"pyprovlib.io/hostpath-node": "n1"})
    )
    assert not resizer.can_support(model)
    assert resizer.unsupported_reason(model) == NOT_EXPANDABLE_REASON

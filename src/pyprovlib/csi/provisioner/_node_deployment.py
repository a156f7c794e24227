"""The CSI provisioner deployed on every node (external-provisioner's ``--node-deployment``):
the node's name from ``NODE_NAME``, its topology from the driver's ``NodeGetInfo``, and this
node's Node and CSINode as fixed objects built from it, so no instance watches every Node
(upstream does the same)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from pyprovlib._errors import PyprovlibError
from pyprovlib.controller._options import CapacityCheck, NodeDeployment
from pyprovlib.csi._connection import CSIConnection
from pyprovlib.csi._proto.csi import v1
from pyprovlib.csi.provisioner._common import StaticReader
from pyprovlib.kube._quantity import Quantity

__all__ = [
    "ENV_NODE_NAME",
    "LocalNode",
    "NodeDeploymentError",
    "check_node_deployment",
    "local_node",
    "node_deployment",
]

ENV_NODE_NAME: Final = "NODE_NAME"
"""The environment variable naming this instance's node (downward API ``spec.nodeName``)."""


class NodeDeploymentError(PyprovlibError, ValueError):
    """``--node-deployment`` cannot work as configured."""


@dataclass(frozen=True)
class LocalNode:
    """The node this instance runs on, as its CSI driver describes it (``NodeGetInfo``)."""

    name: str
    """The Kubernetes node name (``NODE_NAME``)."""
    node_id: str
    """The driver's ID of the node."""
    segments: Mapping[str, str] = field(default_factory=dict)
    """The node's accessible topology (empty when the driver reports none)."""

    def readers(self, driver: str) -> tuple[StaticReader, StaticReader]:
        """This node's Node (its topology as labels) and CSINode (the driver with the
        topology keys), for the topology code to read instead of watching every node."""
        node = {"metadata": {"name": self.name, "labels": dict(self.segments)}}
        csinode = {
            "metadata": {"name": self.name},
            "spec": {
                "drivers": [
                    {"name": driver, "nodeID": self.node_id, "topologyKeys": list(self.segments)}
                ]
            },
        }
        return StaticReader([node]), StaticReader([csinode])


def check_node_deployment(args: argparse.Namespace, *, leader_election: bool) -> str | None:
    """The node name when ``--node-deployment`` is on (None when off); raises
    :class:`NodeDeploymentError` when ``NODE_NAME`` is missing or leader election is on."""
    if not args.node_deployment:
        return None
    node = os.environ.get(ENV_NODE_NAME, "").strip()
    if not node:
        raise NodeDeploymentError(
            f"the {ENV_NODE_NAME} environment variable must be set when using "
            "--node-deployment (from the downward API: fieldRef spec.nodeName)"
        )
    if leader_election:
        raise NodeDeploymentError(
            "--node-deployment runs one provisioner on every node, each for its own node: "
            "turn --leader-election off (one shared lease would let only one node provision)"
        )
    return node


async def local_node(connection: CSIConnection, name: str) -> LocalNode:
    """Ask the driver (its Node service, on the same socket) which node it is and where."""
    info: v1.NodeGetInfoResponse = await connection.call(
        "/csi.v1.Node/NodeGetInfo", v1.NodeGetInfoRequest()
    )
    topology = info.accessible_topology
    segments = dict(topology.segments) if topology is not None else {}
    return LocalNode(name=name, node_id=info.node_id, segments=segments)


def _requested_bytes(claim: Mapping[str, Any]) -> int:
    requests = ((claim.get("spec") or {}).get("resources") or {}).get("requests") or {}
    storage = requests.get("storage")
    return Quantity.parse(str(storage)).value() if storage is not None else 0


def capacity_check(connection: CSIConnection, node: LocalNode, timeout: float) -> CapacityCheck:
    """Upstream's capacity check of ``checkNode``, before an instance takes an Immediate claim:
    GetCapacity with the class's parameters for this node's segment (each call bounded by
    ``timeout``, ``--timeout``); room when the available capacity is at least the claim's
    storage request. A failed call raises, which the controller counts as room, so that
    provisioning reports the problem."""

    async def check(claim: Mapping[str, Any], storage_class: Mapping[str, Any]) -> bool:
        request = v1.GetCapacityRequest(parameters=dict(storage_class.get("parameters") or {}))
        if node.segments:
            request.accessible_topology = v1.Topology(segments=dict(node.segments))
        response: v1.GetCapacityResponse = await connection.call(
            "/csi.v1.Controller/GetCapacity", request, call_timeout=timeout
        )
        return response.available_capacity >= _requested_bytes(claim)

    return check


def node_deployment(
    args: argparse.Namespace, node: LocalNode, connection: CSIConnection | None = None
) -> NodeDeployment:
    """The ProvisionController's node deployment from the flags and the driver's topology:
    volumes are this node's when their node affinity matches the driver's segment. With the
    driver's ``connection`` and its GET_CAPACITY capability, Immediate claims are taken only
    when GetCapacity says this node has room (:func:`capacity_check`), as upstream."""
    check = None
    if (
        connection is not None
        and v1.ControllerServiceCapabilityRpcType.GET_CAPACITY in connection.controller_capabilities
    ):
        check = capacity_check(connection, node, args.timeout)
    return NodeDeployment(
        node_name=node.name,
        immediate_binding=args.node_deployment_immediate_binding,
        base_delay=args.node_deployment_base_delay,
        max_delay=args.node_deployment_max_delay,
        topology=node.segments,
        capacity_check=check,
    )

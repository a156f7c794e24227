"""Nodes a CSI driver runs on, as the tests of provisioning with topology (tests/csi,
tests/reliability) create them: the Node with its topology label and the CSINode the driver
registered. Here at the root of ``tests/``, which pytest puts on ``sys.path``."""

from __future__ import annotations

from kubernetes_asyncio.client import ApiClient

from pyprovlib.kube._resources import CSINODES, NODES
from pyprovlib.kube._rest import ResourceClient


async def create_driver_node(
    api: ApiClient,
    name: str,
    driver: str,
    topology_key: str,
    *,
    value: str | None = None,
    keys: list[str] | None = None,
) -> None:
    """The Node ``name`` labelled ``topology_key`` = ``value`` (its own name by default), and
    its CSINode: ``driver`` runs there as node ``name``, reporting ``keys`` (by default
    ``[topology_key]``)."""
    await ResourceClient(api, NODES).create(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {topology_key: value or name}},
        }
    )
    await ResourceClient(api, CSINODES).create(
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "CSINode",
            "metadata": {"name": name},
            "spec": {
                "drivers": [
                    {
                        "name": driver,
                        "nodeID": name,
                        "topologyKeys": [topology_key] if keys is None else keys,
                    }
                ]
            },
        }
    )

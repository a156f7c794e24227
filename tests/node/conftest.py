"""Tests on a real node: a control plane from the assets directory (``PYPROVLIB_KUBE_ASSETS``)
with containerd and a kubelet joined to it (:class:`pyprovlib.testing._node.KubeletNode`).

Marked ``node`` and run with ``-m node`` (CI: ``.ci/real-node.sh``); each skips in one line
where a node cannot run (no assets directory, not root, packages missing). One control plane
and one node serve the whole session: a host has room for one kubelet.

At the end of the session the harness takes an inventory and fails the run if anything is
left: API objects the tests made (namespaces, PersistentVolumes, VolumeAttachments,
StorageClasses, CSIDrivers, pods), and, once the node is stopped, its processes, mounts,
network namespaces, cgroups and directories.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from inventory_support import inventory, left_behind

from pyprovlib.testing._controlplane import ControlPlane, assets_from_environment
from pyprovlib.testing._node import KubeletNode, node_unavailable


@dataclass
class RealNode:
    """The session's control plane and its node."""

    plane: ControlPlane
    node: KubeletNode

    @property
    def kubeconfig(self) -> Path:
        assert self.plane.kubeconfig_path is not None
        return self.plane.kubeconfig_path


def _why_not() -> str | None:
    assets = assets_from_environment()
    if assets is None:
        return (
            "no assets directory: set PYPROVLIB_KUBE_ASSETS to one holding etcd, "
            "kube-apiserver, kube-controller-manager, kube-scheduler and kubelet "
            "(docs/testing.md)"
        )
    return node_unavailable(assets)


@pytest.fixture(scope="session")
def real_node() -> Iterator[RealNode]:
    """The session's control plane (kube-apiserver, kube-controller-manager, kube-scheduler;
    no kubelet-less nodes) with a kubelet joined as a Ready node."""
    why = _why_not()
    if why is not None:
        if os.environ.get("PYPROVLIB_REQUIRE_NODE"):
            # CI installed what a node needs: a node that cannot run there is a failure.
            pytest.fail(f"real node unavailable although required: {why}")
        pytest.skip(f"real node unavailable: {why}")
    assets = assets_from_environment()
    assert assets is not None
    log_dir = os.environ.get("PYPROVLIB_KUBE_LOG_DIR") or None
    plane = ControlPlane(assets, nodes=0, log_dir=log_dir)
    node = KubeletNode(plane, log_dir=log_dir)

    async def start() -> set[str]:
        await plane.launch()
        await node.launch()
        async with plane.api_client() as api:
            return await inventory(api)

    async def remaining(before: set[str]) -> list[str]:
        async with plane.api_client() as api:
            return await left_behind(api, before)

    try:
        before = asyncio.run(start())
    except BaseException:
        asyncio.run(node.stop())
        plane.stop_sync()
        raise
    failure = ""
    try:
        yield RealNode(plane, node)
    finally:
        created = asyncio.run(remaining(before))
        asyncio.run(node.stop())
        host = node.leftovers()
        plane.stop_sync()
        if created:
            failure += "API objects left behind by the tests:\n  " + "\n  ".join(created)
        if host:
            failure += "\nleft on the host by the node:\n  " + "\n  ".join(host)
    if failure:
        pytest.fail(failure)

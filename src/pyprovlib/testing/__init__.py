"""Test controllers without a cluster: an in-memory Kubernetes API server speaking the real REST +
watch protocol, a PV binder playing kube-controller-manager, fault injection, and pytest fixtures.

The Python counterpart of client-go's fake clientset and envtest::

    from pyprovlib.testing import ApiServer

    async with ApiServer(binder=True) as server:
        async with server.api_client() as client:   # a real kubernetes-asyncio ApiClient
            ...

``ControlPlane`` starts a real etcd + kube-apiserver (+ controller-manager and scheduler) from a
directory of binaries, envtest-style; ``KubeletNode`` joins a real node (containerd + kubelet)
to it, so pods run and mount volumes. ``TcpProxy`` puts a partitionable TCP hop between one
client and the server.

``running``, ``eventually``, ``wait_bound``, ``wait_deleted``, ``wait_event`` and
``wait_idle`` are the waits
tests share: run a controller for a block, wait for a state, and the deterministic point for
"nothing happened" (see docs/testing.md).

``python -m pyprovlib.testing --port 8080 --kubeconfig /tmp/kubeconfig`` serves it for kubectl.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyprovlib._reexports import lazy_reexports

if TYPE_CHECKING:
    from pyprovlib.testing.binder import (
        PVBinder,
        set_selected_node,
    )
    from pyprovlib.testing.cluster import (
        TestCluster,
    )
    from pyprovlib.testing.controlplane import (
        ControlPlane,
        ControlPlaneError,
    )
    from pyprovlib.testing.faults import (
        Faults,
        Requests,
    )
    from pyprovlib.testing.netproxy import (
        PartitionMode,
        ProxyStats,
        TcpProxy,
    )
    from pyprovlib.testing.node import (
        KubeletNode,
        NodeUnavailableError,
        node_unavailable,
    )
    from pyprovlib.testing.server import (
        ApiServer,
        StorageView,
    )
    from pyprovlib.testing.support import (
        ChildProcess,
        child_env,
        child_process,
        events_of,
        eventually,
        running,
        wait_bound,
        wait_deleted,
        wait_event,
        wait_idle,
    )

__all__ = [
    "ApiServer",
    "ChildProcess",
    "ControlPlane",
    "ControlPlaneError",
    "Faults",
    "KubeletNode",
    "NodeUnavailableError",
    "PVBinder",
    "PartitionMode",
    "ProxyStats",
    "Requests",
    "StorageView",
    "TcpProxy",
    "TestCluster",
    "child_env",
    "child_process",
    "events_of",
    "eventually",
    "node_unavailable",
    "running",
    "set_selected_node",
    "wait_bound",
    "wait_deleted",
    "wait_event",
    "wait_idle",
]

# Imported on first use, so `python -m pyprovlib.testing` reaches its __main__ first.
__getattr__, __dir__ = lazy_reexports(
    __name__,
    {
        ".binder": ["PVBinder", "set_selected_node"],
        ".cluster": ["TestCluster"],
        ".controlplane": ["ControlPlane", "ControlPlaneError"],
        ".faults": ["Faults", "Requests"],
        ".netproxy": ["PartitionMode", "ProxyStats", "TcpProxy"],
        ".node": ["KubeletNode", "NodeUnavailableError", "node_unavailable"],
        ".server": ["ApiServer", "StorageView"],
        ".support": [
            "ChildProcess",
            "child_env",
            "child_process",
            "events_of",
            "eventually",
            "running",
            "wait_bound",
            "wait_deleted",
            "wait_event",
            "wait_idle",
        ],
    },
)

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
    from pyprovlib.testing._binder import (
        HttpTransport,
        PVBinder,
        set_selected_node,
    )
    from pyprovlib.testing._cluster import TestCluster
    from pyprovlib.testing._controlplane import (
        ControlPlane,
        ControlPlaneError,
        shared_control_plane,
    )
    from pyprovlib.testing._faults import (
        Faults,
        RequestMatch,
        Requests,
    )
    from pyprovlib.testing._netproxy import PartitionMode, TcpProxy
    from pyprovlib.testing._node import (
        KubeletNode,
        NodeUnavailableError,
        node_unavailable,
    )
    from pyprovlib.testing._scheduler import PodScheduler
    from pyprovlib.testing._server import (
        ApiServer,
        InProcessTransport,
        StorageView,
    )
    from pyprovlib.testing._support import (
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
    "HttpTransport",
    "InProcessTransport",
    "KubeletNode",
    "NodeUnavailableError",
    "PVBinder",
    "PartitionMode",
    "PodScheduler",
    "RequestMatch",
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
    "shared_control_plane",
    "wait_bound",
    "wait_deleted",
    "wait_event",
    "wait_idle",
]

# Imported on first use, so `python -m pyprovlib.testing` reaches its __main__ first.
__getattr__, __dir__ = lazy_reexports(
    __name__,
    {
        "._binder": ["HttpTransport", "PVBinder", "set_selected_node"],
        "._cluster": ["TestCluster"],
        "._controlplane": ["ControlPlane", "ControlPlaneError", "shared_control_plane"],
        "._faults": ["Faults", "RequestMatch", "Requests"],
        "._netproxy": ["PartitionMode", "TcpProxy"],
        "._node": ["KubeletNode", "NodeUnavailableError", "node_unavailable"],
        "._scheduler": ["PodScheduler"],
        "._server": ["ApiServer", "InProcessTransport", "StorageView"],
        "._support": [
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

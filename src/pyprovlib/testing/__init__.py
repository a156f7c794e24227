"""Test controllers without a cluster: an in-memory Kubernetes API server speaking the real REST +
watch protocol, a PV binder playing kube-controller-manager, fault injection, and pytest fixtures.

The Python counterpart of client-go's fake clientset and envtest::

    from pyprovlib.testing import ApiServer

    async with ApiServer(binder=True) as server:
        async with server.api_client() as client:   # a real kubernetes-asyncio ApiClient
            ...

``ControlPlane`` starts a real etcd + kube-apiserver (+ controller-manager and scheduler) from a
directory of binaries, envtest-style. ``TcpProxy`` puts a partitionable TCP hop between one
client and the server.

``python -m pyprovlib.testing --port 8080 --kubeconfig /tmp/kubeconfig`` serves it for kubectl.
"""

from pyprovlib.testing.binder import PVBinder, set_selected_node
from pyprovlib.testing.cluster import TestCluster
from pyprovlib.testing.controlplane import ControlPlane, ControlPlaneError
from pyprovlib.testing.faults import Faults, Requests
from pyprovlib.testing.netproxy import PartitionMode, ProxyStats, TcpProxy
from pyprovlib.testing.server import ApiServer, StorageView
from pyprovlib.testing.support import wait_idle

__all__ = [
    "ApiServer",
    "ControlPlane",
    "ControlPlaneError",
    "Faults",
    "PVBinder",
    "PartitionMode",
    "ProxyStats",
    "Requests",
    "StorageView",
    "TcpProxy",
    "TestCluster",
    "set_selected_node",
    "wait_idle",
]

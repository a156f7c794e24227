"""A PV binder for tests: kube-controller-manager's persistentvolume controller, reduced to what
dynamic provisioning and static binding need, talking to any API server.

It follows ``pkg/controller/volume/persistentvolume/pv_controller.go``: claims of a class with an
external provisioner get the ``volume.kubernetes.io/storage-provisioner`` annotations (only once a
node is selected for ``WaitForFirstConsumer`` classes), pre-bound and matching PVs are bound to
their claims (PV and claim both ``Bound``), PVs whose claim went away are ``Released`` and bound
claims whose PV went away are ``Lost``; like kube-controller-manager's protection controllers it
removes the ``kubernetes.io/pvc-protection`` / ``pv-protection`` finalizers of deleting claims and
PVs no longer in use. :func:`set_selected_node` plays the scheduler.

It reaches the API server through a kubernetes-asyncio ``ApiClient`` (HTTP), or, when
:class:`~pyprovlib.testing.ApiServer` runs it, through the server's in-process transport
(the same request pipeline without TCP and HTTP; see :class:`BinderTransport`).

The modules, by concern: ``_controller`` (informers, queue, workers), ``_claims`` (syncClaim and
binding), ``_volumes`` (syncVolume and reclaiming), ``_protection`` (the protection finalizers),
``_writes`` (the binder's caches, writes and Events), ``_transport`` (HTTP and in-process
access), ``_objects`` (annotations and helpers).
"""

from __future__ import annotations

from pyprovlib.testing._binder._controller import PVBinder
from pyprovlib.testing._binder._objects import (
    ANN_BETA_STORAGE_PROVISIONER,
    ANN_BIND_COMPLETED,
    ANN_BOUND_BY_CONTROLLER,
    ANN_DYNAMICALLY_PROVISIONED,
    ANN_SELECTED_NODE,
    ANN_STORAGE_PROVISIONER,
    BINDER_USER_AGENT,
    COMPONENT,
    claim_class,
    storage_quantity,
    volume_class,
)
from pyprovlib.testing._binder._transport import (
    BinderTransport,
    HttpTransport,
    TransportListerWatcher,
    set_selected_node,
)

__all__ = [
    "ANN_BETA_STORAGE_PROVISIONER",
    "ANN_BIND_COMPLETED",
    "ANN_BOUND_BY_CONTROLLER",
    "ANN_DYNAMICALLY_PROVISIONED",
    "ANN_SELECTED_NODE",
    "ANN_STORAGE_PROVISIONER",
    "BINDER_USER_AGENT",
    "COMPONENT",
    "BinderTransport",
    "HttpTransport",
    "PVBinder",
    "TransportListerWatcher",
    "claim_class",
    "set_selected_node",
    "storage_quantity",
    "volume_class",
]

_Http = HttpTransport
"""The former private name of :class:`HttpTransport`, still used by tests."""

"""Storage capacity tracking: the CapacityController keeps one ``CSIStorageCapacity``
(storage.k8s.io/v1) per StorageClass of a driver and topology segment, with the capacity the
driver reports, so kube-scheduler places WaitForFirstConsumer pods only where their volumes
fit — external-provisioner's ``pkg/capacity`` on asyncio.

The package, by concern (a reader of upstream finds each part by name):

- ``controller`` — :class:`CapacityController` (``capacity.go``): the goal of (class,
  segment) pairs, the work queue, the workers that create, refresh and delete objects, the
  poll, the refreshes after provisioning (``provision.go``) and the metrics.
- ``topology`` — segments and :class:`NodeTopology` (``topology/nodes.go``): the segments of
  the nodes where the driver runs, from CSINodes and Node labels.
- ``owner`` — :func:`lookup_owner` (``pkg/owner``): the Deployment, StatefulSet or Pod that
  owns the objects.
- ``options`` — :class:`CapacityControllerOptions` with upstream's defaults, and the labels.
- ``metrics`` — the ``csistoragecapacities_*`` gauges.

It knows nothing about CSI: capacity comes from a :class:`CapacitySource`
(:mod:`pyprovlib.csi.provisioner._capacity` implements it with GetCapacity).
"""

from __future__ import annotations

from pyprovlib.controller._capacity.controller import (
    CAPACITY_QUEUE,
    GENERATE_NAME,
    Capacity,
    CapacityController,
    CapacitySource,
    Obsolete,
    WorkItem,
)
from pyprovlib.controller._capacity.options import (
    DEFAULT_MANAGED_BY,
    DEFAULT_POLL_INTERVAL,
    DRIVER_NAME_LABEL,
    MANAGED_BY_LABEL,
    CapacityControllerOptions,
    InvalidCapacityOptionsError,
    managed_labels,
)
from pyprovlib.controller._capacity.owner import OwnerLookupError, lookup_owner
from pyprovlib.controller._capacity.topology import (
    FixedTopology,
    NodeTopology,
    Segment,
    TopologyInformer,
    segment_selector,
)

__all__ = [
    "CAPACITY_QUEUE",
    "DEFAULT_MANAGED_BY",
    "DEFAULT_POLL_INTERVAL",
    "DRIVER_NAME_LABEL",
    "GENERATE_NAME",
    "MANAGED_BY_LABEL",
    "Capacity",
    "CapacityController",
    "CapacityControllerOptions",
    "CapacitySource",
    "FixedTopology",
    "InvalidCapacityOptionsError",
    "NodeTopology",
    "Obsolete",
    "OwnerLookupError",
    "Segment",
    "TopologyInformer",
    "WorkItem",
    "lookup_owner",
    "managed_labels",
    "segment_selector",
]

"""Controllers built on :mod:`pyprovlib.kube`: what they share beyond the user contract.

The controllers themselves (:class:`~pyprovlib.ProvisionController`,
:class:`~pyprovlib.AttachController`, :class:`~pyprovlib.ResizeController`,
:class:`~pyprovlib.ModifyController`) and their options are imported from :mod:`pyprovlib`.
This package holds the rest of what a user of them may need: the capacity controller, the
volume stores, the provisioning metrics, the health endpoint, and sig-storage-lib's
annotation names. The modules under it (``_provision``, ``_attach``, ``_resize``, ``_modify``,
``_capacity``, ...) are internal.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyprovlib._reexports import lazy_reexports

if TYPE_CHECKING:
    from pyprovlib.controller._capacity import (
        Capacity,
        CapacityController,
        CapacityControllerOptions,
        CapacitySource,
        FixedTopology,
        NodeTopology,
        Segment,
        lookup_owner,
    )
    from pyprovlib.controller._endpoint import EndpointServer
    from pyprovlib.controller._metrics import ProvisionMetrics
    from pyprovlib.controller._options import (
        NodeDeployment,
        VolumeNameHook,
        in_cluster_namespace,
        provisioned_volume_name,
    )
    from pyprovlib.controller._provision.decisions import (
        ANN_BETA_STORAGE_PROVISIONER,
        ANN_DYNAMICALLY_PROVISIONED,
        ANN_MIGRATED_TO,
        ANN_SELECTED_NODE,
        ANN_STORAGE_PROVISIONER,
        FINALIZER_PV,
    )
    from pyprovlib.controller._volume_store import (
        BackoffStore,
        QueueStore,
        VolumeSaveError,
        VolumeStore,
    )

__all__ = [
    "ANN_BETA_STORAGE_PROVISIONER",
    "ANN_DYNAMICALLY_PROVISIONED",
    "ANN_MIGRATED_TO",
    "ANN_SELECTED_NODE",
    "ANN_STORAGE_PROVISIONER",
    "FINALIZER_PV",
    "BackoffStore",
    "Capacity",
    "CapacityController",
    "CapacityControllerOptions",
    "CapacitySource",
    "EndpointServer",
    "FixedTopology",
    "NodeDeployment",
    "NodeTopology",
    "ProvisionMetrics",
    "QueueStore",
    "Segment",
    "VolumeNameHook",
    "VolumeSaveError",
    "VolumeStore",
    "in_cluster_namespace",
    "lookup_owner",
    "provisioned_volume_name",
]

__getattr__, __dir__ = lazy_reexports(
    __name__,
    {
        "._capacity": [
            "Capacity",
            "CapacityController",
            "CapacityControllerOptions",
            "CapacitySource",
            "FixedTopology",
            "NodeTopology",
            "Segment",
            "lookup_owner",
        ],
        "._endpoint": ["EndpointServer"],
        "._metrics": ["ProvisionMetrics"],
        "._options": [
            "NodeDeployment",
            "VolumeNameHook",
            "in_cluster_namespace",
            "provisioned_volume_name",
        ],
        "._provision.decisions": [
            "ANN_BETA_STORAGE_PROVISIONER",
            "ANN_DYNAMICALLY_PROVISIONED",
            "ANN_MIGRATED_TO",
            "ANN_SELECTED_NODE",
            "ANN_STORAGE_PROVISIONER",
            "FINALIZER_PV",
        ],
        "._volume_store": ["BackoffStore", "QueueStore", "VolumeSaveError", "VolumeStore"],
    },
)

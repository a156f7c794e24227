"""The ResizeController: kubernetes-csi/external-resizer's ``resizeController`` with its
``expandAndRecover`` path on asyncio, driving a :class:`~pyprovlib.Resizer`.

The package, by concern (a reader of upstream's ``pkg/controller`` finds each part by name):

- ``controller`` — :class:`ResizeController`: informers, the claim queue, event handlers that
  only enqueue, workers, leader election; the sync of one claim (expand and recover).
- ``claims`` — the names (reasons, conditions, statuses, annotations) and the pure decisions
  over a claim and its volume: which size, whether an update matters.
- ``status`` — every write: the claim's status, the volume's capacity, events.
- ``options`` — :class:`ResizeControllerOptions` with external-resizer's flag defaults and the
  Lease name.
"""

from __future__ import annotations

from pyprovlib.controller._errors import DelayRetryError
from pyprovlib.controller._lifecycle import LeaderElectionLostError
from pyprovlib.controller._resize.claims import (
    ANN_NODE_EXPANSION_NOT_REQUIRED,
    ANN_STORAGE_RESIZER,
    CONDITION_CONTROLLER_RESIZE_ERROR,
    CONDITION_FILE_SYSTEM_RESIZE_PENDING,
    CONDITION_NODE_RESIZE_ERROR,
    CONDITION_RESIZING,
    REASON_FILE_SYSTEM_RESIZE_REQUIRED,
    REASON_RESIZING,
    REASON_VOLUME_RESIZE_FAILED,
    REASON_VOLUME_RESIZE_SUCCESSFUL,
    STATUS_CONTROLLER_RESIZE_IN_PROGRESS,
    STATUS_CONTROLLER_RESIZE_INFEASIBLE,
    STATUS_NODE_RESIZE_IN_PROGRESS,
    STATUS_NODE_RESIZE_INFEASIBLE,
    STATUS_NODE_RESIZE_PENDING,
    expansion_target,
    merge_resize_conditions,
    should_enqueue_pvc_change,
)
from pyprovlib.controller._resize.controller import EVENT_FLUSH_TIMEOUT, ResizeController
from pyprovlib.controller._resize.options import (
    InvalidResizeOptionsError,
    ResizeControllerOptions,
    lease_name,
)

__all__ = [
    "ANN_NODE_EXPANSION_NOT_REQUIRED",
    "ANN_STORAGE_RESIZER",
    "CONDITION_CONTROLLER_RESIZE_ERROR",
    "CONDITION_FILE_SYSTEM_RESIZE_PENDING",
    "CONDITION_NODE_RESIZE_ERROR",
    "CONDITION_RESIZING",
    "EVENT_FLUSH_TIMEOUT",
    "REASON_FILE_SYSTEM_RESIZE_REQUIRED",
    "REASON_RESIZING",
    "REASON_VOLUME_RESIZE_FAILED",
    "REASON_VOLUME_RESIZE_SUCCESSFUL",
    "STATUS_CONTROLLER_RESIZE_INFEASIBLE",
    "STATUS_CONTROLLER_RESIZE_IN_PROGRESS",
    "STATUS_NODE_RESIZE_INFEASIBLE",
    "STATUS_NODE_RESIZE_IN_PROGRESS",
    "STATUS_NODE_RESIZE_PENDING",
    "DelayRetryError",
    "InvalidResizeOptionsError",
    "LeaderElectionLostError",
    "ResizeController",
    "ResizeControllerOptions",
    "expansion_target",
    "lease_name",
    "merge_resize_conditions",
    "should_enqueue_pvc_change",
]

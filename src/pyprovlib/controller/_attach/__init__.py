"""The AttachController: kubernetes-csi/external-attacher's ``CSIAttachController`` (CSI
handler and trivial handler) on asyncio, driving an :class:`~pyprovlib.Attacher`.

The package, by concern (a reader of upstream's ``pkg/controller`` finds each part by name):

- ``controller`` — :class:`AttachController`: informers, the VolumeAttachment and
  PersistentVolume queues, event handlers that only enqueue, workers, the reconciler, leader
  election.
- ``sync`` — the sync of one VolumeAttachment (attach or detach) and of one PV.
- ``resolve`` — reading a VolumeAttachment into the volume, node and secrets of an attacher
  call; the pure decisions over the cached objects.
- ``writes`` — every write (finalizers, status, errors), remembering what it wrote.
- ``options`` — :class:`AttachControllerOptions` with external-attacher's flag defaults, the
  finalizer and Lease names.
- ``errors`` — :class:`InvalidAttachOptionsError` and the timeout of one attacher call.
"""

from __future__ import annotations

from pyprovlib.controller._attach.controller import PV_INDEX, AttachController
from pyprovlib.controller._attach.errors import InvalidAttachOptionsError
from pyprovlib.controller._attach.options import (
    AttachControllerOptions,
    finalizer_name,
    lease_name,
)
from pyprovlib.controller._attach.resolve import NODE_ID_ANNOTATION, should_enqueue_va_change
from pyprovlib.controller._lifecycle import LeaderElectionLostError
from pyprovlib.controller._sidecar_options import sanitize_driver_name

__all__ = [
    "NODE_ID_ANNOTATION",
    "PV_INDEX",
    "AttachController",
    "AttachControllerOptions",
    "InvalidAttachOptionsError",
    "LeaderElectionLostError",
    "finalizer_name",
    "lease_name",
    "sanitize_driver_name",
    "should_enqueue_va_change",
]

"""The ResizeController: kubernetes-csi/external-resizer's ``resizeController`` with its
``expandAndRecover`` path on asyncio, driving a :class:`~pyprovlib.Resizer`.

The package, by concern (a reader of upstream's ``pkg/controller`` finds each part by name):

- ``controller`` — :class:`ResizeController`: informers, the claim queue, event handlers that
  only enqueue, workers, leader election.
- ``claim_controller`` — what the resize and modify controllers (external-resizer's two) share:
  the recorder, the claim queue and its handlers, the worker's retry of one claim.
- ``sync`` — the sync of one claim (expand and recover) and its failure bookkeeping.
- ``claims`` — the names (reasons, conditions, statuses, annotations) and the pure decisions
  over a claim and its volume: which size, whether an update matters.
- ``status`` — every write: the claim's status, the volume's capacity, events.
- ``options`` — :class:`ResizeControllerOptions` with external-resizer's flag defaults and the
  Lease name; ``ResizerSidecarOptions``, the fields the modify controller's options share.
- ``errors`` — :class:`InvalidResizeOptionsError` and how a failure is told; the retry-later
  error is the controllers' one :class:`DelayRetryError`.
"""

from __future__ import annotations

from pyprovlib.controller._errors import DelayRetryError
from pyprovlib.controller._lifecycle import LeaderElectionLostError
from pyprovlib.controller._resize import claims
from pyprovlib.controller._resize.claims import *  # noqa: F403 - the names of an expansion
from pyprovlib.controller._resize.controller import EVENT_FLUSH_TIMEOUT, ResizeController
from pyprovlib.controller._resize.errors import InvalidResizeOptionsError
from pyprovlib.controller._resize.options import ResizeControllerOptions, lease_name

__all__ = [
    "EVENT_FLUSH_TIMEOUT",
    "DelayRetryError",
    "InvalidResizeOptionsError",
    "LeaderElectionLostError",
    "ResizeController",
    "ResizeControllerOptions",
    "lease_name",
]
__all__ += claims.__all__

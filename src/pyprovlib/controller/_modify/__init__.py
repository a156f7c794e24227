"""The ModifyController: VolumeAttributesClass changes of Bound claims applied to their volumes
through a :class:`~pyprovlib.Modifier` — kubernetes-csi/external-resizer's
``pkg/modifycontroller`` on asyncio.

A Bound claim whose ``spec.volumeAttributesClassName`` differs from its
``status.currentVolumeAttributesClassName`` is marked ``InProgress`` towards the class (with a
``ModifyingVolume`` condition and a ``VolumeModify`` event), its volume is modified with the
class's parameters, then the volume's ``spec.volumeAttributesClassName`` and the claim's current
class are set and the status cleared (``VolumeModifySuccessful``). A class that does not exist
makes the claim ``Pending``; parameters the backend refuses as invalid make it ``Infeasible``
(``ModifyVolumeError`` condition, ``VolumeModifyFailed`` event), retried only after
``retry_interval_max`` unless the claim names another class or its current one back; an error
that leaves the outcome open keeps the modification going towards its target whatever the claim
asks meanwhile. A class taken back to nothing cancels a modification that is not running
(``VolumeModifyCanceled``).

The package, by concern (a reader of upstream's files finds each part by name):

- ``controller`` — :class:`ModifyController`: informers, the work queue, handlers that only
  enqueue, workers, leader election (``controller.go``); what it shares with the resize
  controller is :mod:`pyprovlib.controller._resize.claim_controller`'s.
- ``sync`` — the sync of one claim (``syncPVC``, ``modify_volume.go``).
- ``claims`` — the names (statuses, conditions, reasons, parameter keys) and the decisions made
  from a claim alone: which updates need a look, what to do now.
- ``status`` — every write: the claim's status and conditions, the volume's class, events
  (``modify_status.go``).
- ``expectations`` — what the controller knows that its cache does not show yet: uncertain and
  slow claims, modifications done but not yet recorded, writes not yet seen.
- ``options`` — :class:`ModifyControllerOptions` with upstream's defaults (the resizer's).
- ``errors`` — :class:`InvalidModifyOptionsError`, :class:`VolumeNotCachedError` and how a
  failure is told; the retry-later error is the controllers' one ``DelayRetryError``.
"""

from pyprovlib.controller._modify import claims
from pyprovlib.controller._modify.claims import *  # noqa: F403 - the names of a modification
from pyprovlib.controller._modify.controller import ModifyController
from pyprovlib.controller._modify.errors import InvalidModifyOptionsError, VolumeNotCachedError
from pyprovlib.controller._modify.options import ModifyControllerOptions, lease_name

__all__ = [
    "InvalidModifyOptionsError",
    "ModifyController",
    "ModifyControllerOptions",
    "VolumeNotCachedError",
    "lease_name",
]
__all__ += claims.__all__

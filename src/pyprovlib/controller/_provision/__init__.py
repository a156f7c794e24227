"""The ProvisionController: dynamic provisioning and deletion of PersistentVolumes for a
:class:`~pyprovlib.Provisioner` — sig-storage-lib-external-provisioner's
``controller.go`` (v13) on asyncio.

Claims flow in from a shared informer, keyed by UID; volumes keyed by name. A claim annotated
for this provisioner (``volume.kubernetes.io/storage-provisioner``, or the beta annotation) is
provisioned once its StorageClass is known (and, for ``WaitForFirstConsumer``, once the
scheduler picked a node); the PV the provisioner returns gets its claimRef, class, reclaim
policy, mount options, ``pv.kubernetes.io/provisioned-by`` and optionally the protection
finalizer, and is saved through a volume store. A Released PV with the Delete policy that this
provisioner created is deleted: first the asset, then the PV (with a UID precondition), then
the finalizer.

Differences from upstream, each on purpose:

- Claims whose provisioning may still run in the background (``IN_BACKGROUND``) are retried
  beyond ``failed_provision_threshold``: giving up on them could leak a volume.
- A claim waiting out an infeasible error is re-queued for the time remaining instead of
  failing every retry, so the wait neither burns the failure budget nor spins.
- The PV is deleted with a UID precondition, so a PV recreated under the same name is never
  deleted by mistake.
- v13 hands the provisioner the selected node's name only, so no Node object is fetched.
- Checks kube-controller-manager does for in-tree plugins are done here too: a claim with a
  selector, an invalid storage request or (for provisioners declaring
  :class:`MountOptionsProvisioner` without support) a class with mountOptions gets a
  ``ProvisioningFailed`` event instead of a call to the provisioner.

The package, by concern (a reader of upstream's ``controller.go`` finds each part by name):

- ``controller`` — :class:`ProvisionController`: informers, work queues, event handlers that
  only enqueue, workers, leader election, the metrics and health endpoint.
- ``claims`` — the claim worker: ``should_provision``, the provisioning operation, refusals,
  infeasible errors, rescheduling and retries.
- ``attempt`` — :class:`ProvisionAttempt`, what one provisioning attempt ended in
  (:class:`Outcome`), instead of errors returned as values.
- ``protected_claims`` — :class:`~pyprovlib.controller._provision.protected_claims.ClaimFinalizer`:
  the provisioning-protection finalizer's life cycle on a claim, and finishing and deleting the
  volume of a claim deleted before it was bound; ``ClaimSync`` uses it.
- ``volumes`` — the volume worker: the PV finalizer, ``DeletionGuard``, deleting the asset and
  the PV.
- ``node_deployment`` — distributed provisioning (:class:`NodeDeployment`): which claims and
  volumes are this node's, and the race for claims with Immediate binding.
- ``expectations`` — what the controller wrote about PVs that its cache has not shown yet.
- ``protection`` — the claim finalizer's API writes and ``ClaimProtection``, what the
  controller did with it that its cache may not show yet.
- ``decisions`` — pure decisions over the cached dicts, the annotations, ``complete_volume``.
- ``errors``, ``slowset``, ``context`` — the claim errors, the claims held back
  after an infeasible error, the wiring the parts share.
"""

from __future__ import annotations

from pyprovlib._provisioner import InfeasibleError, MountOptionsProvisioner
from pyprovlib.controller._lifecycle import LeaderElectionLostError
from pyprovlib.controller._options import NodeDeployment
from pyprovlib.controller._provision import decisions
from pyprovlib.controller._provision.attempt import Outcome, ProvisionAttempt
from pyprovlib.controller._provision.controller import ProvisionController
from pyprovlib.controller._provision.decisions import *  # noqa: F403 - the package exports decisions' names
from pyprovlib.controller._provision.errors import ClassNotFoundError, is_infeasible_error
from pyprovlib.controller._provision.node_deployment import (
    allowed_topologies_match,
    volume_is_accessible,
)
from pyprovlib.controller._provision.protection import FINALIZER_PROVISIONING
from pyprovlib.controller._provision.slowset import SlowSet

__all__ = [
    "FINALIZER_PROVISIONING",
    "ClassNotFoundError",
    "InfeasibleError",
    "LeaderElectionLostError",
    "MountOptionsProvisioner",
    "NodeDeployment",
    "Outcome",
    "ProvisionAttempt",
    "ProvisionController",
    "SlowSet",
    "allowed_topologies_match",
    "is_infeasible_error",
    "volume_is_accessible",
]
__all__ += decisions.__all__

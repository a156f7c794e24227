"""The volume expansion controller: kubernetes-csi/external-resizer's ``resizeController`` with
its ``expandAndRecover`` path (Kubernetes' RecoverVolumeExpansionFailure semantics), driving a
:class:`~pyprovlib.Resizer`.

Data flow (as upstream): informers on PersistentVolumeClaims, PersistentVolumes, StorageClasses
(and Pods, for the in-use handling); the claim handlers enqueue ``namespace/name`` keys when a
claim's request grew; workers read the current claim and its volume from the caches and

- skip claims that are not Bound, do not ask for more than ``status.capacity``, or whose volume
  the resizer does not support (with a ``VolumeResizeFailed`` event when the class names this
  resizer as its provisioner, so the user learns why nothing happens);
- refuse (event, no action) claims whose class does not have ``allowVolumeExpansion: true`` —
  on a real cluster the PersistentVolumeClaimResize admission plugin refuses them earlier;
- choose the size to expand to from ``status.allocatedResources`` and
  ``status.allocatedResourceStatuses`` (so a user may lower a request that failed, but never
  below what may already be allocated), mark the claim ``Resizing`` /
  ``ControllerResizeInProgress``, call :meth:`Resizer.expand`, write the PV's capacity, and
  then either finish (``status.capacity``) or hand over to the node
  (``FileSystemResizePending`` / ``NodeResizePending``);
- record failures as a ``ControllerResizeError`` condition (``ControllerResizeInfeasible`` for
  requests that can never succeed) and a ``VolumeResizeFailed`` event, retried with backoff.

This module is the wiring: informers, the claim queue, handlers that only enqueue (the part
the modify controller shares is :mod:`~pyprovlib.controller._resize.claim_controller`'s),
workers and leader election. Beside it: :mod:`~pyprovlib.controller._resize.sync` syncs one
claim (expand and recover); :mod:`~pyprovlib.controller._resize.claims` holds the names
(reasons, conditions, statuses) and the pure decisions over a claim and its volume (which size,
whether an update matters); :mod:`~pyprovlib.controller._resize.status` makes every write
(claim status, PV capacity, events); :mod:`~pyprovlib.controller._resize.options` holds the
options and upstream's defaults; :mod:`~pyprovlib.controller._resize.errors` the errors.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from kubernetes_asyncio.client import ApiClient, V1PersistentVolume

from pyprovlib._logging import get_logger
from pyprovlib._resizer import Resizer
from pyprovlib.controller._errors import DelayRetryError
from pyprovlib.controller._lifecycle import EVENT_FLUSH_TIMEOUT, LeaderElectionLostError
from pyprovlib.controller._resize.claim_controller import ResizerClaimController
from pyprovlib.controller._resize.claims import (
    POD_PVC_INDEX,
    claim_needs_resize,
    pod_claims,
    should_enqueue_pvc_change,
)
from pyprovlib.controller._resize.errors import error_text
from pyprovlib.controller._resize.options import ResizeControllerOptions
from pyprovlib.controller._resize.options import lease_name as default_lease_name
from pyprovlib.controller._resize.status import ResizeStatusWriter
from pyprovlib.controller._resize.sync import ResizeSync
from pyprovlib.kube._clock import Clock
from pyprovlib.kube._informer import SharedInformer, SharedInformerFactory
from pyprovlib.kube._objects import Obj
from pyprovlib.kube._resources import PODS, STORAGE_CLASSES

__all__ = [
    "EVENT_FLUSH_TIMEOUT",
    "DelayRetryError",
    "LeaderElectionLostError",
    "ResizeController",
]

log = get_logger(__name__)

ResizerT = TypeVar("ResizerT", bound=Resizer)


class ResizeController(ResizerClaimController, Generic[ResizerT]):
    """Expands the volumes of claims whose storage request grew, through ``resizer``
    (external-resizer's ``resizeController``); generic in the resizer's type, so a subclass
    reads its own resizer's methods from :attr:`resizer`.

    ``client`` is a kubernetes-asyncio ``ApiClient``. Informers come from ``informer_factory``
    when given (the caller starts it) or from a factory the controller owns. :meth:`run` runs
    everything until cancelled or :meth:`stop`; it can be called once.
    """

    def __init__(
        self,
        client: ApiClient,
        resizer: ResizerT,
        options: ResizeControllerOptions | None = None,
        *,
        informer_factory: SharedInformerFactory | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.resizer = resizer
        self.options = options or ResizeControllerOptions()
        super().__init__(
            client,
            resizer,
            self.options,
            what="resizer",
            role="resizer",
            lease_name=default_lease_name,
            describe=error_text,
            log=log,
            informer_factory=informer_factory,
            clock=clock,
        )
        self.class_informer: SharedInformer = self.informer_factory.informer_for(STORAGE_CLASSES)
        self.pod_informer: SharedInformer | None = None
        if self.options.handle_volume_in_use_error:
            self.pod_informer = self.informer_factory.informer_for(PODS)
            self.pod_informer.add_indexers({POD_PVC_INDEX: pod_claims})
        self._sync = ResizeSync(
            resizer=resizer,
            name=self.name,
            options=self.options,
            claims=self.pvc_informer.store,
            volumes=self.pv_informer.store,
            classes=self.class_informer.store,
            pods=self.pod_informer.store if self.pod_informer is not None else None,
            # Every write: the claim's resize status, the volume's capacity, the claim's events.
            writes=self._claim_writer(ResizeStatusWriter),
            clock=self._clock,
            log=self._log,
        )

    # -- lifecycle -----------------------------------------------------------------------------

    async def run(self) -> None:
        """Run until cancelled or :meth:`stop`. With leader election the control loop runs only
        while holding the Lease; losing it raises :class:`LeaderElectionLostError`."""
        with self._running():
            self._log.info("starting external resizer")
            await self._run_elected_with_events(self.recorder)
        self._log.info("external resizer stopped")

    async def _run_controller(self) -> None:
        """Informers, then the workers, until stop (upstream's ``Run``)."""
        caches = [self.class_informer]
        if self.pod_informer is not None:
            caches.append(self.pod_informer)
        await self._run_claim_workers(caches, started="started external resizer")

    def _should_enqueue(self, old: Obj, new: Obj) -> bool:
        return should_enqueue_pvc_change(old, new)

    def _forget(self, key: str) -> None:
        self._sync.forget(key)

    # -- the sync of one claim -----------------------------------------------------------------

    async def sync_claim(self, key: str) -> None:
        """Look at the claim ``key`` (``namespace/name``) and expand its volume if it asks for
        more (upstream's ``syncPVC``); raises when it must be retried."""
        await self._sync.sync_claim(key)

    claim_needs_resize = staticmethod(claim_needs_resize)

    async def expand_and_recover(
        self, pvc: Obj, pv: Obj, volume: V1PersistentVolume | None = None
    ) -> None:
        """Expand the volume ``pv`` (cached JSON; ``volume`` its model, when converted already)
        of the claim ``pvc`` to the size its allocation state allows, skipping the checks of
        :meth:`sync_claim` (upstream's ``expandAndRecover``); raises when the claim must be
        retried."""
        await self._sync.expand_and_recover(pvc, pv, volume)

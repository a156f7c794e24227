"""The ModifyController itself (external-resizer's ``modifyController``): informers on claims,
volumes and VolumeAttributesClasses, the claim queue their handlers feed (the part the resize
controller shares is :mod:`~pyprovlib.controller._resize.claim_controller`'s), the workers and
leader election. The sync of one claim (``syncPVC`` and ``modify``) is :mod:`.sync`'s.

Invariant: event handlers only enqueue ``namespace/name`` keys; every decision is a worker's,
taken on the claim and volume the caches hold when the key is processed.

Differences from upstream, each on purpose:

- Claims whose class does not exist yet are looked at again as soon as the class is created
  (upstream waits for the resync period, ten minutes by default).
- A claim whose class is taken back to nothing, or that becomes Bound, is looked at at once;
  so is a claim that asked for another class while an uncertain modification was finished.
- A class of another driver is refused as infeasible before the driver is called (upstream
  sends its parameters to whatever driver the volume has).
- A failure without a gRPC code (an unreadable Secret, a bug in a Python modifier) gets a
  ``VolumeModifyFailed`` event too, so the user learns why nothing happens; it changes nothing
  in the claim's status, as upstream.
- A claim waiting out its slow period (infeasible) is requeued for the time left, not retried
  with backoff meanwhile.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from kubernetes_asyncio.client import ApiClient

from pyprovlib._logging import get_logger
from pyprovlib._modifier import Modifier
from pyprovlib.controller._modify.claims import (
    STATUS_IN_PROGRESS,
    STATUS_INFEASIBLE,
    VAC_INDEX,
    claim_key,
    claims_by_class,
    modify_status,
    should_enqueue,
)
from pyprovlib.controller._modify.errors import VolumeNotCachedError, error_text
from pyprovlib.controller._modify.expectations import ModifyExpectations
from pyprovlib.controller._modify.options import ModifyControllerOptions
from pyprovlib.controller._modify.options import lease_name as default_lease_name
from pyprovlib.controller._modify.status import ModifyStatusWriter
from pyprovlib.controller._modify.sync import ModifySync
from pyprovlib.controller._resize.claim_controller import ResizerClaimController
from pyprovlib.kube._clock import Clock
from pyprovlib.kube._informer import SharedInformer, SharedInformerFactory
from pyprovlib.kube._objects import Obj, as_mapping, name_of
from pyprovlib.kube._resources import VOLUME_ATTRIBUTES_CLASSES

__all__ = ["ModifyController", "VolumeNotCachedError"]

log = get_logger("pyprovlib.controller._modify")

ModifierT = TypeVar("ModifierT", bound=Modifier)


class ModifyController(ResizerClaimController, Generic[ModifierT]):
    """Modifies the volumes of Bound claims whose ``spec.volumeAttributesClassName`` changed,
    through ``modifier`` (external-resizer's ``modifyController``); generic in the modifier's
    type.

    ``client`` is a kubernetes-asyncio ``ApiClient``. Informers come from ``informer_factory``
    when given (the caller starts it) or from a factory the controller owns. :meth:`run` runs
    everything until cancelled or :meth:`stop`; it can be called once.
    """

    def __init__(
        self,
        client: ApiClient,
        modifier: ModifierT,
        options: ModifyControllerOptions | None = None,
        *,
        informer_factory: SharedInformerFactory | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.modifier = modifier
        self.options = options or ModifyControllerOptions()
        super().__init__(
            client,
            modifier,
            self.options,
            what="modifier",
            role="modify controller",
            lease_name=default_lease_name,
            describe=error_text,
            log=log,
            informer_factory=informer_factory,
            clock=clock,
        )
        self.expectations = ModifyExpectations(self._clock, self.options.retry_interval_max)
        self.pvc_informer.add_indexers({VAC_INDEX: claims_by_class})
        # A driver that cannot modify needs no classes: it only tells users so.
        self.vac_informer: SharedInformer | None = None
        if modifier.modify_supported:
            self.vac_informer = self.informer_factory.informer_for(VOLUME_ATTRIBUTES_CLASSES)
            self.vac_informer.add_event_handler(on_add=self._vac_added)
        self._sync = ModifySync(
            modifier=modifier,
            name=self.name,
            options=self.options,
            claims=self.pvc_informer.store,
            volumes=self.pv_informer.store,
            classes=self.vac_informer.store if self.vac_informer is not None else None,
            queue=self.claim_queue,
            expectations=self.expectations,
            writes=self._claim_writer(ModifyStatusWriter),
            log=self._log,
        )

    # -- lifecycle -----------------------------------------------------------------------------

    async def run(self) -> None:
        """Run until cancelled or :meth:`stop`. With leader election the control loop runs only
        while holding the Lease; losing it raises
        :class:`~pyprovlib.LeaderElectionLostError`."""
        with self._running():
            self._log.info("starting external resizer for modify volume")
            await self._run_elected_with_events(self.recorder)
        self._log.info("external resizer for modify volume stopped")

    async def _run_controller(self) -> None:
        """Informers, then the uncertain claims, then the workers, until stop (upstream's
        ``Run``)."""
        await self._run_claim_workers(
            [] if self.vac_informer is None else [self.vac_informer],
            started="started external resizer for modify volume",
            on_synced=self._init_uncertain,
        )

    def _init_uncertain(self) -> None:
        """Claims whose status says a modification was running (or refused) when this
        instance started: it may still be running in the driver, so its target is finished
        first (upstream's ``initUncertainPVCs``)."""
        for pvc in self.pvc_informer.store.list():
            state = as_mapping(modify_status(pvc)).get("status")
            if state in (STATUS_IN_PROGRESS, STATUS_INFEASIBLE):
                self.expectations.set_uncertain(claim_key(pvc))

    # -- informer handlers ---------------------------------------------------------------------

    def _should_enqueue(self, old: Obj, new: Obj) -> bool:
        return should_enqueue(old, new)

    def _forget(self, key: str) -> None:
        self.expectations.forget(key)

    def _vac_added(self, vac: Obj) -> None:
        # Claims waiting (Pending) for this class to exist.
        for pvc in self.pvc_informer.store.by_index(VAC_INDEX, name_of(vac)):
            self.claim_queue.add(claim_key(pvc))

    # -- the sync of one claim -----------------------------------------------------------------

    async def sync_claim(self, key: str) -> None:
        """Look at the claim ``key`` (``namespace/name``) and bring its volume to the class it
        asks for (upstream's ``syncPVC``); raises when it must be retried."""
        await self._sync.sync_claim(key)

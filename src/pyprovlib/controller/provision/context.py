"""What the provisioning controller's parts share: the backend, the options, the API clients,
the informer caches, the event recorder, the metrics, the clock and the logger — wired once by
:class:`~pyprovlib.controller.provision.ProvisionController` and handed to the claim side
(``claims``) and the volume side (``volumes``).

Nothing here changes after construction; the bookkeeping that does change lives in its own
named objects (:class:`~pyprovlib.controller.provision.expectations.VolumeExpectations`,
:class:`~pyprovlib.controller.provision.protection.ClaimProtection`, the claims in progress
of ``claims``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyprovlib.controller.metrics import ProvisionMetrics
from pyprovlib.controller.options import ProvisionControllerOptions
from pyprovlib.kube.clock import Clock
from pyprovlib.kube.events import EventRecorder
from pyprovlib.kube.objects import Obj
from pyprovlib.kube.rest import ResourceClient
from pyprovlib.kube.store import Indexer
from pyprovlib.provisioner import Provisioner

if TYPE_CHECKING:
    import structlog

__all__ = ["ProvisionContext"]


@dataclass(frozen=True, eq=False)
class ProvisionContext:
    """The controller's wiring, read by its claim and volume workers."""

    provisioner_name: str
    provisioner: Provisioner
    options: ProvisionControllerOptions
    names: frozenset[str]
    """The provisioner name and its additional names: claims and PVs naming one are ours."""
    recorder: EventRecorder
    metrics: ProvisionMetrics
    claims_client: ResourceClient
    volumes_client: ResourceClient
    claims: Indexer
    """The claim informer's cache (indexed by UID)."""
    volumes: Indexer
    """The PV informer's cache."""
    classes: Indexer
    """The StorageClass informer's cache."""
    clock: Clock
    log: structlog.typing.FilteringBoundLogger | Any

    def storage_class(self, name: str) -> Obj | None:
        """The cached StorageClass ``name``, None when unknown."""
        return self.classes.get_by_key(name)

    @staticmethod
    def deadline(timeout: float | None) -> float | None:
        """The event-loop time ``timeout`` seconds from now (None: no deadline)."""
        return None if timeout is None else asyncio.get_running_loop().time() + timeout

"""What the provisioning controller's parts share: the backend, the options, the API clients,
the informer caches, the event recorder, the metrics, the clock and the logger — wired once by
:class:`~pyprovlib.ProvisionController` and handed to the claim side
(``claims``) and the volume side (``volumes``).

Nothing here changes after construction; the bookkeeping that does change lives in its own
named objects (:class:`~pyprovlib.controller._provision.expectations.VolumeExpectations`,
:class:`~pyprovlib.controller._provision.protection.ClaimProtection`, the claims in progress
of ``claims``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyprovlib._provisioner import Provisioner
from pyprovlib.controller._metrics import ProvisionMetrics
from pyprovlib.controller._options import ProvisionControllerOptions
from pyprovlib.kube._clock import Clock
from pyprovlib.kube._events import EventRecorder
from pyprovlib.kube._objects import Obj
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.kube._store import Indexer

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

"""The ProvisionController itself (upstream's ``NewProvisionController`` and ``Run``): the
informers on claims, PVs and StorageClasses, the two work queues their event handlers feed,
the workers, leader election, the volume store's background work and the optional metrics and
health endpoint. What a worker does with a key lives in ``claims`` and ``volumes``.

Invariant: event handlers only enqueue keys (claim UIDs, PV names); every decision is a
worker's, taken on the object the cache holds when the key is processed.
"""

from __future__ import annotations

import asyncio
import functools
import socket
from collections.abc import Callable, Coroutine
from typing import Any, Final

from kubernetes_asyncio.client import ApiClient

from pyprovlib._logging import get_logger
from pyprovlib._provisioner import Provisioner
from pyprovlib.controller._endpoint import EndpointServer, controller_checks
from pyprovlib.controller._lifecycle import EVENT_FLUSH_TIMEOUT, ControllerLifecycle
from pyprovlib.controller._metrics import ProvisionMetrics, default_metrics
from pyprovlib.controller._options import ProvisionControllerOptions
from pyprovlib.controller._provision.attempt import ProvisionAttempt
from pyprovlib.controller._provision.claims import ClaimSync
from pyprovlib.controller._provision.context import ProvisionContext
from pyprovlib.controller._provision.expectations import VolumeExpectations
from pyprovlib.controller._provision.node_deployment import NodeOwnership
from pyprovlib.controller._provision.protection import only_protection_changed
from pyprovlib.controller._provision.slowset import SlowSet
from pyprovlib.controller._provision.volumes import VolumeSync
from pyprovlib.controller._volume_store import (
    DEFAULT_STORE_THREADINESS,
    BackoffStore,
    QueueStore,
    VolumeStore,
)
from pyprovlib.kube._clock import Clock
from pyprovlib.kube._events import (
    CONTROLLER_HOLD_LIMIT,
    CONTROLLER_MAX_BUFFER,
    CONTROLLER_WRITERS,
    EventRecorder,
)
from pyprovlib.kube._informer import SharedInformer, SharedInformerFactory
from pyprovlib.kube._objects import Obj, name_of, uid_of
from pyprovlib.kube._resources import (
    PERSISTENT_VOLUME_CLAIMS,
    PERSISTENT_VOLUMES,
    STORAGE_CLASSES,
)
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.kube._store import DeletedFinalStateUnknown, deletion_handling_key
from pyprovlib.kube._workqueue import (
    BucketRateLimiter,
    ItemExponentialFailureRateLimiter,
    MaxOfRateLimiter,
    RateLimiter,
    RateLimitingQueue,
)

__all__ = ["EVENT_FLUSH_TIMEOUT", "STORE_DRAIN_TIMEOUT", "ProvisionController"]

log = get_logger("pyprovlib.controller._provision")

STORE_DRAIN_TIMEOUT: Final = 10.0
"""Seconds a graceful stop spends on a last attempt to save PVs the queue store holds."""


class ProvisionController(ControllerLifecycle):
    """Provisions PersistentVolumes for claims and deletes them when released, on behalf of
    ``provisioner`` for claims naming ``provisioner_name`` (upstream's ``ProvisionController``).

    ``client`` is a kubernetes-asyncio ``ApiClient``. Informers come from ``informer_factory``
    when given — the caller then starts it, as upstream does with custom informers — or from a
    factory the controller owns and starts. :meth:`run` runs everything until cancelled or
    :meth:`stop`; it can be called once.
    """

    def __init__(
        self,
        client: ApiClient,
        provisioner_name: str,
        provisioner: Provisioner,
        options: ProvisionControllerOptions | None = None,
        *,
        informer_factory: SharedInformerFactory | None = None,
        clock: Clock | None = None,
    ) -> None:
        if not provisioner_name:
            raise ValueError("provisioner_name must not be empty")
        self.provisioner_name = provisioner_name
        self.provisioner = provisioner
        self.options = options or ProvisionControllerOptions()
        super().__init__(
            client,
            self.options,
            role="provisioner",
            lease_name=provisioner_name.replace("/", "-"),
            log=log.bind(provisioner=provisioner_name),
            informer_factory=informer_factory,
            clock=clock,
        )
        self.metrics: ProvisionMetrics = self.options.metrics or default_metrics()
        host = socket.gethostname()
        self.component = f"{provisioner_name}_{self.id}"
        # Event writes yield to provisioning: they hold back while claims or volumes wait for
        # a worker (each worker's item wakes them, see _run_controller), and catch up after.
        # Room for the events held back on top of a burst's: see CONTROLLER_MAX_BUFFER.
        self.recorder = EventRecorder(
            client,
            self.component,
            host=host,
            clock=self._clock,
            busy=self._work_waiting,
            max_buffer=CONTROLLER_MAX_BUFFER,
            hold_limit=CONTROLLER_HOLD_LIMIT,
            writers=CONTROLLER_WRITERS,
        )

        limiter = self._queue_rate_limiter()
        self.claim_queue: RateLimitingQueue[str] = RateLimitingQueue(
            "claims", limiter, clock=self._clock
        )
        self.volume_queue: RateLimitingQueue[str] = RateLimitingQueue(
            "volumes", limiter, clock=self._clock
        )

        self._watch_claims_volumes_classes()
        self.volume_store: VolumeStore = self._volume_store(client, provisioner)
        context = ProvisionContext(
            provisioner_name=provisioner_name,
            provisioner=provisioner,
            options=self.options,
            names=frozenset((provisioner_name, *self.options.additional_provisioner_names)),
            recorder=self.recorder,
            metrics=self.metrics,
            claims_client=ResourceClient(client, PERSISTENT_VOLUME_CLAIMS),
            volumes_client=ResourceClient(client, PERSISTENT_VOLUMES),
            claims=self.claim_informer.store,
            volumes=self.volume_informer.store,
            classes=self.class_informer.store,
            clock=self._clock,
            log=self._log,
        )
        # What this process wrote about PVs that its caches may not show yet (both sides).
        expectations = VolumeExpectations()
        deployment = self.options.node_deployment
        self.node_ownership: NodeOwnership | None = (
            None if deployment is None else NodeOwnership(context, deployment, self.claim_queue)
        )
        """With ``options.node_deployment``: which claims and volumes are this node's."""
        self._claims = ClaimSync(
            context, self.claim_queue, expectations, self.volume_store, self.node_ownership
        )
        self._volumes = VolumeSync(context, self.volume_queue, expectations, self.node_ownership)
        self._beside: dict[str, Callable[[], Coroutine[Any, Any, None]]] = {}

    # -- construction --------------------------------------------------------------------------

    def _watch_claims_volumes_classes(self) -> None:
        """The informers on claims, PVs and StorageClasses, and the handlers that enqueue keys."""
        self.claim_informer: SharedInformer = self.informer_factory.informer_for(
            PERSISTENT_VOLUME_CLAIMS
        )
        self.claim_informer.add_event_handler(
            on_add=self._enqueue_claim,
            on_update=self._claim_updated,
            # A worker finds the claim gone and forgets what it remembered of it; a claim
            # being provisioned is in claims-in-progress, so it is still processed.
            on_delete=self._enqueue_deleted_claim,
        )
        self.volume_informer: SharedInformer = self.informer_factory.informer_for(
            PERSISTENT_VOLUMES
        )
        self.volume_informer.add_event_handler(
            on_add=self._enqueue_volume,
            on_update=lambda _old, new: self._enqueue_volume(new),
            on_delete=self._forget_volume,
        )
        self.class_informer: SharedInformer = self.informer_factory.informer_for(STORAGE_CLASSES)

    def _volume_store(self, client: ApiClient, provisioner: Provisioner) -> VolumeStore:
        """Where provisioned PVs are saved: in the background with a limiter, or with blocking
        retries."""
        if self.options.create_provisioned_pv_limiter is not None:
            self._log.debug("saving PVs to the API server in the background")
            return QueueStore(
                client,
                self.options.create_provisioned_pv_limiter,
                self.claim_informer.store,
                self.recorder,
                clock=self._clock,
            )
        self._log.debug("saving PVs to the API server with blocking retries")
        return BackoffStore(
            client, self.recorder, self.options.pv_backoff, provisioner, clock=self._clock
        )

    def _queue_rate_limiter(self) -> RateLimiter:
        if self.options.rate_limiter is not None:
            return self.options.rate_limiter
        max_delay = 1000.0 if self.options.exponential_backoff_on_error else 15.0
        return MaxOfRateLimiter(
            ItemExponentialFailureRateLimiter(15.0, max_delay),
            BucketRateLimiter(10.0, 100, clock=self._clock),
        )

    # -- lifecycle -----------------------------------------------------------------------------

    def run_beside(self, name: str, work: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run ``work()`` beside the control loops: started once the caches synced (with leader
        election, once this instance leads), cancelled when the workers stopped. For
        controllers that share this one's informers and Lease, as upstream's csi-provisioner
        runs its cloning-protection controller inside the leader's ``run``. ``name`` names the
        task. Register before :meth:`run`; an error of ``work`` ends :meth:`run` with it."""
        if self._has_run:
            raise RuntimeError(f"run_beside({name!r}) after run(): register it before running")
        if name in self._beside:
            raise ValueError(f"{name!r} already runs beside this controller")
        self._beside[name] = work

    @property
    def slow_set(self) -> SlowSet:
        """Claims held back after an infeasible error."""
        return self._claims.slow_set

    def stop(self) -> None:
        """Stop gracefully: no new work is taken, operations in flight finish, pending events
        are written, then :meth:`run` returns (and releases the lease)."""
        super().stop()

    def claims_in_progress(self) -> frozenset[str]:
        """UIDs of claims whose volume may still be being created in the background."""
        return frozenset(self._claims.in_progress)

    def _work_queues(self) -> tuple[RateLimitingQueue[str], ...]:
        return (self.claim_queue, self.volume_queue)

    def _work_waiting(self) -> bool:
        """Keys queued for a worker and not shut down: the event writers hold back meanwhile.
        Asked a few times per volume, so written out rather than looped."""
        claims, volumes = self.claim_queue, self.volume_queue
        return (len(claims) > 0 and not claims.shutting_down) or (
            len(volumes) > 0 and not volumes.shutting_down
        )

    def endpoint_server(self) -> EndpointServer:
        """The metrics and health server this controller serves when ``metrics_port`` is set
        (the one :mod:`pyprovlib.runtime` serves too): ``metrics_path``, ``/healthz``,
        ``/healthz/leader-election`` and ``/readyz`` on ``metrics_address:metrics_port``."""
        healthz, readyz = controller_checks(self)
        return EndpointServer(
            self.options.metrics_address,
            self.options.metrics_port,
            registry=self.metrics.registry,
            metrics_path=self.options.metrics_path,
            healthz=healthz,
            readyz=readyz,
        )

    async def run(self) -> None:
        """Run until cancelled or :meth:`stop`. With leader election, the control loops run only
        while this instance holds the lease; losing it raises
        :class:`~pyprovlib.LeaderElectionLostError` (upstream exits the
        process). With ``metrics_port`` set, the metrics and health endpoints are served from
        the start (an unusable address raises :class:`OSError`) until ``run`` returns."""
        with self._running():
            self._log.info("starting provisioner controller", component=self.component)
            server = self.endpoint_server() if self.options.metrics_port > 0 else None
            if server is not None:
                await server.start()
            try:
                await self._run_with_background()
            finally:
                if server is not None:
                    await server.stop()
        self._log.info("provisioner controller stopped", component=self.component)

    async def _run_with_background(self) -> None:
        async def graceful_tail() -> None:
            # PVs still queued get a last chance, events get written.
            await self.volume_store.drain(STORE_DRAIN_TIMEOUT)
            await self._flush_events(self.recorder)

        await self._run_elected_beside(
            {
                "events": self.recorder.run,
                "volume-store": functools.partial(self.volume_store.run, DEFAULT_STORE_THREADINESS),
            },
            graceful_tail,
        )

    async def _run_controller(self) -> None:
        """Informers, then workers, until stop (upstream's ``run`` closure)."""
        async with asyncio.TaskGroup() as tg:
            informers = tg.create_task(self._run_informers(), name="informers")
            async with self.claim_queue, self.volume_queue:
                caches = (self.claim_informer, self.volume_informer, self.class_informer)
                if await self._wait_for_sync(caches):
                    self._synced = True
                    count, waking = self.options.workers, self.recorder.waking
                    workers = [
                        *self._start_workers(
                            tg, count, self.claim_queue, waking(self._claims.process), drain=False
                        ),
                        *self._start_workers(
                            tg, count, self.volume_queue, waking(self._volumes.process), drain=False
                        ),
                    ]
                    beside = [
                        tg.create_task(work(), name=name) for name, work in self._beside.items()
                    ]
                    self._log.info("started provisioner controller", component=self.component)
                    await self._stop_requested.wait()
                    self._synced = False
                    self.claim_queue.shut_down()
                    self.volume_queue.shut_down()
                    # Workers finish the item in hand and take no other.
                    await asyncio.gather(*workers)
                    for task in beside:
                        task.cancel()
            informers.cancel()

    # -- event handlers: they only enqueue -----------------------------------------------------

    def _enqueue_claim(self, obj: Obj) -> None:
        uid = uid_of(obj)
        if uid:
            self.claim_queue.add(uid)

    def _claim_updated(self, old: Obj, new: Obj) -> None:
        if self.options.provisioning_finalizer and only_protection_changed(old, new):
            # Our own finalizer PATCH echoing back: the worker that wrote it already acted on
            # this claim's state (a sync costs more than this comparison).
            return
        self._enqueue_claim(new)

    def _enqueue_deleted_claim(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        last = obj.obj if isinstance(obj, DeletedFinalStateUnknown) else obj
        # A claim in progress is in the queue already and keeps its retry timing (upstream
        # does nothing here); any other is synced once more, to forget it.
        if uid_of(last) not in self._claims.in_progress:
            self._enqueue_claim(last)

    def _enqueue_volume(self, obj: Obj) -> None:
        name = name_of(obj)
        if name:
            self.volume_queue.add(name)

    def _forget_volume(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        try:
            key = deletion_handling_key(obj)
        except ValueError:
            return
        self.volume_queue.forget(key)
        # The worker finds the PV gone and settles the expectations about it.
        self.volume_queue.add(key)

    # -- one object at a time (what a worker does with a key; public for tests and tools) ------

    async def should_provision(self, claim: Obj) -> bool:
        """Whether ``claim`` should be provisioned now (upstream's ``shouldProvision``);
        raises :class:`~pyprovlib.controller._provision.ClassNotFoundError` when it is ours but
        its class is unknown."""
        return await self._claims.should_provision(claim)

    async def sync_claim(self, claim: Obj, deadline: float | None = None) -> None:
        """Provision ``claim`` if it should be; raises when the claim must be retried."""
        await self._claims.sync_claim(claim, deadline)

    async def provision_claim_operation(
        self, claim: Obj, deadline: float | None = None
    ) -> ProvisionAttempt:
        """One provisioning attempt (upstream's ``provisionClaimOperation``): its
        :class:`~pyprovlib.controller._provision.attempt.Outcome`, the state the backend is in
        and, when it failed, the error to retry on."""
        return await self._claims.provision_claim_operation(claim, deadline)

    async def sync_volume(self, volume: Obj, deadline: float | None = None) -> None:
        """Keep the finalizer right and delete the volume if it should be (``syncVolume``)."""
        await self._volumes.sync_volume(volume, deadline)

    async def should_delete(self, volume: Obj) -> bool:
        """Whether the volume's asset should be deleted now (``shouldDelete``)."""
        return await self._volumes.should_delete(volume)

    async def delete_volume_operation(self, volume: Obj, deadline: float | None = None) -> None:
        """Delete the asset, then the PV, then our finalizer (``deleteVolumeOperation``).
        Raises when it must be retried."""
        await self._volumes.delete_volume_operation(volume, deadline)

"""The lifecycle every controller of :mod:`pyprovlib.controller` shares: run once, stop on
request, report healthy/ready, run the control loops only while holding a leader election
Lease, run the informers it owns, wait for their caches, and drain work queues with workers.

:class:`ControllerLifecycle` is a base class: a controller calls its ``__init__`` with its
options and the Lease name, implements :meth:`~ControllerLifecycle._run_controller` (informers,
workers, until :attr:`~ControllerLifecycle._stop_requested`) and wraps the body of its
``run`` in :meth:`~ControllerLifecycle._running` (with
:meth:`~ControllerLifecycle._run_elected_beside` when background tasks, such as the event
recorder, run beside the control loops). :meth:`~ControllerLifecycle._run_workers_until_stop`
is the body of ``_run_controller`` for a controller whose workers drain queues of string keys
with :func:`process_with_retry`, and :meth:`~ControllerLifecycle._event_recorder` the event
recorder that yields to waiting work. It holds what was written three times before (in the
provision, attach, resize and modify controllers) and nothing specific to storage.

Private on purpose: subclasses use its underscored state (``_stop_requested``, ``_synced``), so
it is not yet a contract for users' own controllers. Should it become one, it would move to a
public ``pyprovlib.controller.base`` with those hooks renamed.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import uuid
from collections.abc import (
    Awaitable,
    Callable,
    Coroutine,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeVar

from kubernetes_asyncio.client import ApiClient

from pyprovlib._errors import PyprovlibError
from pyprovlib.controller._errors import DelayRetryError
from pyprovlib.controller._options import in_cluster_namespace
from pyprovlib.kube._clock import Clock, RealClock
from pyprovlib.kube._informer import (
    SharedInformer,
    SharedInformerFactory,
    strip_managed_fields,
)
from pyprovlib.kube._leaderelection import LeaderElectionConfig, LeaderElector
from pyprovlib.kube._workqueue import RateLimitingQueue, run_worker

if TYPE_CHECKING:
    from pyprovlib.kube._events import EventRecorder

__all__ = [
    "EVENT_FLUSH_TIMEOUT",
    "ControllerLifecycle",
    "LeaderElectionLostError",
    "LifecycleOptions",
    "process_with_retry",
]

EVENT_FLUSH_TIMEOUT: Final = 5.0
"""Seconds a graceful stop waits for pending events to be written."""

K = TypeVar("K")
"""The keys of a work queue (``str`` for most controllers)."""


class LeaderElectionLostError(PyprovlibError, RuntimeError):
    """The controller lost its leader election Lease (upstream exits the process)."""


class LifecycleOptions(Protocol):
    """The fields of a controller's options the lifecycle reads (every controller's options
    dataclass has them)."""

    @property
    def resync_period(self) -> float: ...
    @property
    def leader_election(self) -> bool: ...
    @property
    def leader_election_namespace(self) -> str | None: ...
    @property
    def lease_duration(self) -> float: ...
    @property
    def renew_deadline(self) -> float: ...
    @property
    def retry_period(self) -> float: ...


class ControllerLifecycle:
    """Run/stop/healthy/ready state, leader election, informers, sync wait and workers.

    ``role`` names the controller in its task names and in the lost-Lease message ("restart
    the attacher"). ``lease_name`` is the leader election Lease, in
    ``options.leader_election_namespace`` (default: the pod's namespace). Informers come from
    ``informer_factory`` when given (the caller starts it; its transform is the caller's
    choice) or from a factory the controller owns and runs in :meth:`_run_informers`, which
    caches objects without ``metadata.managedFields``
    (:func:`~pyprovlib.kube.strip_managed_fields`).
    """

    def __init__(
        self,
        client: ApiClient,
        options: LifecycleOptions,
        *,
        role: str,
        lease_name: str,
        log: Any,
        informer_factory: SharedInformerFactory | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.client = client
        self._clock: Clock = clock or RealClock()
        # A uniquifier, so two processes on one host never share a leader-election identity.
        self.id = f"{socket.gethostname()}_{uuid.uuid4()}"
        self._log = log
        self._role = role
        self._lease_name = lease_name
        self._lifecycle_options = options
        self._own_factory = informer_factory is None
        # Like kube-controller-manager: no controller reads managedFields, and they are much of
        # a cached object's memory. A factory passed in keeps its owner's choice.
        self.informer_factory = informer_factory or SharedInformerFactory(
            client,
            resync_period=options.resync_period,
            clock=self._clock,
            transform=strip_managed_fields,
        )
        self._has_run = False
        self._run_ended = False
        self._stop_requested = asyncio.Event()
        self._synced = False
        self._failed = False
        self._elector: LeaderElector | None = None

    async def _run_controller(self) -> None:
        """The control loops: informers, then workers, until :attr:`_stop_requested`
        (upstream's ``Run``). Set :attr:`_synced` while the workers run."""
        raise NotImplementedError

    # -- state ---------------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop gracefully: no new work is taken, operations in flight finish, then :meth:`run`
        returns (and releases the Lease)."""
        self._stop_requested.set()

    @property
    def stop_requested(self) -> bool:
        """True once :meth:`stop` was called (whoever called it)."""
        return self._stop_requested.is_set()

    def healthy(self) -> bool:
        """False once :meth:`run` failed (lost its Lease or crashed)."""
        return not self._failed

    def ready(self) -> bool:
        """True once the caches are synced and the workers run — and, with leader election,
        while this instance leads."""
        if not self._synced or self._stop_requested.is_set():
            return False
        if self._lifecycle_options.leader_election:
            return self._elector is not None and self._elector.is_leader()
        return True

    def _work_queues(self) -> Iterable[RateLimitingQueue[Any]]:
        """The controller's work queues (for :meth:`idle`)."""
        return ()

    def _work_waiting(self) -> bool:
        """Keys queued for a worker in a queue not shut down: the event writers of
        :meth:`_event_recorder` hold back meanwhile."""
        return any(len(queue) and not queue.shutting_down for queue in self._work_queues())

    def _event_recorder(self, component: str) -> EventRecorder:
        """The controller's event recorder for ``component``: its writes yield to the work
        while keys wait for a worker (:meth:`_work_waiting`), with the controllers' buffer and
        hold limits."""
        from pyprovlib.kube._events import (
            CONTROLLER_HOLD_LIMIT,
            CONTROLLER_MAX_BUFFER,
            CONTROLLER_WRITERS,
            EventRecorder,
        )

        return EventRecorder(
            self.client,
            component,
            host=socket.gethostname(),
            clock=self._clock,
            busy=self._work_waiting,
            max_buffer=CONTROLLER_MAX_BUFFER,
            hold_limit=CONTROLLER_HOLD_LIMIT,
            writers=CONTROLLER_WRITERS,
        )

    def idle(self, *, count_delayed: bool = False) -> bool:
        """Caches synced, and no key queued or being processed: whatever the controller would
        do about what its caches show, it has done. The deterministic point for asserting that
        something did *not* happen (with :meth:`caught_up`, so the caches show the write in
        question). Keys waiting out a retry delay count as work only with ``count_delayed``."""
        if not self._synced or self._stop_requested.is_set():
            return False
        return all(
            queue.idle() and not (count_delayed and queue.waiting())
            for queue in self._work_queues()
        )

    def draining(self) -> bool:
        """True while a graceful stop waits for the operations in flight: :meth:`stop` was
        called, :meth:`run` has shut its work queues down (no new work is taken) and has not
        returned, and some key is still queued or being processed. The deterministic point
        for asserting that ``run`` waits for the work in hand (``run`` still running once
        this holds); False again when the last operation ended or ``run`` returned."""
        if not self._has_run or self._run_ended or not self._stop_requested.is_set():
            return False
        queues = list(self._work_queues())
        return (
            bool(queues)
            and all(queue.shutting_down for queue in queues)
            and not all(queue.idle() for queue in queues)
        )

    @property
    def lease_attempts(self) -> int:
        """How many times this instance has tried to acquire or renew its leader election
        Lease (finished tries, successful or not); 0 without leader election. A follower's
        count going up while another instance leads is the point after which "it did not take
        over" holds."""
        return 0 if self._elector is None else self._elector.attempts

    def caught_up(self, obj: Mapping[str, Any]) -> bool:
        """Whether the controller's caches hold this version of ``obj`` (as a write returned
        it) or a later one, so its event handlers have queued whatever it causes."""
        return self.informer_factory.caught_up(obj)

    @contextlib.contextmanager
    def _running(self) -> Iterator[None]:
        """Wrap the body of ``run``: refuse a second run, mark the controller failed when the
        body ends with an error (or is cancelled) without a stop request, and not synced once
        it ended."""
        if self._has_run:
            name = type(self).__name__
            article = "an" if name[:1] in "AEIOU" else "a"
            raise RuntimeError(f"{article} {name} can run only once; create a new one")
        self._has_run = True
        try:
            yield
        except BaseException:
            if not self._stop_requested.is_set():
                self._failed = True
            raise
        finally:
            self._synced = False
            self._run_ended = True

    async def _run_elected(self) -> None:
        """:meth:`_run_controller`, under leader election when the options ask for it."""
        if self._lifecycle_options.leader_election:
            await self._run_with_leader_election()
        else:
            await self._run_controller()

    async def _run_elected_beside(
        self,
        background: Mapping[str, Callable[[], Coroutine[Any, Any, object]]],
        graceful_tail: Callable[[], Awaitable[None]],
    ) -> None:
        """:meth:`_run_elected` with the ``background`` tasks (by task name) running beside it
        and cancelled once it ended. After a graceful end ``graceful_tail`` runs first (while
        the background still runs: writing the events that are left, say). An error of the
        control loops is re-raised as is, not wrapped in an ExceptionGroup."""
        failure: Exception | None = None
        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(run(), name=name) for name, run in background.items()]
            try:
                await self._run_elected()
            except Exception as err:
                failure = err
            else:
                await graceful_tail()
            for task in tasks:
                task.cancel()
        if failure is not None:
            raise failure

    async def _flush_events(self, recorder: EventRecorder) -> None:
        """Write the events ``recorder`` still holds, for up to :data:`EVENT_FLUSH_TIMEOUT`."""
        if not await recorder.flush(EVENT_FLUSH_TIMEOUT):
            self._log.warning("not every event could be written before stopping")

    async def _run_elected_with_events(self, recorder: EventRecorder) -> None:
        """:meth:`_run_elected` with ``recorder`` writing events beside the control loops; the
        events still held are written after a graceful end."""
        await self._run_elected_beside(
            {f"{self._role}-events": recorder.run},
            graceful_tail=lambda: self._flush_events(recorder),
        )

    # -- leader election -----------------------------------------------------------------------

    async def _run_with_leader_election(self) -> None:
        """Contend for the Lease and run :meth:`_run_controller` while leading, until stopped;
        losing the Lease raises :class:`LeaderElectionLostError`."""
        options = self._lifecycle_options
        namespace = options.leader_election_namespace or in_cluster_namespace()
        config = LeaderElectionConfig(
            lease_name=self._lease_name,
            namespace=namespace,
            identity=self.id,
            lease_duration=options.lease_duration,
            renew_deadline=options.renew_deadline,
            retry_period=options.retry_period,
        )
        elector = LeaderElector(
            self.client,
            config,
            on_started_leading=self._run_controller,
            on_new_leader=lambda leader: self._log.info("new leader elected", leader=leader),
            clock=self._clock,
        )
        self._elector = elector
        elector_task = asyncio.create_task(elector.run(), name=f"{self._role}-leader-election")
        stop_task = asyncio.create_task(self._stop_requested.wait(), name=f"{self._role}-stop")
        try:
            await asyncio.wait({elector_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
            if not elector_task.done() and not elector.is_leader():
                elector_task.cancel()  # not leading: nothing in flight
            # While leading, the control loops see the stop request and return by themselves.
            await asyncio.wait({elector_task})
        finally:
            for task in (elector_task, stop_task):
                task.cancel()
            await asyncio.gather(elector_task, stop_task, return_exceptions=True)
        if elector_task.cancelled():
            if self._stop_requested.is_set():
                return
            raise asyncio.CancelledError
        err = elector_task.exception()
        if err is not None:
            raise err
        if not self._stop_requested.is_set():
            lease = f"{namespace}/{config.lease_name}"
            self._log.error("leader election lost", lease=lease)
            raise LeaderElectionLostError(
                f"lost the leader Lease {lease}; restart the {self._role}"
            )

    def standing_by(self) -> bool:
        """True while this instance is a healthy standby: leader election is on, it contends
        for the Lease and has seen another instance hold it. The runtime's ``/readyz`` counts
        a standby as ready (leadership is not readiness), so rolling updates can complete."""
        elector = self._elector
        if elector is None or self._stop_requested.is_set() or self._failed:
            return False
        holder = elector.leader
        return not elector.is_leader() and holder is not None and holder != elector.identity

    def leader_election_check(self, timeout: float) -> str | None:
        """client-go's leader-election health check (``HealthzAdaptor``): ``None`` (healthy)
        unless this instance leads and its last renewal of the Lease is older than the lease
        duration plus ``timeout``; then the reason. A standby, or no leader election, is
        healthy."""
        elector = self._elector
        if elector is None or not elector.is_leader():
            return None
        from pyprovlib.controller._leader_health import leader_renewal_overdue

        record = elector.observed_record
        return leader_renewal_overdue(
            record.renew_time,
            self._clock.now(),
            elector.config.lease_duration + timeout,
            f"{elector.config.namespace}/{elector.config.lease_name}",
        )

    # -- informers and workers -----------------------------------------------------------------

    async def _run_informers(self) -> None:
        """Run the informer factory the controller owns, until cancelled with the controller
        (a factory given by the caller is the caller's to start)."""
        if not self._own_factory:
            return
        async with asyncio.TaskGroup() as tg:
            self.informer_factory.start(tg)
            await asyncio.Event().wait()  # until cancelled with the controller

    async def _wait_for_sync(self, informers: Iterable[SharedInformer]) -> bool:
        """Wait until every one of ``informers`` synced; False when a stop came first."""

        async def all_synced() -> None:
            for informer in informers:
                await informer.wait_for_sync()

        return await self._until_stopped(all_synced())

    async def _until_stopped(self, work: Awaitable[None]) -> bool:
        """Run ``work`` until it finishes or a stop is requested, whichever comes first (the
        other is cancelled); True when ``work`` finished and no stop came."""
        task = asyncio.ensure_future(work)
        stop = asyncio.create_task(self._stop_requested.wait())
        try:
            await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (task, stop):
                t.cancel()
            await asyncio.gather(task, stop, return_exceptions=True)
        return task.done() and not task.cancelled() and not self._stop_requested.is_set()

    async def _run_workers_until_stop(
        self,
        caches: Iterable[SharedInformer],
        work: Sequence[tuple[RateLimitingQueue[str], Callable[[str], Awaitable[None]]]],
        *,
        workers: int,
        started: str,
        on_synced: Callable[[], None] | None = None,
        beside: Mapping[str, Callable[[], Coroutine[Any, Any, object]]] | None = None,
    ) -> None:
        """A ``_run_controller`` body (upstream's ``Run``): the informers, and once ``caches``
        synced (and ``on_synced`` ran) ``workers`` workers on each queue of ``work`` with its
        process function, and the ``beside`` tasks (by task name), until stop; then
        the tasks beside are cancelled, the queues shut down, and the workers finish the key
        in hand and take no other."""
        async with asyncio.TaskGroup() as tg, contextlib.AsyncExitStack() as queues:
            informers = tg.create_task(self._run_informers(), name=f"{self._role}-informers")
            for queue, _ in work:
                await queues.enter_async_context(queue)
            if await self._wait_for_sync(caches):
                if on_synced is not None:
                    on_synced()
                self._synced = True
                tasks = [
                    task
                    for queue, process in work
                    for task in self._start_workers(tg, workers, queue, process)
                ]
                extra = [tg.create_task(run(), name=name) for name, run in (beside or {}).items()]
                self._log.info(started, workers=workers)
                await self._stop_requested.wait()
                self._synced = False
                for task in extra:
                    task.cancel()
                for queue, _ in work:
                    queue.shut_down()
                await asyncio.gather(*tasks)
            await queues.aclose()
            informers.cancel()

    def _start_workers(
        self,
        tg: asyncio.TaskGroup,
        count: int,
        queue: RateLimitingQueue[K],
        process: Callable[[K], Awaitable[None]],
        *,
        drain: bool = True,
    ) -> list[asyncio.Task[None]]:
        """Start ``count`` :meth:`_worker` tasks of ``queue`` in ``tg`` (upstream's
        ``for i := 0; i < threadiness; i++ { go wait.Until(worker, ...) }``)."""
        return [tg.create_task(self._worker(queue, process, drain=drain)) for _ in range(count)]

    async def _worker(
        self,
        queue: RateLimitingQueue[K],
        process: Callable[[K], Awaitable[None]],
        *,
        drain: bool = True,
    ) -> None:
        """Take keys from ``queue`` and ``process`` them until the queue is shut down. With
        ``drain`` the worker also takes what is still queued after a stop request (the queue
        hands it out until empty); without, it takes nothing once a stop was requested."""
        await run_worker(queue, process, stop=None if drain else self._stop_requested)


async def process_with_retry(
    queue: RateLimitingQueue[K],
    key: K,
    sync: Callable[[K], Awaitable[None]],
    *,
    log: Any,
    failure: str,
    describe: Callable[[BaseException], str] = str,
    **context: Any,
) -> None:
    """One key of a worker: ``sync(key)``, then forget the key's failures when it succeeded;
    put it back after the delay of a :class:`DelayRetryError`; after any other error, log
    ``failure`` (at info, the error told by ``describe``, with ``context``) and put it back
    with the queue's backoff (upstream's ``processNextWorkItem``)."""
    try:
        await sync(key)
    except DelayRetryError as err:
        log.debug(str(err), delay=err.delay, **context)
        queue.add_after(key, err.delay)
    except Exception as err:
        log.info(failure, error=describe(err), **context)
        queue.add_rate_limited(key)
    else:
        queue.forget(key)

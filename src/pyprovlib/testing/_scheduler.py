"""A pod scheduler for the standalone in-memory API server: kube-scheduler's volume binding, so
``WaitForFirstConsumer`` claims get a node when a pod using them is created, as in a real cluster.

It follows the VolumeBinding plugin of ``pkg/scheduler/framework/plugins/volumebinding``: for a
pending pod it filters nodes (Ready, schedulable, untainted, matching the pod's ``nodeSelector``,
the node affinity of the PVs its bound claims use, the ``allowedTopologies`` of the classes of its
unbound ``WaitForFirstConsumer`` claims and any node already selected for them), picks one, and
sets ``volume.kubernetes.io/selected-node`` on those claims so their provisioner can start. A
pod with an unbound claim of an ``Immediate`` class waits for the PV controller to bind it.
For a driver whose CSIDriver says ``storageCapacity: true`` a node also needs a
CSIStorageCapacity object of the claim's class whose ``nodeTopology`` matches it and whose
``maximumVolumeSize`` (else ``capacity``) holds the claim's request (``hasEnoughCapacity``).

Deliberately left out: binding pods to nodes (nothing would run them), CPU/memory fit, pod
affinity and spreading, tolerations, and binding ``WaitForFirstConsumer`` claims to existing
PVs (classes with the ``kubernetes.io/no-provisioner`` provisioner): such pods stay pending and
the scheduler says why in its log.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException

from pyprovlib._logging import get_logger
from pyprovlib.kube._errors import is_conflict, is_not_found
from pyprovlib.kube._informer import SharedInformer, SharedInformerFactory
from pyprovlib.kube._objects import (
    Obj,
    annotations_of,
    as_mapping,
    labels_of,
    name_of,
    namespace_of,
)
from pyprovlib.kube._quantity import quantity_or_none
from pyprovlib.kube._resources import (
    CSI_STORAGE_CAPACITIES,
    CSIDRIVERS,
    NODES,
    PERSISTENT_VOLUME_CLAIMS,
    PERSISTENT_VOLUMES,
    PODS,
    STORAGE_CLASSES,
)
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.testing._binder import ANN_SELECTED_NODE, claim_class
from pyprovlib.testing._labels import selector_matches
from pyprovlib.testing._lifecycle import StartStop

__all__ = [
    "DEFAULT_SCHEDULER_NAME",
    "NO_PROVISIONER",
    "PodScheduler",
    "node_matches_terms",
    "node_schedulable",
]

log = get_logger(__name__)

DEFAULT_SCHEDULER_NAME = "default-scheduler"
"""The ``spec.schedulerName`` of pods this scheduler places (also pods that name none)."""
NO_PROVISIONER = "kubernetes.io/no-provisioner"
"""The provisioner of classes whose claims bind only to existing (local) PVs."""

_WAIT_FOR_FIRST_CONSUMER = "WaitForFirstConsumer"


def _list(value: Any) -> Sequence[Any]:
    return value if isinstance(value, list) else []


def _requirement_matches(req: Mapping[str, Any], values_of: Mapping[str, str]) -> bool:
    """One NodeSelectorRequirement (In, NotIn, Exists, DoesNotExist, Gt, Lt) against a node's
    labels (or fields)."""
    key = str(req.get("key") or "")
    op = req.get("operator")
    wanted = [str(v) for v in _list(req.get("values"))]
    present = key in values_of
    value = values_of.get(key, "")
    if op == "In":
        return present and value in wanted
    if op == "NotIn":
        return not present or value not in wanted
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt") and present and len(wanted) == 1:
        try:
            have, bound = int(value), int(wanted[0])
        except ValueError:
            return False
        return have > bound if op == "Gt" else have < bound
    return False


def node_matches_terms(node: Mapping[str, Any], terms: Sequence[Any]) -> bool:
    """Whether ``node`` satisfies a NodeSelector's ``nodeSelectorTerms`` (ORed terms, each the
    AND of its ``matchExpressions`` on labels and ``matchFields`` on ``metadata.name``).
    No terms: every node matches; a term with no requirements matches none, as upstream."""
    if not terms:
        return True
    labels = labels_of(node)
    fields = {"metadata.name": name_of(node)}
    for raw in terms:
        term = as_mapping(raw)
        exprs = _list(term.get("matchExpressions"))
        field_exprs = _list(term.get("matchFields"))
        if not exprs and not field_exprs:
            continue
        if all(_requirement_matches(as_mapping(r), labels) for r in exprs) and all(
            _requirement_matches(as_mapping(r), fields) for r in field_exprs
        ):
            return True
    return False


def _node_in_topologies(node: Mapping[str, Any], topologies: Sequence[Any]) -> bool:
    """A class's ``allowedTopologies``: ORed terms of ANDed ``matchLabelExpressions``."""
    if not topologies:
        return True
    labels = labels_of(node)
    for term in topologies:
        exprs = _list(as_mapping(term).get("matchLabelExpressions"))
        if all(
            str(as_mapping(e).get("key") or "") in labels
            and labels[str(as_mapping(e).get("key"))]
            in [str(v) for v in _list(as_mapping(e).get("values"))]
            for e in exprs
        ):
            return True
    return False


def node_schedulable(node: Mapping[str, Any]) -> bool:
    """Ready, not cordoned, not being deleted, no NoSchedule/NoExecute taint (the scheduler
    would need a toleration; the node lifecycle controller taints nodes that are not Ready)."""
    if as_mapping(node.get("metadata")).get("deletionTimestamp"):
        return False
    spec = as_mapping(node.get("spec"))
    if spec.get("unschedulable"):
        return False
    if any(
        as_mapping(t).get("effect") in ("NoSchedule", "NoExecute")
        for t in _list(spec.get("taints"))
    ):
        return False
    for raw in _list(as_mapping(node.get("status")).get("conditions")):
        condition = as_mapping(raw)
        if condition.get("type") == "Ready":
            return condition.get("status") == "True"
    return False


class PodScheduler(StartStop):
    """Places pending pods' ``WaitForFirstConsumer`` claims on nodes, as kube-scheduler does.

    ``PodScheduler(api_client, *, scheduler_name="default-scheduler", resync_period=1.0)``;
    ``await start()`` / ``await stop()`` or ``async with``. Every ``resync_period`` seconds, and
    whenever a pod, claim, PV, node or class changes, it looks at every pending pod again, so a
    claim whose provisioner removed ``selected-node`` (a reschedule) gets a node again.
    """

    def __init__(
        self,
        api_client: ApiClient,
        *,
        scheduler_name: str = DEFAULT_SCHEDULER_NAME,
        resync_period: float = 1.0,
    ) -> None:
        self.api_client = api_client
        self.scheduler_name = scheduler_name
        self.resync_period = resync_period
        self._factory = SharedInformerFactory(api_client)
        self._pods = self._informer(PODS)
        self._claims = self._informer(PERSISTENT_VOLUME_CLAIMS)
        self._volumes = self._informer(PERSISTENT_VOLUMES)
        self._nodes = self._informer(NODES)
        self._classes = self._informer(STORAGE_CLASSES)
        self._drivers = self._informer(CSIDRIVERS)
        self._capacities = self._informer(CSI_STORAGE_CAPACITIES)
        self._claim_client = ResourceClient(api_client, PERSISTENT_VOLUME_CLAIMS)
        self._dirty = asyncio.Event()
        self._passes = 0
        self._in_pass = False
        self._task: asyncio.Task[None] | None = None
        # Why each pod waits, so the log says it once per change rather than every pass.
        self._reported: dict[str, str] = {}

    def _informer(self, resource: Any) -> SharedInformer:
        informer = self._factory.informer_for(resource)
        informer.add_event_handler(
            on_add=lambda _obj: self._dirty.set(),
            on_update=lambda _old, _new: self._dirty.set(),
            on_delete=lambda _obj: self._dirty.set(),
        )
        return informer

    async def start(self) -> None:
        """Start watching and scheduling; returns once the caches are synced."""
        if self._task is not None:
            raise RuntimeError("PodScheduler is already started")
        self._task = asyncio.create_task(self._run(), name="pod scheduler")
        synced = asyncio.create_task(self._factory.wait_for_cache_sync())
        done, _ = await asyncio.wait({self._task, synced}, return_when=asyncio.FIRST_COMPLETED)
        if self._task in done:
            synced.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await synced
            await self._task  # raises why it ended

    async def stop(self) -> None:
        """Stop and wait for the scheduler's tasks to end."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    def idle(self, *, count_delayed: bool = False) -> bool:
        """Running, caches synced, and a pass over the pending pods has run since the last
        change its caches showed and is not running now: whatever it would do about what its
        caches show, it has done (so :func:`~pyprovlib.testing.wait_idle` works on it).
        ``count_delayed`` is accepted for that protocol; nothing waits to be retried here."""
        del count_delayed
        return (
            self._task is not None
            and self._passes > 0
            and not self._in_pass
            and not self._dirty.is_set()
        )

    def caught_up(self, obj: Mapping[str, Any]) -> bool:
        """Whether the scheduler's caches hold this version of ``obj`` or a later one."""
        return self._factory.caught_up(obj)

    async def _run(self) -> None:
        async with asyncio.TaskGroup() as group:
            self._factory.start(group)
            await self._factory.wait_for_cache_sync()
            log.info("pod scheduler running", scheduler=self.scheduler_name)
            while True:
                self._dirty.clear()
                self._in_pass = True
                try:
                    await self.schedule_pending()
                finally:
                    self._in_pass = False
                    self._passes += 1
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.resync_period):
                        await self._dirty.wait()

    async def schedule_pending(self) -> None:
        """One pass over every pending pod of this scheduler."""
        seen: set[str] = set()
        for pod in self._pods.store.list():
            if not self._is_pending(pod):
                continue
            key = f"{namespace_of(pod)}/{name_of(pod)}"
            seen.add(key)
            try:
                reason = await self._schedule(pod)
            except ApiException as err:
                if not (is_conflict(err) or is_not_found(err)):
                    log.warning("scheduling failed; retrying", pod=key, status=err.status)
                continue
            if reason and self._reported.get(key) != reason:
                log.info("pod not schedulable yet", pod=key, reason=reason)
            if reason:
                self._reported[key] = reason
            else:
                self._reported.pop(key, None)
        for key in [k for k in self._reported if k not in seen]:
            del self._reported[key]

    def _has_enough_capacity(self, claim: Obj, storage_class: Obj, node: Obj) -> bool:
        """kube-scheduler's ``hasEnoughCapacity``: only for a CSIDriver with
        ``storageCapacity: true``; then some CSIStorageCapacity of the class, its topology
        matching the node, must hold the request (``maximumVolumeSize`` when set, it is more
        precise, else ``capacity``)."""
        requests = as_mapping(
            as_mapping(as_mapping(claim.get("spec")).get("resources")).get("requests")
        )
        wanted = quantity_or_none(requests.get("storage"))
        if wanted is None:
            return True  # no capacity to check for
        driver = self._drivers.store.get_by_key(str(storage_class.get("provisioner") or ""))
        if driver is None or as_mapping(driver.get("spec")).get("storageCapacity") is not True:
            return True
        size = wanted.value()
        for capacity in self._capacities.store.list():
            if capacity.get("storageClassName") != name_of(storage_class):
                continue
            limit = quantity_or_none(
                capacity.get("maximumVolumeSize")
                if capacity.get("maximumVolumeSize") is not None
                else capacity.get("capacity")
            )
            topology = capacity.get("nodeTopology")
            if (
                limit is not None
                and limit.value() >= size
                and isinstance(topology, Mapping)
                and selector_matches(topology, labels_of(node))
            ):
                return True
        return False

    def _is_pending(self, pod: Obj) -> bool:
        spec = as_mapping(pod.get("spec"))
        if spec.get("nodeName") or as_mapping(pod.get("metadata")).get("deletionTimestamp"):
            return False
        if (spec.get("schedulerName") or DEFAULT_SCHEDULER_NAME) != self.scheduler_name:
            return False
        return as_mapping(pod.get("status")).get("phase") not in ("Succeeded", "Failed")

    async def _schedule(self, pod: Obj) -> str:
        """Select a node for the pod's unbound WaitForFirstConsumer claims; returns why the
        pod cannot be placed yet ("" when there is nothing left to do for its volumes)."""
        namespace = namespace_of(pod)
        spec = as_mapping(pod.get("spec"))
        node_selector = {str(k): str(v) for k, v in as_mapping(spec.get("nodeSelector")).items()}
        nodes = sorted(
            (
                n
                for n in self._nodes.store.list()
                if node_schedulable(n)
                and all(labels_of(n).get(k) == v for k, v in node_selector.items())
            ),
            key=name_of,
        )
        to_select: list[Obj] = []
        for volume in _list(spec.get("volumes")):
            source = as_mapping(as_mapping(volume).get("persistentVolumeClaim"))
            claim_name = str(source.get("claimName") or "")
            if not claim_name:
                continue
            claim = self._claims.store.get_by_key(f"{namespace}/{claim_name}")
            if claim is None:
                return f'persistentvolumeclaim "{claim_name}" not found'
            if as_mapping(claim.get("metadata")).get("deletionTimestamp"):
                return f'persistentvolumeclaim "{claim_name}" is being deleted'
            volume_name = as_mapping(claim.get("spec")).get("volumeName")
            if volume_name:
                pv = self._volumes.store.get_by_key(str(volume_name))
                if pv is None:
                    return f'persistentvolume "{volume_name}" not found'
                terms = _list(
                    as_mapping(
                        as_mapping(as_mapping(pv.get("spec")).get("nodeAffinity")).get("required")
                    ).get("nodeSelectorTerms")
                )
                nodes = [n for n in nodes if node_matches_terms(n, terms)]
                continue
            sc = self._classes.store.get_by_key(claim_class(claim))
            if sc is None or sc.get("volumeBindingMode") != _WAIT_FOR_FIRST_CONSUMER:
                return f'pod has unbound immediate persistentvolumeclaim "{claim_name}"'
            if sc.get("provisioner") == NO_PROVISIONER:
                return (
                    f'persistentvolumeclaim "{claim_name}" needs an existing PV; binding '
                    "WaitForFirstConsumer claims to existing PVs is not implemented"
                )
            selected = annotations_of(claim).get(ANN_SELECTED_NODE)
            if selected:
                nodes = [n for n in nodes if name_of(n) == selected]
                continue
            topologies = _list(sc.get("allowedTopologies"))
            nodes = [n for n in nodes if _node_in_topologies(n, topologies)]
            fitting = [n for n in nodes if self._has_enough_capacity(claim, sc, n)]
            if nodes and not fitting:
                return f"{len(nodes)} node(s) did not have enough free storage"
            nodes = fitting
            to_select.append(claim)
        if not nodes:
            return "no node fits the pod's volumes and node selector"
        node = name_of(nodes[0])
        for claim in to_select:
            await self._claim_client.patch(
                name_of(claim),
                {
                    "metadata": {
                        "annotations": {ANN_SELECTED_NODE: node},
                        "resourceVersion": as_mapping(claim.get("metadata")).get("resourceVersion"),
                    }
                },
                namespace=namespace,
            )
            log.info(
                "selected a node for a claim",
                pod=f"{namespace}/{name_of(pod)}",
                claim=f"{namespace}/{name_of(claim)}",
                node=node,
            )
        return ""

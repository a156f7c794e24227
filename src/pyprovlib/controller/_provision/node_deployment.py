"""Distributed provisioning (external-provisioner's ``--node-deployment``, its ``checkNode``,
``becomeOwner`` and the node check of ``Delete``): which claims and volumes are this node's,
and the race for claims with Immediate binding.

Invariants:

- A claim is provisioned only by the instance of the node its ``volume.kubernetes.io/
  selected-node`` annotation names; the annotation is set by the scheduler
  (WaitForFirstConsumer) or, for Immediate binding, by the one instance whose update with the
  claim's resourceVersion went through — a lost race is a 409, never a second owner.
- Waiting for the race never holds a worker: the claim is put back in the claim queue for the
  delay (upstream sleeps in the worker), and an update showing another owner ends the wait.
- A volume is deleted only by an instance whose topology segment its node affinity matches.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping, Sequence
from typing import Any

from pyprovlib._errors import PyprovlibError
from pyprovlib.controller._options import NodeDeployment
from pyprovlib.controller._provision.context import ProvisionContext
from pyprovlib.controller._provision.decisions import (
    ANN_SELECTED_NODE,
    WAIT_FOR_FIRST_CONSUMER,
    claim_key,
)
from pyprovlib.kube._errors import ApiException, is_conflict, is_not_found
from pyprovlib.kube._objects import Obj, annotations_of, meta, spec_of, uid_of
from pyprovlib.kube._resources import NODES
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.kube._workqueue import ItemExponentialFailureRateLimiter, RateLimitingQueue

__all__ = [
    "JitteredExponentialRateLimiter",
    "NodeNotFoundError",
    "NodeOwnership",
    "allowed_topologies_match",
    "volume_is_accessible",
]


class NodeNotFoundError(PyprovlibError):
    """The Node a node deployment runs for does not exist (yet): its labels are the topology."""


class JitteredExponentialRateLimiter:
    """Per-item exponential delays (``base * 2**failures`` up to ``max``) minus a random share
    of ``base`` (upstream's ``newItemExponentialFailureRateLimiterWithJitter``): the first
    delay lies in ``[0, base]``, so instances watching the same claim spread out."""

    def __init__(
        self, base_delay: float, max_delay: float, rng: random.Random | None = None
    ) -> None:
        self._exponential = ItemExponentialFailureRateLimiter(base_delay, max_delay)
        self._base = base_delay
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not cryptography

    def when(self, item: str) -> float:
        """The next delay for ``item`` (and one more failure counted)."""
        delay = self._exponential.when(item)
        return max(0.0, delay - self._base * self._rng.random())

    def forget(self, item: str) -> None:
        """Start ``item``'s delays from scratch."""
        self._exponential.forget(item)

    def num_requeues(self, item: str) -> int:
        """Delays handed out for ``item`` since it was last forgotten."""
        return self._exponential.num_requeues(item)


def _requirement_matches(requirement: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key = requirement.get("key", "")
    operator = requirement.get("operator", "")
    values = [str(v) for v in requirement.get("values") or []]
    if operator == "In":
        return key in labels and labels[key] in values
    if operator == "NotIn":
        return key not in labels or labels[key] not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    if operator in ("Gt", "Lt") and key in labels and len(values) == 1:
        try:
            have, bound = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return have > bound if operator == "Gt" else have < bound
    return False


def volume_is_accessible(volume: Mapping[str, Any], segment: Mapping[str, str]) -> bool:
    """Whether a PV can be reached from a node with topology ``segment`` (upstream's
    ``VolumeIsAccessible``): no required node affinity, or one of its terms matches."""
    affinity = spec_of(volume).get("nodeAffinity") or {}
    required = affinity.get("required") if isinstance(affinity, Mapping) else None
    if not required:
        return True
    terms: Sequence[Mapping[str, Any]] = required.get("nodeSelectorTerms") or []
    return any(
        all(_requirement_matches(r, segment) for r in term.get("matchExpressions") or [])
        for term in terms
    )


def allowed_topologies_match(storage_class: Mapping[str, Any], segment: Mapping[str, str]) -> bool:
    """Whether a class's ``allowedTopologies`` admit a node with topology ``segment``: none are
    set, or every label expression of one term holds a value of the segment."""
    terms: Sequence[Mapping[str, Any]] = storage_class.get("allowedTopologies") or []
    if not terms:
        return True
    return any(
        all(
            segment.get(e.get("key", "")) in (e.get("values") or [])
            for e in term.get("matchLabelExpressions") or []
        )
        for term in terms
    )


class NodeOwnership:
    """The node-deployment side of ``should_provision`` and ``should_delete`` for one
    controller: decides from the cached claim whether it is this node's, and runs this node's
    side of the race for Immediate claims through the claim queue."""

    def __init__(
        self,
        ctx: ProvisionContext,
        deployment: NodeDeployment,
        queue: RateLimitingQueue[str],
        *,
        rng: random.Random | None = None,
    ) -> None:
        self._ctx = ctx
        self.deployment = deployment
        self.node_name = deployment.node_name
        self._queue = queue
        self._limiter = JitteredExponentialRateLimiter(
            deployment.base_delay, deployment.max_delay, rng
        )
        # Claim UID -> clock time before which this instance does not try to own the claim.
        self._not_before: dict[str, float] = {}
        self._segment: Mapping[str, str] | None = deployment.topology
        self._segment_lock = asyncio.Lock()  # the workers read the Node once between them
        self._nodes = ResourceClient(ctx.claims_client.api_client, NODES)
        self._log = ctx.log.bind(node=self.node_name)

    async def segment(self) -> Mapping[str, str]:
        """This node's topology: :attr:`NodeDeployment.topology`, else its Node's labels (read
        once; a missing Node raises :class:`NodeNotFoundError`, and the work is retried)."""
        if self._segment is not None:
            return self._segment
        async with self._segment_lock:
            if self._segment is None:
                try:
                    node = await self._nodes.get(self.node_name)
                except ApiException as err:
                    if is_not_found(err):
                        raise NodeNotFoundError(
                            f"node {self.node_name!r} of this node deployment does not exist: "
                            "set NODE_NAME from the pod's spec.nodeName"
                        ) from None
                    raise
                self._segment = dict(meta(node).get("labels") or {})
                self._log.info("node topology", labels=self._segment)
            return self._segment

    def waiting(self) -> frozenset[str]:
        """UIDs of Immediate claims this instance waits to try to own."""
        return frozenset(self._not_before)

    def forget(self, uid: str) -> None:
        """The claim is gone or owned: its delays start from scratch if it comes back."""
        self._not_before.pop(uid, None)
        self._limiter.forget(uid)

    async def may_delete(self, volume: Mapping[str, Any]) -> bool:
        """Whether this node can reach the volume, so deleting it is this instance's job."""
        return volume_is_accessible(volume, await self.segment())

    async def owns(self, claim: Obj, storage_class: Mapping[str, Any]) -> bool:
        """Whether ``claim`` (one this controller would provision) is this node's to provision
        now (upstream's ``checkNode``). A claim without a selected node of an Immediate class is
        competed for: False now, and the claim comes back through the queue."""
        uid = uid_of(claim)
        selected = annotations_of(claim).get(ANN_SELECTED_NODE)
        if selected:
            self.forget(uid)
            return selected == self.node_name
        if not self.deployment.immediate_binding:
            return False
        # The API server defaults volumeBindingMode to Immediate.
        if storage_class.get("volumeBindingMode") == WAIT_FOR_FIRST_CONSUMER:
            return False
        if not allowed_topologies_match(storage_class, await self.segment()):
            self._log.debug(
                "not competing for claim: allowedTopologies exclude this node",
                claim=claim_key(claim),
            )
            return False
        now = self._ctx.clock.monotonic()
        due = self._not_before.get(uid)
        if due is None:
            self._wait(uid, claim, now)
            return False
        if now < due:
            return False  # the queue brings the claim back when the wait is over
        del self._not_before[uid]
        await self._become_owner(claim, storage_class, now)
        # Owner or not, the claim's next update says who is (upstream waits for it too).
        return False

    def _wait(self, uid: str, claim: Obj, now: float) -> None:
        delay = self._limiter.when(uid)
        self._not_before[uid] = now + delay
        self._queue.add_after(uid, delay)
        self._log.debug(
            "will try to own claim",
            claim=claim_key(claim),
            delay=round(delay, 3),
            attempt=self._limiter.num_requeues(uid),
        )

    async def _become_owner(self, claim: Obj, storage_class: Mapping[str, Any], now: float) -> None:
        uid, key = uid_of(claim), claim_key(claim)
        check = self.deployment.capacity_check
        if check is not None:
            try:
                room = await check(claim, storage_class)
            except Exception as err:
                self._log.info(
                    "capacity check failed; trying to own the claim anyway",
                    claim=key,
                    error=f"{type(err).__name__}: {err}",
                )
                room = True
            if not room:
                # Someone else may have room; look again after a longer wait.
                self._log.debug("not enough capacity for claim on this node", claim=key)
                self._wait(uid, claim, now)
                return
        metadata = claim.get("metadata") or {}
        body = {
            "metadata": {
                # The precondition: of all instances updating this version, one wins.
                "resourceVersion": metadata.get("resourceVersion"),
                "annotations": {ANN_SELECTED_NODE: self.node_name},
            }
        }
        try:
            await self._ctx.claims_client.patch(
                metadata.get("name", ""), body, namespace=metadata.get("namespace")
            )
        except ApiException as err:
            if is_conflict(err):
                # Lost the race or the claim changed: its update is on its way; try again
                # later, with a longer delay, unless it shows another owner first.
                self._log.debug("conflict while trying to own claim", claim=key)
                self._wait(uid, claim, self._ctx.clock.monotonic())
                return
            if is_not_found(err):
                self.forget(uid)
                return
            raise
        self._limiter.forget(uid)
        self._log.info("selected this node for claim", claim=key)

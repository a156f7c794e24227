"""Expansion of hostpath volumes: there is none — a volume is a plain directory with no size of
its own — but a claim that asks for more should hear so instead of waiting silently.

:class:`HostPathResizer` is a :class:`~pyprovlib.NotExpandable` under the provisioner's
name: run in a :class:`HostPathResizeController` beside the ProvisionController, every claim of a
hostpath class whose request grows gets one ``VolumeResizeFailed`` event saying what to do
instead. Nothing is ever patched.

In node mode (one provisioner per node, no leader election) every instance would answer every
claim; with ``node`` set, an instance looks only at claims whose volume lives on its own node
(the ``pyprovlib.io/hostpath-node`` annotation the provisioner records), so each claim gets its
event from exactly one instance. This filter sits in the controller, before the resizer is
asked: a resizer that merely *refused* other nodes' volumes would still get the event sent for
them (the claim's class names it), and one that *accepted* them would have them expanded.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from pyprovlib._logging import get_logger
from pyprovlib._resizer import NotExpandable
from pyprovlib.controller._resize import ResizeController
from pyprovlib.examples.hostpath._provisioner import ANNOTATION_NODE, HOSTNAME_LABEL
from pyprovlib.kube._objects import as_mapping

__all__ = [
    "NOT_EXPANDABLE_REASON",
    "HostPathResizeController",
    "HostPathResizer",
    "volume_node",
]

log = get_logger(__name__)

NOT_EXPANDABLE_REASON: Final = (
    "hostpath volumes cannot be expanded (a volume is a directory on one node's disk, with no "
    "size of its own): to get more space, create a new claim of the size you need, copy the "
    "data over (e.g. with a pod that mounts both claims), and delete this claim"
)
"""The event message's reason, after ``resizer "<name>" cannot expand volume <pv>:``."""


def volume_node(pv: Mapping[str, Any]) -> str | None:
    """The node holding the PV ``pv`` (a JSON dict): the recorded ``pyprovlib.io/hostpath-node``
    annotation, else the hostname in its node affinity (as the provisioner's
    ``volume_node_name``)."""
    metadata = as_mapping(pv.get("metadata"))
    recorded = as_mapping(metadata.get("annotations")).get(ANNOTATION_NODE)
    if isinstance(recorded, str) and recorded:
        return recorded
    affinity = as_mapping(
        as_mapping(as_mapping(pv.get("spec")).get("nodeAffinity")).get("required")
    )
    terms = affinity.get("nodeSelectorTerms")
    for term in terms if isinstance(terms, list) else []:
        expressions = as_mapping(term).get("matchExpressions")
        for raw in expressions if isinstance(expressions, list) else []:
            req = as_mapping(raw)
            values = req.get("values")
            if (
                req.get("key") == HOSTNAME_LABEL
                and req.get("operator") == "In"
                and isinstance(values, list)
                and values
            ):
                return str(values[0])
    return None


class HostPathResizer(NotExpandable):
    """hostpath's resizer: expands nothing, explains :data:`NOT_EXPANDABLE_REASON`.

    ``node``: in node mode, the node this instance serves (see :meth:`serves`); None in
    helper-pod mode, where one instance (the leader) serves every node.
    """

    def __init__(self, name: str, node: str | None = None) -> None:
        super().__init__(name, NOT_EXPANDABLE_REASON)
        self.node = node

    def serves(self, pv: Mapping[str, Any]) -> bool:
        """Whether this instance answers for ``pv``: always without ``node``, else when the
        volume lives on ``node``."""
        return self.node is None or volume_node(pv) == self.node


class HostPathResizeController(ResizeController[HostPathResizer]):
    """A :class:`~pyprovlib.ResizeController` that leaves alone claims whose
    volume :meth:`HostPathResizer.serves` says belongs to another instance."""

    @property
    def hostpath_resizer(self) -> HostPathResizer:
        """The :class:`HostPathResizer` this controller drives (the same as :attr:`resizer`)."""
        return self.resizer

    async def sync_claim(self, key: str) -> None:
        """Skip claims of other nodes' volumes, then look at the claim as usual."""
        pvc = self.pvc_informer.store.get_by_key(key)
        volume_name = as_mapping(pvc.get("spec")).get("volumeName") if pvc is not None else None
        if isinstance(volume_name, str) and volume_name:
            pv = self.pv_informer.store.get_by_key(volume_name)
            if pv is not None and not self.resizer.serves(pv):
                log.debug(
                    "volume of another node; its instance answers",
                    claim=key,
                    pv=volume_name,
                    node=volume_node(pv),
                )
                return
        await super().sync_claim(key)

"""Accessibility requirements of a CSI volume (upstream's ``topology.go``): the requisite and
preferred topology segments sent with CreateVolume, from the selected node, the class's
allowedTopologies or every node running the driver, and the PV's node affinity from the
topology the driver reports."""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pyprovlib._errors import PyprovlibError
from pyprovlib._provisioner import ProvisioningError, ProvisioningState
from pyprovlib.csi._proto.csi import v1
from pyprovlib.csi.provisioner._common import ObjectReader, PreparationError
from pyprovlib.kube._errors import ApiException, is_not_found
from pyprovlib.kube._objects import Obj

__all__ = [
    "TopologyError",
    "accessibility_requirements",
    "generate_accessibility_requirements",
    "node_affinity",
]


class TopologyError(PyprovlibError):
    """The selected node's Node or CSINode is missing or inconsistent: reschedule."""


def _flatten_allowed_topologies(terms: Iterable[Mapping[str, Any]]) -> list[dict[str, str]]:
    """Each term's label expressions, as the cartesian product of their values."""
    segments: list[dict[str, str]] = []
    for term in terms:
        expressions = term.get("matchLabelExpressions") or []
        keys = [e["key"] for e in expressions]
        for values in itertools.product(*[e.get("values") or [] for e in expressions]):
            segment = dict(zip(keys, values, strict=True))
            if segment and segment not in segments:
                segments.append(segment)
    return segments


def _topology_keys(csinode: Mapping[str, Any], driver: str) -> list[str] | None:
    for entry in (csinode.get("spec") or {}).get("drivers") or []:
        if entry.get("name") == driver:
            return list(entry.get("topologyKeys") or [])
    return None


def _sorted_segments(segments: Iterable[dict[str, str]]) -> list[dict[str, str]]:
    unique: dict[tuple[tuple[str, str], ...], dict[str, str]] = {}
    for segment in segments:
        unique.setdefault(tuple(sorted(segment.items())), segment)
    return [unique[k] for k in sorted(unique)]


def _rotate(segments: list[dict[str, str]], start: int) -> list[dict[str, str]]:
    if not segments:
        return segments
    start %= len(segments)
    return segments[start:] + segments[:start]


def _stable_offset(name: str) -> int:
    # Spreads claims across segments deterministically (upstream hashes the claim name).
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "big")


def generate_accessibility_requirements(
    driver: str,
    claim_name: str,
    allowed_topologies: Sequence[Mapping[str, Any]],
    *,
    selected_node: Obj | None,
    selected_csinode: Obj | None,
    all_nodes: Sequence[Obj],
    all_csinodes: Sequence[Obj],
    strict_topology: bool = False,
    immediate_topology: bool = True,
) -> v1.TopologyRequirement | None:
    """Requisite and preferred topologies for CreateVolume (upstream's
    ``GenerateAccessibilityRequirements``).

    With a selected node: its CSINode's topology keys and its labels give the selected segment,
    preferred first. Without: the class's allowedTopologies, else (``immediate_topology``) the
    segments of every node running the driver, else no requirement.
    """
    selected_segment: dict[str, str] | None = None
    if selected_node is not None:
        node_name = (selected_node.get("metadata") or {}).get("name", "")
        if selected_csinode is None:
            raise TopologyError(f"CSINode {node_name!r} of the selected node not found")
        keys = _topology_keys(selected_csinode, driver)
        if keys is None:
            raise TopologyError(f"driver {driver} is not registered on node {node_name!r}")
        labels = (selected_node.get("metadata") or {}).get("labels") or {}
        missing = [k for k in keys if k not in labels]
        if missing:
            raise TopologyError(
                f"topology labels of the selected node {node_name!r} do not match the "
                f"topology keys of its CSINode: missing {missing}"
            )
        selected_segment = {k: labels[k] for k in keys}

    if allowed_topologies:
        requisite = _sorted_segments(_flatten_allowed_topologies(allowed_topologies))
        if selected_segment is not None and strict_topology:
            requisite = [
                s for s in requisite if all(selected_segment.get(k) == v for k, v in s.items())
            ] or [selected_segment]
    elif selected_segment is not None and strict_topology:
        requisite = [selected_segment]
    elif selected_segment is not None or immediate_topology:
        requisite = _aggregate_segments(
            driver,
            all_nodes,
            all_csinodes,
            keys=list(selected_segment) if selected_segment is not None else None,
        )
        if selected_segment is not None and selected_segment not in requisite:
            requisite = _sorted_segments([*requisite, selected_segment])
    else:
        requisite = []
    if not requisite:
        return None

    if selected_segment is not None:
        matching = [
            i
            for i, s in enumerate(requisite)
            if all(selected_segment.get(k) == v for k, v in s.items())
        ]
        preferred = _rotate(requisite, matching[0] if matching else 0)
        if not matching:
            preferred = [selected_segment, *preferred]
    else:
        preferred = _rotate(requisite, _stable_offset(claim_name))
    return v1.TopologyRequirement(
        requisite=[v1.Topology(segments=s) for s in requisite],
        preferred=[v1.Topology(segments=s) for s in preferred],
    )


def _aggregate_segments(
    driver: str,
    nodes: Sequence[Obj],
    csinodes: Sequence[Obj],
    *,
    keys: list[str] | None,
) -> list[dict[str, str]]:
    """Segments of all nodes running ``driver`` (with the same topology keys when given)."""
    labels_by_node = {
        (n.get("metadata") or {}).get("name"): (n.get("metadata") or {}).get("labels") or {}
        for n in nodes
    }
    segments: list[dict[str, str]] = []
    for csinode in csinodes:
        node_keys = _topology_keys(csinode, driver)
        if not node_keys:
            continue
        if keys is not None and sorted(node_keys) != sorted(keys):
            continue
        labels = labels_by_node.get((csinode.get("metadata") or {}).get("name"))
        if labels is None or any(k not in labels for k in node_keys):
            continue
        segments.append({k: labels[k] for k in node_keys})
    return _sorted_segments(segments)


def node_affinity(topologies: Iterable[v1.Topology]) -> Obj | None:
    """The PV's ``nodeAffinity`` for the topology the driver reports the volume accessible
    from (one term per segment), or None when it reports none."""
    terms = [
        {
            "matchExpressions": [
                {"key": key, "operator": "In", "values": [value]}
                for key, value in sorted(t.segments.items())
            ]
        }
        for t in topologies
        if t.segments
    ]
    if not terms:
        return None
    return {"required": {"nodeSelectorTerms": terms}}


async def accessibility_requirements(
    driver: str,
    claim_name: str,
    allowed_topologies: Sequence[Mapping[str, Any]],
    selected_node_name: str | None,
    *,
    nodes: ObjectReader,
    csinodes: ObjectReader,
    strict_topology: bool,
    immediate_topology: bool,
) -> v1.TopologyRequirement | None:
    """:func:`generate_accessibility_requirements` with the Nodes and CSINodes it needs read
    from ``nodes`` and ``csinodes``. A missing or inconsistent selected node is a
    ProvisioningError in state RESCHEDULE; an API error a PreparationError."""
    selected_node: Obj | None = None
    selected_csinode: Obj | None = None
    try:
        if selected_node_name:
            try:
                selected_node = await nodes.get(selected_node_name)
            except ApiException as err:
                if is_not_found(err):
                    raise TopologyError(f"selected node {selected_node_name!r} not found") from None
                raise
            try:
                selected_csinode = await csinodes.get(selected_node_name)
            except ApiException as err:
                if not is_not_found(err):
                    raise
        all_nodes: list[Obj] = []
        all_csinodes: list[Obj] = []
        needs_all = not allowed_topologies and (
            (selected_node_name and not strict_topology)
            or (not selected_node_name and immediate_topology)
        )
        if needs_all:
            all_nodes = await nodes.list()
            all_csinodes = await csinodes.list()
        return generate_accessibility_requirements(
            driver,
            claim_name,
            allowed_topologies,
            selected_node=selected_node,
            selected_csinode=selected_csinode,
            all_nodes=all_nodes,
            all_csinodes=all_csinodes,
            strict_topology=strict_topology,
            immediate_topology=immediate_topology,
        )
    except TopologyError as err:
        raise ProvisioningError(
            f"error generating accessibility requirements: {err}",
            ProvisioningState.RESCHEDULE,
        ) from None
    except ApiException as err:
        raise PreparationError(
            f"error generating accessibility requirements: {err.status} {err.reason}"
        ) from None

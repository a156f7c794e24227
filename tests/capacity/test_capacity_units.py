"""Pure parts of the capacity controller: segments, the selectors and node affinity terms they
come from, and which classes get objects."""

from __future__ import annotations

import pytest

from pyprovlib.controller._capacity.controller import WorkItem, item_of
from pyprovlib.controller._capacity.topology import (
    driver_topology_keys,
    segment_from_node_selector_term,
    segment_from_selector,
    segment_selector,
    segment_text,
)

KEY = "topology.example.com/zone"


def test_a_segment_is_written_and_read_back_as_a_selector() -> None:
    segment = (("a.example.com/rack", "r1"), (KEY, "z1"))
    selector = segment_selector(segment)
    assert selector == {"matchLabels": {"a.example.com/rack": "r1", KEY: "z1"}}
    assert segment_from_selector(selector) == segment
    # The empty segment (a driver without topology) is every node: {} as the server stores it.
    assert segment_selector(()) == {}
    assert segment_from_selector({}) == ()
    assert segment_from_selector({"matchLabels": {}}) == ()
    # Not a selector this controller writes: never matched to a segment.
    assert segment_from_selector(None) is None
    assert segment_from_selector({"matchExpressions": [{"key": KEY, "operator": "Exists"}]}) is None
    assert segment_text(segment) == "a.example.com/rack: r1+ topology.example.com/zone: z1"
    assert segment_text(()) == "<all nodes>"


def test_objects_map_to_their_pair() -> None:
    obj = {"storageClassName": "fast", "nodeTopology": {"matchLabels": {KEY: "z1"}}}
    assert item_of(obj) == WorkItem("fast", ((KEY, "z1"),))
    assert item_of({"storageClassName": "fast"}) is None
    assert str(WorkItem("fast", ())) == "fast in <all nodes>"


def test_node_affinity_terms_become_segments() -> None:
    term = {
        "matchExpressions": [
            {"key": KEY, "operator": "In", "values": ["z1"]},
            {"key": "a.example.com/rack", "operator": "In", "values": ["r1"]},
        ]
    }
    assert segment_from_node_selector_term(term) == (("a.example.com/rack", "r1"), (KEY, "z1"))
    with pytest.raises(ValueError, match="matchFields"):
        segment_from_node_selector_term({"matchFields": [{"key": "metadata.name"}]})
    with pytest.raises(ValueError, match="operator"):
        segment_from_node_selector_term(
            {"matchExpressions": [{"key": KEY, "operator": "NotIn", "values": ["z1"]}]}
        )
    with pytest.raises(ValueError, match="exactly one"):
        segment_from_node_selector_term(
            {"matchExpressions": [{"key": KEY, "operator": "In", "values": ["z1", "z2"]}]}
        )


def test_the_driver_keys_of_a_csinode() -> None:
    csinode = {
        "spec": {
            "drivers": [
                {"name": "other", "topologyKeys": ["x"]},
                {"name": "d", "topologyKeys": None},
            ]
        }
    }
    assert driver_topology_keys(csinode, "d") == []
    assert driver_topology_keys(csinode, "other") == ["x"]
    assert driver_topology_keys(csinode, "missing") is None

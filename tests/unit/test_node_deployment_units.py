"""The pure parts of node deployment: its options, which volumes a node can reach, which classes
admit a node, and the jittered exponential delays of the race for Immediate claims."""

from __future__ import annotations

import random
from typing import Any

import pytest

from pyprovlib._errors import InvalidOptionsError
from pyprovlib.controller._options import NodeDeployment, ProvisionControllerOptions
from pyprovlib.controller._provision import allowed_topologies_match, volume_is_accessible
from pyprovlib.controller._provision.node_deployment import JitteredExponentialRateLimiter


def test_defaults_are_external_provisioners() -> None:
    deployment = NodeDeployment("node-a")
    assert (deployment.immediate_binding, deployment.base_delay, deployment.max_delay) == (
        True,
        20.0,
        60.0,
    )
    assert deployment.topology is None  # the Node's labels, read when first needed


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"node_name": ""}, "NODE_NAME"),
        ({"node_name": "n", "base_delay": -1.0}, "base_delay"),
        ({"node_name": "n", "base_delay": 2.0, "max_delay": 1.0}, "max_delay"),
    ],
)
def test_invalid_node_deployment(kwargs: dict[str, Any], fragment: str) -> None:
    with pytest.raises(InvalidOptionsError, match=fragment):
        NodeDeployment(**kwargs)


def test_node_deployment_needs_leader_election_off() -> None:
    with pytest.raises(InvalidOptionsError, match="leader_election=False"):
        ProvisionControllerOptions(node_deployment=NodeDeployment("n"))
    ProvisionControllerOptions(node_deployment=NodeDeployment("n"), leader_election=False)


def test_topology_is_copied_read_only() -> None:
    labels = {"zone": "a"}
    deployment = NodeDeployment("n", topology=labels)
    labels["zone"] = "b"
    assert deployment.topology == {"zone": "a"}
    with pytest.raises(TypeError):
        deployment.topology["zone"] = "c"  # type: ignore[index]


def pv(*terms: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "spec": {
            "nodeAffinity": {
                "required": {"nodeSelectorTerms": [{"matchExpressions": t} for t in terms]}
            }
        }
    }


@pytest.mark.parametrize(
    ("volume", "expected"),
    [
        ({"spec": {}}, True),  # no affinity: reachable from anywhere (upstream too)
        (pv([{"key": "zone", "operator": "In", "values": ["a"]}]), True),
        (pv([{"key": "zone", "operator": "In", "values": ["b"]}]), False),
        (
            pv(
                [{"key": "zone", "operator": "In", "values": ["b"]}],
                [{"key": "host", "operator": "In", "values": ["h1"]}],
            ),
            True,
        ),  # terms are ORed
        (
            pv(
                [
                    {"key": "zone", "operator": "In", "values": ["a"]},
                    {"key": "host", "operator": "In", "values": ["h2"]},
                ]
            ),
            False,
        ),  # expressions are ANDed
        (pv([{"key": "zone", "operator": "NotIn", "values": ["b"]}]), True),
        (pv([{"key": "rack", "operator": "Exists"}]), False),
        (pv([{"key": "rack", "operator": "DoesNotExist"}]), True),
        (pv([{"key": "disks", "operator": "Gt", "values": ["3"]}]), True),
        (pv([{"key": "disks", "operator": "Lt", "values": ["3"]}]), False),
    ],
)
def test_volume_is_accessible(volume: dict[str, Any], expected: bool) -> None:
    segment = {"zone": "a", "host": "h1", "disks": "4"}
    assert volume_is_accessible(volume, segment) is expected


@pytest.mark.parametrize(
    ("terms", "expected"),
    [
        (None, True),
        ([{"matchLabelExpressions": [{"key": "zone", "values": ["a", "b"]}]}], True),
        ([{"matchLabelExpressions": [{"key": "zone", "values": ["b"]}]}], False),
        (
            [
                {"matchLabelExpressions": [{"key": "zone", "values": ["b"]}]},
                {"matchLabelExpressions": [{"key": "host", "values": ["h1"]}]},
            ],
            True,
        ),
        ([{"matchLabelExpressions": [{"key": "other", "values": ["a"]}]}], False),
    ],
)
def test_allowed_topologies(terms: list[dict[str, Any]] | None, expected: bool) -> None:
    storage_class = {"allowedTopologies": terms} if terms is not None else {}
    assert allowed_topologies_match(storage_class, {"zone": "a", "host": "h1"}) is expected


def test_jittered_delays_grow_to_the_maximum_and_start_over_when_forgotten() -> None:
    limiter = JitteredExponentialRateLimiter(1.0, 6.0, random.Random(7))
    delays = [limiter.when("c") for _ in range(6)]
    # base * 2**n (capped at max) minus up to one base delay of jitter.
    for n, delay in enumerate(delays):
        ceiling = min(2.0**n, 6.0)
        assert ceiling - 1.0 <= delay <= ceiling
    assert limiter.num_requeues("c") == 6
    limiter.forget("c")
    assert limiter.num_requeues("c") == 0
    assert 0.0 <= limiter.when("c") <= 1.0


def test_jitter_spreads_first_delays() -> None:
    limiter = JitteredExponentialRateLimiter(1.0, 6.0, random.Random(1))
    first = {round(limiter.when(f"claim-{i}"), 3) for i in range(20)}
    assert len(first) > 10
    assert all(0.0 <= d <= 1.0 for d in first)

"""CSIProvisioner's pure helpers: names, templates, capabilities, error mapping, topology."""

from __future__ import annotations

from typing import Any

import pytest
from grpclib.const import Status

from pyprovlib._provisioner import ProvisioningState
from pyprovlib.controller._provision import FINALIZER_PROVISIONING
from pyprovlib.csi._connection import CSICallError
from pyprovlib.csi._proto.csi import v1
from pyprovlib.csi.provisioner._controller import check_error
from pyprovlib.csi.provisioner._data_source import (
    CLONE_FINALIZER,
    clone_holds_source,
    clone_source_key,
    requested_before_deletion,
)
from pyprovlib.csi.provisioner._request import make_volume_name, volume_capabilities
from pyprovlib.csi.provisioner._secrets import (
    PROVISIONER_SECRET,
    resolve_template,
    secret_reference,
)
from pyprovlib.csi.provisioner._topology import TopologyError, generate_accessibility_requirements
from pyprovlib.kube._objects import Obj

UID = "6a1c4033-5d21-4b52-8cf8-e3233a8f3054"
Mode = v1.VolumeCapabilityAccessModeMode


def test_make_volume_name() -> None:
    assert make_volume_name("pvc", UID, -1) == f"pvc-{UID}"
    assert make_volume_name("csi", UID, 8) == "csi-6a1c4033"
    assert make_volume_name("csi", UID, 12) == "csi-6a1c40335d21"
    with pytest.raises(ValueError, match="prefix"):
        make_volume_name("", UID, -1)
    with pytest.raises(ValueError, match="UID"):
        make_volume_name("pvc", "", -1)


def test_resolve_template() -> None:
    params = {"pv.name": "pv-1", "pvc.name": "data", "pvc.annotations['a/b']": "x"}
    assert resolve_template("${pvc.name}-${pv.name}", params) == "data-pv-1"
    assert resolve_template("s-${pvc.annotations['a/b']}", params) == "s-x"
    assert resolve_template("plain", params) == "plain"
    with pytest.raises(ValueError, match=r"invalid tokens: \['nope'\]"):
        resolve_template("${nope}", params)
    with pytest.raises(ValueError, match="invalid tokens"):
        resolve_template("$bare", params)
    with pytest.raises(ValueError, match="malformed"):
        resolve_template("${pvc.name", params)


def claim(namespace: str = "ns1", name: str = "data", **annotations: str) -> Obj:
    return {"metadata": {"namespace": namespace, "name": name, "annotations": annotations}}


def test_secret_reference_rules() -> None:
    key_name = PROVISIONER_SECRET.name_key
    key_ns = PROVISIONER_SECRET.namespace_key
    assert secret_reference(PROVISIONER_SECRET, {}, "pv-1", claim()) is None
    ref = secret_reference(
        PROVISIONER_SECRET,
        {key_name: "${pvc.name}-${pv.name}", key_ns: "${pvc.namespace}"},
        "pv-1",
        claim(),
    )
    assert ref is not None
    assert (ref.name, ref.namespace) == ("data-pv-1", "ns1")
    with pytest.raises(ValueError, match="both must be specified"):
        secret_reference(PROVISIONER_SECRET, {key_name: "x"}, "pv-1", claim())
    # The namespace may not use the claim's name (upstream: only pv.name and pvc.namespace).
    with pytest.raises(ValueError, match="invalid tokens"):
        secret_reference(
            PROVISIONER_SECRET, {key_name: "x", key_ns: "${pvc.name}"}, "pv-1", claim()
        )
    with pytest.raises(ValueError, match="not a valid namespace name"):
        secret_reference(PROVISIONER_SECRET, {key_name: "x", key_ns: "Bad.NS"}, "pv-1", claim())
    # At deletion there is no claim: claim tokens are invalid.
    with pytest.raises(ValueError, match="invalid tokens"):
        secret_reference(PROVISIONER_SECRET, {key_name: "${pvc.name}", key_ns: "ns"}, "pv-1", None)


def test_volume_capabilities() -> None:
    caps = volume_capabilities(
        ["ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod"],
        block=False,
        fs_type="ext4",
        mount_flags=["ro"],
    )
    assert [c.access_mode.mode for c in caps if c.access_mode] == [
        Mode.SINGLE_NODE_WRITER,
        Mode.MULTI_NODE_READER_ONLY,
        Mode.MULTI_NODE_MULTI_WRITER,
        Mode.SINGLE_NODE_WRITER,
    ]
    assert all(c.mount is not None and c.mount.fs_type == "ext4" for c in caps)
    multi = volume_capabilities(
        ["ReadWriteOnce", "ReadWriteOncePod"],
        block=True,
        fs_type="",
        mount_flags=[],
        single_node_multi_writer=True,
    )
    assert [c.access_mode.mode for c in multi if c.access_mode] == [
        Mode.SINGLE_NODE_MULTI_WRITER,
        Mode.SINGLE_NODE_SINGLE_WRITER,
    ]
    assert all(c.block is not None and c.mount is None for c in multi)
    with pytest.raises(ValueError, match="no access modes"):
        volume_capabilities([], block=False, fs_type="", mount_flags=[])


@pytest.mark.parametrize(
    ("error", "may_reschedule", "state"),
    [
        (RuntimeError("not grpc"), False, ProvisioningState.IN_BACKGROUND),
        (CSICallError("m", Status.CANCELLED, ""), False, ProvisioningState.IN_BACKGROUND),
        (CSICallError("m", Status.DEADLINE_EXCEEDED, ""), False, ProvisioningState.IN_BACKGROUND),
        (CSICallError("m", Status.UNAVAILABLE, ""), False, ProvisioningState.IN_BACKGROUND),
        (CSICallError("m", Status.ABORTED, ""), False, ProvisioningState.IN_BACKGROUND),
        (CSICallError("m", Status.RESOURCE_EXHAUSTED, ""), True, ProvisioningState.RESCHEDULE),
        (CSICallError("m", Status.RESOURCE_EXHAUSTED, ""), False, ProvisioningState.FINISHED),
        (CSICallError("m", Status.INVALID_ARGUMENT, ""), True, ProvisioningState.FINISHED),
        (CSICallError("m", Status.NOT_FOUND, ""), False, ProvisioningState.FINISHED),
    ],
)
def test_check_error(error: Exception, may_reschedule: bool, state: ProvisioningState) -> None:
    assert check_error(error, may_reschedule) is state


KEY = "zone"


def node(name: str, zone: str) -> Obj:
    return {"metadata": {"name": name, "labels": {KEY: zone}}}


def csinode(name: str, keys: list[str], driver: str = "d") -> Obj:
    return {
        "metadata": {"name": name},
        "spec": {"drivers": [{"name": driver, "topologyKeys": keys}]},
    }


def segs(topologies: list[v1.Topology]) -> list[dict[str, str]]:
    return [dict(t.segments) for t in topologies]


def requirements(
    nodes: list[Obj],
    csinodes: list[Obj],
    selected: int | None = None,
    allowed: list[Obj] | None = None,
    **options: Any,
) -> v1.TopologyRequirement | None:
    """The requirements of driver ``d`` for a claim, ``nodes[selected]`` (and its CSINode)
    selected, or none."""
    return generate_accessibility_requirements(
        "d",
        "claim",
        allowed or [],
        selected_node=None if selected is None else nodes[selected],
        selected_csinode=None if selected is None else csinodes[selected],
        all_nodes=nodes,
        all_csinodes=csinodes,
        **options,
    )


def test_topology_selected_node_strict_and_aggregated() -> None:
    nodes = [node("a", "z1"), node("b", "z2"), node("c", "z3")]
    csinodes = [csinode("a", [KEY]), csinode("b", [KEY]), csinode("c", [KEY], driver="other")]
    req = requirements(nodes, csinodes, 1)
    assert req is not None
    assert segs(req.requisite) == [{KEY: "z1"}, {KEY: "z2"}]
    assert segs(req.preferred) == [{KEY: "z2"}, {KEY: "z1"}]
    strict = requirements(nodes, csinodes, 1, strict_topology=True)
    assert strict is not None
    assert segs(strict.requisite) == [{KEY: "z2"}]
    with pytest.raises(TopologyError, match="not registered"):
        requirements(nodes, csinodes, 2)
    with pytest.raises(TopologyError, match="missing"):
        generate_accessibility_requirements(
            "d",
            "claim",
            [],
            selected_node={"metadata": {"name": "a", "labels": {}}},
            selected_csinode=csinodes[0],
            all_nodes=nodes,
            all_csinodes=csinodes,
        )


def test_topology_immediate() -> None:
    nodes = [node("a", "z1"), node("b", "z2")]
    csinodes = [csinode("a", [KEY]), csinode("b", [KEY])]
    req = requirements(nodes, csinodes)
    assert req is not None
    assert segs(req.requisite) == [{KEY: "z1"}, {KEY: "z2"}]
    assert sorted(map(str, segs(req.preferred))) == sorted(map(str, segs(req.requisite)))
    none = requirements(nodes, csinodes, immediate_topology=False)
    assert none is None
    allowed = requirements(
        [],
        [],
        allowed=[
            {
                "matchLabelExpressions": [
                    {"key": KEY, "values": ["z9"]},
                    {"key": "r", "values": ["1", "2"]},
                ]
            }
        ],
    )
    assert allowed is not None
    assert segs(allowed.requisite) == [{"r": "1", KEY: "z9"}, {"r": "2", KEY: "z9"}]


# -- which clones hold their source claim ------------------------------------------------------


def _claim(name: str, **fields: Any) -> Obj:
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": "ns",
        "creationTimestamp": "2025-01-01T10:00:00Z",
    }
    metadata.update(fields.pop("metadata", {}))
    return {"metadata": metadata, "spec": fields.pop("spec", {}), "status": fields}


SOURCE = _claim("source", metadata={"finalizers": [CLONE_FINALIZER]}, phase="Bound")
CLONE_SPEC = {"dataSource": {"kind": "PersistentVolumeClaim", "name": "source"}}


@pytest.mark.parametrize(
    ("clone", "holds"),
    [
        (_claim("c", spec=CLONE_SPEC, phase="Pending"), True),
        (_claim("c", spec=CLONE_SPEC), True),  # no status yet
        (_claim("c", spec={"dataSourceRef": CLONE_SPEC["dataSource"]}, phase="Pending"), True),
        (_claim("c", spec=CLONE_SPEC, phase="Bound"), False),
        (_claim("c", spec=CLONE_SPEC, phase="Lost"), False),
        (
            _claim("c", spec={"dataSource": {"kind": "PersistentVolumeClaim", "name": "other"}}),
            False,
        ),
        (_claim("c", spec={"dataSource": {**CLONE_SPEC["dataSource"], "apiGroup": "x.io"}}), False),
        (_claim("c", spec={"dataSource": {"kind": "VolumeSnapshot", "name": "source"}}), False),
        (_claim("c", spec={}), False),
        # Being deleted: held only while its volume may still be being created.
        (
            _claim("c", spec=CLONE_SPEC, metadata={"deletionTimestamp": "2025-01-01T11:00:00Z"}),
            False,
        ),
        (
            _claim(
                "c",
                spec=CLONE_SPEC,
                metadata={
                    "deletionTimestamp": "2025-01-01T11:00:00Z",
                    "finalizers": [FINALIZER_PROVISIONING],
                },
            ),
            True,
        ),
    ],
)
def test_which_clones_hold_their_source(clone: Obj, holds: bool) -> None:
    assert clone_holds_source(clone, SOURCE) is holds


def test_the_source_key_of_a_clone() -> None:
    assert clone_source_key(_claim("c", spec=CLONE_SPEC)) == "ns/source"
    ref = {**CLONE_SPEC["dataSource"], "namespace": "elsewhere"}
    assert clone_source_key(_claim("c", spec={"dataSourceRef": ref})) == "elsewhere/source"
    assert clone_source_key(_claim("c", spec={})) is None
    snapshot = {"kind": "VolumeSnapshot", "apiGroup": "snapshot.storage.k8s.io", "name": "s"}
    assert clone_source_key(_claim("c", spec={"dataSource": snapshot})) is None


@pytest.mark.parametrize(
    ("created", "holds"),
    [
        ("2025-01-01T11:59:59Z", True),
        ("2025-01-01T12:00:00Z", True),  # the same second: it may have come first
        ("2025-01-01T12:00:01Z", False),  # created after the deletion was requested
    ],
)
def test_a_source_being_deleted_is_held_only_by_clones_that_existed_before(
    created: str, holds: bool
) -> None:
    source = _claim(
        "source",
        metadata={"finalizers": [CLONE_FINALIZER], "deletionTimestamp": "2025-01-01T12:00:00Z"},
        phase="Bound",
    )
    clone = _claim("c", spec=CLONE_SPEC, metadata={"creationTimestamp": created})
    assert clone_holds_source(clone, source) is holds
    assert requested_before_deletion(clone, source) is holds

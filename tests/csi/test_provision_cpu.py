"""The CSI provisioning path's per-call work done once (issue 19, CPU): what each saving must
keep — the PV a provisioner returns is copied before the controller completes it, a storage
request is parsed once per distinct string but a bad one is refused every time, and the CSI
call histogram counts every call although its labelled children are kept."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import pytest
from grpclib.const import Status
from prometheus_client import CollectorRegistry

from pyprovlib.controller._provision.decisions import storage_request_bytes
from pyprovlib.csi._connection import CSIMetrics
from pyprovlib.kube._convert import copy_json


def test_copy_json_copies_every_container_and_shares_leaves() -> None:
    leaf = object()
    original: dict[str, Any] = {
        "metadata": {"name": "pv-1", "annotations": {"a": "b"}},
        "spec": {"accessModes": ["ReadWriteOnce"], "csi": {"volumeAttributes": {"k": "v"}}},
        "list": [{"x": 1}, [2, 3]],
        "tuple": ({"y": None},),
        "proxy": MappingProxyType({"z": True}),
        "other": leaf,
    }
    copied = copy_json(original)
    assert copied == {**original, "tuple": [{"y": None}], "proxy": {"z": True}}
    # Every container is new: completing the copy leaves the provisioner's object alone.
    copied["metadata"]["annotations"]["c"] = "d"
    copied["spec"]["accessModes"].append("ReadOnlyMany")
    copied["spec"]["csi"]["volumeAttributes"]["k"] = "changed"
    copied["list"][0]["x"] = 2
    copied["list"][1].append(4)
    copied["tuple"][0]["y"] = 1
    copied["proxy"]["z"] = False
    assert original["metadata"] == {"name": "pv-1", "annotations": {"a": "b"}}
    assert original["spec"] == {
        "accessModes": ["ReadWriteOnce"],
        "csi": {"volumeAttributes": {"k": "v"}},
    }
    assert original["list"] == [{"x": 1}, [2, 3]]
    assert original["tuple"] == ({"y": None},)
    assert dict(original["proxy"]) == {"z": True}
    assert copied["other"] is leaf
    assert type(copied["proxy"]) is dict


def test_storage_request_bytes_parses_each_size_once_and_refuses_bad_ones_every_time() -> None:
    assert storage_request_bytes("1Gi") == 1024**3
    assert storage_request_bytes("1Gi") == 1024**3
    assert storage_request_bytes("1500M") == 1500 * 1000**2
    assert storage_request_bytes("0.5Ki") == 512
    for _ in range(2):  # a refusal is not remembered as a value
        with pytest.raises(ValueError, match="storage request"):
            storage_request_bytes("10 gigs")
        with pytest.raises(ValueError, match="storage request"):
            storage_request_bytes("-1Gi")
    # Not a string (a malformed cache entry): refused, and nothing unhashable reaches the cache.
    with pytest.raises(ValueError, match="storage request"):
        storage_request_bytes(["1Gi"])
    with pytest.raises(ValueError, match="storage request"):
        storage_request_bytes(None)


def test_csi_call_histogram_counts_every_call_per_label_set() -> None:
    registry = CollectorRegistry()
    metrics = CSIMetrics(registry)
    method = "/csi.v1.Controller/CreateVolume"
    for seconds in (0.05, 0.2, 0.3):
        metrics.observe("drv", method, Status.OK, seconds)
    metrics.observe("drv", method, Status.DEADLINE_EXCEEDED, 10.0)
    metrics.observe("other", method, Status.OK, 1.0)

    def count(driver: str, status: str) -> float | None:
        return registry.get_sample_value(
            "csi_sidecar_operations_seconds_count",
            {"driver_name": driver, "method_name": method, "grpc_status_code": status},
        )

    assert count("drv", "OK") == 3
    assert count("drv", "DeadlineExceeded") == 1
    assert count("other", "OK") == 1
    assert registry.get_sample_value(
        "csi_sidecar_operations_seconds_sum",
        {"driver_name": "drv", "method_name": method, "grpc_status_code": "OK"},
    ) == pytest.approx(0.55)

"""Unit tests of the ProvisionController's options (upstream defaults and validation), its
metrics (upstream names, labels and buckets) and the dict/model conversion at the user
boundary."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes_asyncio.client import (
    ApiClient,
    V1ObjectMeta,
    V1PersistentVolume,
    V1PersistentVolumeClaim,
    V1PersistentVolumeSpec,
    V1StorageClass,
)
from prometheus_client import CollectorRegistry, generate_latest

from pyprovlib._provisioner import Provisioner, ProvisionOptions
from pyprovlib.controller._metrics import GO_DEFAULT_BUCKETS, ProvisionMetrics
from pyprovlib.controller._options import (
    Backoff,
    InvalidOptionsError,
    ProvisionControllerOptions,
    in_cluster_namespace,
    provisioned_volume_name,
)
from pyprovlib.controller._provision import ProvisionController
from pyprovlib.kube._clock import FakeClock
from pyprovlib.kube._convert import ConversionError, from_model, to_model
from pyprovlib.kube._workqueue import ItemExponentialFailureRateLimiter


def test_defaults_are_upstreams() -> None:
    o = ProvisionControllerOptions()
    assert o.resync_period == 900.0
    assert o.workers == 4
    assert o.exponential_backoff_on_error is True
    assert o.rate_limiter is None
    assert o.failed_provision_threshold == 15
    assert o.failed_delete_threshold == 15
    assert o.leader_election is True
    assert (o.lease_duration, o.renew_deadline, o.retry_period) == (15.0, 10.0, 2.0)
    assert (o.metrics_port, o.metrics_address, o.metrics_path) == (0, "0.0.0.0", "/metrics")
    assert o.add_finalizer is False
    assert o.retry_interval_max == 300.0
    assert o.provision_timeout is None
    assert o.deletion_timeout is None
    assert o.additional_provisioner_names == ()
    # Linear backoff: 5 attempts, 10 s apart.
    assert o.pv_backoff == Backoff(duration=10.0, factor=1.0, steps=5)
    assert o.pv_backoff.delays() == [10.0, 10.0, 10.0, 10.0]


def test_retry_count_and_interval_build_the_linear_backoff() -> None:
    o = ProvisionControllerOptions(
        create_provisioned_pv_retry_count=3, create_provisioned_pv_interval=0.5
    )
    assert o.pv_backoff.delays() == [0.5, 0.5]


def test_backoff_grows_and_is_capped() -> None:
    b = Backoff(duration=1.0, factor=2.0, steps=5, cap=5.0)
    assert b.delays() == [1.0, 2.0, 4.0, 5.0]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"workers": 0}, "workers must be at least 1"),
        ({"failed_provision_threshold": -1}, "failed_provision_threshold"),
        ({"failed_delete_threshold": -1}, "failed_delete_threshold"),
        ({"resync_period": -1}, "resync_period"),
        ({"lease_duration": 5.0}, "lease_duration .* must be greater than renew_deadline"),
        ({"retry_period": 9.0}, "1.2 x retry_period"),
        ({"metrics_port": 70000}, "metrics_port"),
        ({"metrics_path": "metrics"}, "metrics_path must start with '/'"),
        ({"provision_timeout": 0}, "provision_timeout"),
        ({"retry_interval_max": 0}, "retry_interval_max"),
        ({"create_provisioned_pv_retry_count": 0}, "create_provisioned_pv_retry_count"),
        ({"additional_provisioner_names": "a/b"}, "not a single string"),
        ({"additional_provisioner_names": ("",)}, "non-empty strings"),
        (
            {
                "create_provisioned_pv_retry_count": 3,
                "create_provisioned_pv_backoff": Backoff(duration=1.0, steps=2),
            },
            "cannot be used together",
        ),
        (
            {
                "create_provisioned_pv_interval": 1.0,
                "create_provisioned_pv_limiter": ItemExponentialFailureRateLimiter(0.1, 1.0),
            },
            "cannot be used together",
        ),
        (
            {
                "create_provisioned_pv_backoff": Backoff(duration=1.0, steps=2),
                "create_provisioned_pv_limiter": ItemExponentialFailureRateLimiter(0.1, 1.0),
            },
            "cannot be used together",
        ),
    ],
)
def test_invalid_options_are_refused_with_a_clear_message(
    kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidOptionsError, match=message):
        ProvisionControllerOptions(**kwargs)  # type: ignore[arg-type]


def test_leader_election_timing_is_not_checked_without_leader_election() -> None:
    ProvisionControllerOptions(leader_election=False, lease_duration=1.0, renew_deadline=2.0)


@pytest.mark.parametrize(
    "kwargs",
    [{"duration": -1.0}, {"duration": 1.0, "steps": 0}, {"duration": 1.0, "factor": -1.0}],
)
def test_invalid_backoff(kwargs: dict[str, float]) -> None:
    with pytest.raises(InvalidOptionsError):
        Backoff(**kwargs)  # type: ignore[arg-type]


def test_additional_names_become_a_tuple() -> None:
    o = ProvisionControllerOptions(additional_provisioner_names=["a/b", "c/d"])  # type: ignore[arg-type]
    assert o.additional_provisioner_names == ("a/b", "c/d")


def test_default_volume_name_is_pvc_dash_uid() -> None:
    claim = V1PersistentVolumeClaim(metadata=V1ObjectMeta(name="c", uid="1234"))
    assert provisioned_volume_name(claim) == "pvc-1234"
    with pytest.raises(ValueError, match=r"no metadata\.uid"):
        provisioned_volume_name(V1PersistentVolumeClaim(metadata=V1ObjectMeta(name="c")))


def test_in_cluster_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAMESPACE", "storage-system")
    assert in_cluster_namespace() == "storage-system"
    monkeypatch.delenv("POD_NAMESPACE")
    # No service account file outside a pod.
    assert in_cluster_namespace() == "default"


def test_metrics_have_upstream_names_labels_and_buckets() -> None:
    registry = CollectorRegistry()
    m = ProvisionMetrics(registry)
    m.provision_succeeded("fast", "Snap", 0.2)
    m.provision_failed("fast", "")
    m.delete_succeeded("fast", 0.03)
    m.delete_failed("")
    text = generate_latest(registry).decode()
    for line in (
        'controller_persistentvolumeclaim_provision_total{class="fast",source="Snap"} 1.0',
        'controller_persistentvolumeclaim_provision_failed_total{class="fast",source=""} 1.0',
        "controller_persistentvolumeclaim_provision_duration_seconds_count"
        '{class="fast",source="Snap"} 1.0',
        'controller_persistentvolume_delete_total{class="fast"} 1.0',
        'controller_persistentvolume_delete_failed_total{class=""} 1.0',
        'controller_persistentvolume_delete_duration_seconds_bucket{class="fast",le="0.05"} 1.0',
    ):
        assert line in text, line
    # Go's DefBuckets, not prometheus_client's.
    assert 'le="0.075"' not in text
    assert GO_DEFAULT_BUCKETS[-1] == 10.0


class _Response:
    """What ApiClient.deserialize reads: the JSON text in ``data``."""

    def __init__(self, data: str) -> None:
        self.data = data


CLAIM = {
    "apiVersion": "v1",
    "kind": "PersistentVolumeClaim",
    "metadata": {
        "name": "c",
        "namespace": "ns",
        "uid": "u",
        "creationTimestamp": "2026-01-01T00:00:00Z",
        "annotations": {"a": "b"},
        "managedFields": [{"manager": "kubectl", "time": "2026-01-01T00:00:01.5Z"}],
    },
    "spec": {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "1Gi"}},
        "storageClassName": "fast",
        "selector": {"matchExpressions": [{"key": "k", "operator": "In", "values": ["v"]}]},
    },
    "status": {"phase": "Pending", "capacity": {"storage": "1Gi"}},
}
CLASS = {
    "apiVersion": "storage.k8s.io/v1",
    "kind": "StorageClass",
    "metadata": {"name": "fast", "creationTimestamp": "2026-01-01T00:00:00+02:00"},
    "provisioner": "example.com/foo",
    "parameters": {"type": "ssd"},
    "allowedTopologies": [
        {"matchLabelExpressions": [{"key": "zone", "values": ["a", "b"]}]},
    ],
    "mountOptions": ["ro"],
    "volumeBindingMode": "WaitForFirstConsumer",
}
VOLUME = {
    "metadata": {"name": "pv", "deletionTimestamp": "2026-02-03T04:05:06Z"},
    "spec": {
        "capacity": {"storage": "1Gi"},
        "csi": {"driver": "d", "volumeHandle": "h", "volumeAttributes": {"x": "y"}},
        "claimRef": {"name": "c", "namespace": "ns", "uid": "u"},
        "nodeAffinity": {
            "required": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "k", "operator": "In", "values": ["n1"]}]}
                ]
            }
        },
    },
}


@pytest.mark.parametrize(
    ("obj", "model"),
    [(CLAIM, V1PersistentVolumeClaim), (CLASS, V1StorageClass), (VOLUME, V1PersistentVolume)],
)
async def test_conversion_matches_kubernetes_asyncio(
    obj: dict[str, object], model: type[Any]
) -> None:
    async with ApiClient() as api:
        theirs = api.deserialize(_Response(json.dumps(obj)), model.__name__)
        ours = to_model(obj, model)
        assert type(ours) is model
        assert ours == theirs
        assert from_model(ours) == api.sanitize_for_serialization(theirs)


async def test_conversion_round_trip() -> None:
    model = to_model(CLAIM, V1PersistentVolumeClaim)
    assert model.metadata.annotations == {"a": "b"}
    assert model.spec.resources.requests == {"storage": "1Gi"}
    back = from_model(model)
    assert back["metadata"]["creationTimestamp"] == "2026-01-01T00:00:00+00:00"
    back["metadata"]["creationTimestamp"] = CLAIM["metadata"]["creationTimestamp"]  # type: ignore[index]
    back["metadata"]["managedFields"][0]["time"] = "2026-01-01T00:00:01.5Z"
    assert back == CLAIM

    pv = V1PersistentVolume(
        metadata=V1ObjectMeta(name="pv"),
        spec=V1PersistentVolumeSpec(capacity={"storage": "1Gi"}, storage_class_name="x"),
    )
    assert from_model(pv) == {
        "metadata": {"name": "pv"},
        "spec": {"capacity": {"storage": "1Gi"}, "storageClassName": "x"},
    }
    # Dicts come back as fresh copies.
    source = {"a": {"b": [1]}}
    copied = from_model(source)
    assert copied == source
    assert copied["a"] is not source["a"]


async def test_conversion_errors_are_typed() -> None:
    # V1StorageClass requires a provisioner: the model's validation refuses this one.
    with pytest.raises(ConversionError, match="V1StorageClass"):
        to_model({"metadata": {"name": "x"}}, V1StorageClass)
    with pytest.raises(ConversionError, match="V1PersistentVolumeClaim"):
        to_model(
            {"metadata": {"name": "x", "creationTimestamp": "not a time"}},
            V1PersistentVolumeClaim,
        )
    with pytest.raises(ConversionError, match="V1PersistentVolumeClaim"):
        to_model({"spec": {"resources": {"requests": 5}}}, V1PersistentVolumeClaim)
    with pytest.raises(ConversionError, match="expected an object"):
        from_model(["not", "a", "model"])
    with pytest.raises(ConversionError, match="neither JSON nor a kubernetes-asyncio model"):
        from_model({"x": object()})


class _NullProvisioner(Provisioner):
    async def provision(self, options: ProvisionOptions) -> V1PersistentVolume:
        raise AssertionError("not called")

    async def delete(self, volume: V1PersistentVolume) -> None:
        raise AssertionError("not called")


@pytest.mark.parametrize(("exponential", "delays"), [(True, [15, 30, 60, 120]), (False, [15] * 4)])
async def test_default_queue_rate_limiter(exponential: bool, delays: list[float]) -> None:
    async with ApiClient() as api:
        controller = ProvisionController(
            api,
            "example.com/foo",
            _NullProvisioner(),
            ProvisionControllerOptions(
                exponential_backoff_on_error=exponential,
                metrics=ProvisionMetrics(CollectorRegistry()),
            ),
            clock=FakeClock(),
        )
        limiter = controller.claim_queue.rate_limiter
        assert limiter is controller.volume_queue.rate_limiter  # one limiter, as upstream
        assert [limiter.when("uid-1") for _ in delays] == delays
        limiter.forget("uid-1")
        assert limiter.when("uid-1") == 15
        assert controller.component.startswith("example.com/foo_")
        assert not controller.ready()
        assert controller.healthy()


async def test_provisioner_name_is_required() -> None:
    async with ApiClient() as api:
        with pytest.raises(ValueError, match="provisioner_name"):
            ProvisionController(api, "", _NullProvisioner(), ProvisionControllerOptions())


def test_options_convert_in_synchronous_code_too() -> None:
    """The models are built on first access; in a fresh process with no event loop running
    (a provisioner's synchronous unit test), the first conversion must work as well."""
    import subprocess
    import sys

    code = (
        "from pyprovlib._provisioner import ProvisionOptions\n"
        "o = ProvisionOptions({'metadata': {'name': 'sc'}, 'provisioner': 'p'}, 'pvc-1',\n"
        "    {'metadata': {'name': 'c', 'namespace': 'ns'}, 'spec': {}})\n"
        "print(o.storage_class.provisioner, o.pvc.metadata.namespace)\n"
    )
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["p", "ns"]

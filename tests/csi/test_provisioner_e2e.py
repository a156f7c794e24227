"""CSIProvisioner end to end: the API server (in memory with its PV binder, or the real cluster of
PYPROVLIB_E2E_KUBECONFIG), a ProvisionController, and the Python CSI driver on a unix socket."""

from __future__ import annotations

import pathlib

import pytest
from csi_driver import Fault
from csi_e2e import (
    create_claim,
    create_class,
    create_secret,
    csi_env,
    delete_claim,
    failed_then_bound,
    get_claim,
    get_volume,
    wait_bound,
    wait_event,
    wait_until,
    wait_volume_gone,
)
from grpclib.const import Status

from pyprovlib.csi._proto.csi import v1
from pyprovlib.csi.provisioner import CSIProvisionerOptions
from pyprovlib.csi.provisioner._controller import PROVISIONER_ID_KEY
from pyprovlib.csi.provisioner._secrets import (
    ANN_DELETION_SECRET_NAME,
    ANN_DELETION_SECRET_NAMESPACE,
)
from pyprovlib.kube._resources import EVENTS, PERSISTENT_VOLUMES
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.testing._cluster import TestCluster

pytestmark = pytest.mark.e2e


def secret_params(kind: str, name: str, namespace: str) -> dict[str, str]:
    return {
        f"csi.storage.k8s.io/{kind}-secret-name": name,
        f"csi.storage.k8s.io/{kind}-secret-namespace": namespace,
    }


@pytest.mark.parametrize("shared_informers", [False, True], ids=["rest", "informers"])
async def test_claim_bound_to_a_csi_volume_and_deleted_with_secrets(
    kube_cluster: TestCluster, sock_dir: pathlib.Path, shared_informers: bool
) -> None:
    async with csi_env(kube_cluster, sock_dir, shared_informers=shared_informers) as env:
        ns = kube_cluster.namespace
        await create_secret(env, "prov-creds", {"user": "admin", "password": "pa55"})
        class_name = await create_class(
            env,
            parameters={
                "type": "fast",
                "csi.storage.k8s.io/fstype": "xfs",
                **secret_params("provisioner", "prov-creds", "${pvc.namespace}"),
                **secret_params("node-stage", "${pvc.name}-stage", ns),
                **secret_params("controller-publish", "publish", ns),
                **secret_params("node-publish", "${pvc.annotations['team']}-publish", ns),
                **secret_params("controller-expand", "expand", ns),
                **secret_params("node-expand", "nexpand", ns),
            },
            mountOptions=["noatime"],
        )
        claim = await create_claim(env, class_name, size="2Gi", annotations={"team": "blue"})
        name = claim["metadata"]["name"]
        uid = claim["metadata"]["uid"]
        bound = await wait_bound(env, name)
        pv_name = bound["spec"]["volumeName"]
        assert pv_name == f"pvc-{uid}"

        [request] = env.driver.requests("CreateVolume")
        assert isinstance(request, v1.CreateVolumeRequest)
        assert request.name == f"pvc-{uid}"
        assert request.parameters == {"type": "fast"}
        assert request.secrets == {"user": "admin", "password": "pa55"}
        assert request.capacity_range is not None
        assert request.capacity_range.required_bytes == 2 * 1024**3
        [cap] = request.volume_capabilities
        assert cap.mount is not None
        assert cap.mount.fs_type == "xfs"
        assert cap.mount.mount_flags == ["noatime"]
        assert cap.access_mode is not None
        assert cap.access_mode.mode is v1.VolumeCapabilityAccessModeMode.SINGLE_NODE_WRITER

        pv = await get_volume(env, pv_name)
        assert pv is not None
        csi = pv["spec"]["csi"]
        assert csi["driver"] == env.name
        assert csi["volumeHandle"] == "vol-1"
        assert csi["fsType"] == "xfs"
        assert csi["volumeAttributes"]["fromDriver"] == "yes"
        assert csi["volumeAttributes"][PROVISIONER_ID_KEY] == env.provisioner.identity
        assert csi["nodeStageSecretRef"] == {"name": f"{name}-stage", "namespace": ns}
        assert csi["controllerPublishSecretRef"] == {"name": "publish", "namespace": ns}
        assert csi["nodePublishSecretRef"] == {"name": "blue-publish", "namespace": ns}
        assert csi["controllerExpandSecretRef"] == {"name": "expand", "namespace": ns}
        assert csi["nodeExpandSecretRef"] == {"name": "nexpand", "namespace": ns}
        assert pv["spec"]["capacity"]["storage"] == "2Gi"
        assert pv["spec"]["mountOptions"] == ["noatime"]
        assert pv["spec"]["volumeMode"] == "Filesystem"
        annotations = pv["metadata"]["annotations"]
        assert annotations[ANN_DELETION_SECRET_NAME] == "prov-creds"
        assert annotations[ANN_DELETION_SECRET_NAMESPACE] == ns

        await delete_claim(env, name)
        await wait_volume_gone(env, pv_name)
        [delete] = env.driver.requests("DeleteVolume")
        assert isinstance(delete, v1.DeleteVolumeRequest)
        assert delete.volume_id == "vol-1"
        assert delete.secrets == {"user": "admin", "password": "pa55"}
        assert env.driver.volumes == {}


async def test_block_claim_gets_a_block_capability(
    kube_cluster: TestCluster, sock_dir: pathlib.Path
) -> None:
    async with csi_env(kube_cluster, sock_dir) as env:
        class_name = await create_class(env, parameters={"csi.storage.k8s.io/fstype": "ext4"})
        claim = await create_claim(
            env, class_name, volumeMode="Block", accessModes=["ReadWriteMany"]
        )
        bound = await wait_bound(env, claim["metadata"]["name"])
        [request] = env.driver.requests("CreateVolume")
        assert isinstance(request, v1.CreateVolumeRequest)
        [cap] = request.volume_capabilities
        assert cap.block is not None
        assert cap.mount is None
        assert cap.access_mode is not None
        assert cap.access_mode.mode is v1.VolumeCapabilityAccessModeMode.MULTI_NODE_MULTI_WRITER
        pv = await get_volume(env, bound["spec"]["volumeName"])
        assert pv is not None
        assert pv["spec"]["volumeMode"] == "Block"
        assert "fsType" not in pv["spec"]["csi"]


async def test_missing_secret_is_reported_then_provisioned_once_created(
    kube_cluster: TestCluster, sock_dir: pathlib.Path
) -> None:
    async with csi_env(kube_cluster, sock_dir) as env:
        class_name = await create_class(
            env,
            parameters=secret_params("provisioner", "${pvc.name}-creds", kube_cluster.namespace),
        )
        claim = await create_claim(env, class_name)
        name = claim["metadata"]["name"]
        await wait_event(env, name, "ProvisioningFailed", f"error getting secret {name}-creds")
        assert env.driver.requests("CreateVolume") == []
        await create_secret(env, f"{name}-creds", {"token": "t"})
        await wait_bound(env, name)
        [request] = env.driver.requests("CreateVolume")
        assert isinstance(request, v1.CreateVolumeRequest)
        assert request.secrets == {"token": "t"}


@pytest.mark.parametrize(
    ("name_template", "expected"),
    [
        ("${pvc.unknown}", "invalid tokens"),
        ("${pvc.name", "malformed template"),
        ("Bad_Name", "not a valid secret name"),
        ("${pvc.annotations['x']}", "invalid tokens"),
        ("${pvc.name}_x", "resolved to"),
    ],
)
async def test_malformed_secret_template_is_a_clear_event(
    kube_cluster: TestCluster, sock_dir: pathlib.Path, name_template: str, expected: str
) -> None:
    async with csi_env(kube_cluster, sock_dir) as env:
        class_name = await create_class(
            env,
            parameters=secret_params("provisioner", name_template, kube_cluster.namespace),
        )
        claim = await create_claim(env, class_name)
        name = claim["metadata"]["name"]
        event = await wait_event(env, name, "ProvisioningFailed", expected)
        assert "csi.storage.k8s.io/provisioner-secret-name" in event["message"]
        assert env.driver.requests("CreateVolume") == []
        claim_now = await get_claim(env, name)
        assert claim_now is not None
        assert (claim_now.get("status") or {}).get("phase") == "Pending"


async def test_transient_errors_are_retried_to_one_volume(
    kube_cluster: TestCluster, sock_dir: pathlib.Path
) -> None:
    async with csi_env(kube_cluster, sock_dir, call_timeout=0.3) as env:
        class_name = await create_class(env)
        # A slow call (the client gives up; the driver finishes in the background), then
        # DeadlineExceeded and Unavailable answers: all IN_BACKGROUND, all retried.
        env.driver.fail("CreateVolume", Fault(delay=0.6))
        env.driver.fail("CreateVolume", Fault(status=Status.DEADLINE_EXCEEDED))
        env.driver.fail("CreateVolume", Fault(status=Status.UNAVAILABLE))
        claim = await create_claim(env, class_name)
        name = claim["metadata"]["name"]
        await wait_bound(env, name)
        assert len(env.driver.requests("CreateVolume")) == 4
        assert len(env.driver.volumes) == 1
        await wait_event(env, name, "ProvisioningFailed", "DeadlineExceeded")


async def test_final_error_is_an_event_and_retried(
    kube_cluster: TestCluster, sock_dir: pathlib.Path
) -> None:
    async with csi_env(kube_cluster, sock_dir) as env:
        class_name = await create_class(env)
        fault = Fault(status=Status.FAILED_PRECONDITION, message="pool offline")
        _, event = await failed_then_bound(env, class_name, fault, "pool offline")
        assert "rpc error: code = FailedPrecondition desc = pool offline" in event["message"]
        assert env.provisioner.in_flight == frozenset()


async def test_csi_errors_read_as_upstream_with_secrets_scrubbed(
    kube_cluster: TestCluster, sock_dir: pathlib.Path
) -> None:
    # Issue 18: grpc-go's status error text, as upstream's events carry it (alerts grep it);
    # a driver echoing a secret of the request still does not leak it.
    async with csi_env(kube_cluster, sock_dir) as env:
        ns = kube_cluster.namespace
        await create_secret(env, "creds", {"password": "hunter2-secret"})
        class_name = await create_class(env, parameters=secret_params("provisioner", "creds", ns))
        fault = Fault(status=Status.RESOURCE_EXHAUSTED, message="pool full for hunter2-secret")
        claim, event = await failed_then_bound(env, class_name, fault, "pool full")
        assert event["message"] == (
            f'failed to provision volume with StorageClass "{class_name}": '
            "rpc error: code = ResourceExhausted desc = pool full for ***stripped***"
        )
        name = claim["metadata"]["name"]
        pv_name = f"pvc-{claim['metadata']['uid']}"
        env.driver.fail(
            "DeleteVolume",
            Fault(status=Status.UNAVAILABLE, message="array hunter2-secret offline"),
        )
        await delete_claim(env, name)

        async def failed_delete() -> list[str]:
            # A PersistentVolume's events are in the default namespace.
            events = await ResourceClient(kube_cluster.api_client, EVENTS).list("default")
            return [
                e["message"]
                for e in events["items"]
                if e.get("reason") == "VolumeFailedDelete"
                and (e.get("involvedObject") or {}).get("name") == pv_name
            ]

        messages = await kube_cluster.wait_for(failed_delete, message="VolumeFailedDelete event")
        assert messages == ["rpc error: code = Unavailable desc = array ***stripped*** offline"]
        await wait_volume_gone(env, pv_name)


async def test_invalid_argument_is_retried_slowly(
    kube_cluster: TestCluster, sock_dir: pathlib.Path
) -> None:
    # Upstream: InvalidArgument is final and the claim waits out retry_interval_max (or a
    # replaced StorageClass) before the next attempt.
    async with csi_env(kube_cluster, sock_dir, retry_interval_max=1.0) as env:
        class_name = await create_class(env)
        fault = Fault(status=Status.INVALID_ARGUMENT, message="unsupported type")
        _, event = await failed_then_bound(env, class_name, fault, "infeasible")
        assert "rpc error: code = InvalidArgument desc = unsupported type" in event["message"]
        assert len(env.driver.requests("CreateVolume")) == 2
        # The one retry came no earlier than retry_interval_max after the refused call (a
        # count read after the event would depend on how fast the test got there).
        first, retry = env.driver.create_started
        assert retry - first >= 1.0


async def test_undersized_volume_is_deleted_and_reported(
    kube_cluster: TestCluster, sock_dir: pathlib.Path
) -> None:
    async with csi_env(kube_cluster, sock_dir) as env:
        class_name = await create_class(env)
        env.driver.undersize_by = 1
        claim = await create_claim(env, class_name, size="10Mi")
        name = claim["metadata"]["name"]
        await wait_event(env, name, "ProvisioningFailed", "less than requested capacity")
        await wait_until(
            env, lambda: env.driver.requests("DeleteVolume"), "undersized volume deleted"
        )
        deleted = env.driver.requests("DeleteVolume")[0]
        assert isinstance(deleted, v1.DeleteVolumeRequest)
        assert deleted.volume_id == "vol-1"
        env.driver.undersize_by = 0
        bound = await wait_bound(env, name)
        pv = await get_volume(env, bound["spec"]["volumeName"])
        assert pv is not None
        assert pv["spec"]["capacity"]["storage"] == "10Mi"
        assert len(env.driver.volumes) == 1


async def test_provisioner_options_shape_the_request(
    kube_cluster: TestCluster, sock_dir: pathlib.Path
) -> None:
    options = CSIProvisionerOptions(
        volume_name_prefix="csi",
        volume_name_uuid_length=8,
        default_fstype="ext4",
        extra_create_metadata=True,
    )
    async with csi_env(kube_cluster, sock_dir, options=options) as env:
        class_name = await create_class(env, parameters={"tier": "gold"})
        claim = await create_claim(env, class_name)
        name = claim["metadata"]["name"]
        uid = claim["metadata"]["uid"]
        bound = await wait_bound(env, name)
        [request] = env.driver.requests("CreateVolume")
        assert isinstance(request, v1.CreateVolumeRequest)
        assert request.name == "csi-" + uid.replace("-", "")[:8]
        assert request.parameters == {
            "tier": "gold",
            "csi.storage.k8s.io/pvc/name": name,
            "csi.storage.k8s.io/pvc/namespace": kube_cluster.namespace,
            "csi.storage.k8s.io/pv/name": f"pvc-{uid}",
        }
        [cap] = request.volume_capabilities
        assert cap.mount is not None
        assert cap.mount.fs_type == "ext4"
        pv = await get_volume(env, bound["spec"]["volumeName"])
        assert pv is not None
        assert pv["spec"]["csi"]["fsType"] == "ext4"


async def test_unknown_reserved_parameter_is_reported(
    kube_cluster: TestCluster, sock_dir: pathlib.Path
) -> None:
    async with csi_env(kube_cluster, sock_dir) as env:
        class_name = await create_class(env, parameters={"csi.storage.k8s.io/bogus": "x"})
        claim = await create_claim(env, class_name)
        await wait_event(
            env, claim["metadata"]["name"], "ProvisioningFailed", "csi.storage.k8s.io/bogus"
        )
        assert env.driver.requests("CreateVolume") == []


async def test_delete_falls_back_to_the_class_secret(
    kube_cluster: TestCluster, sock_dir: pathlib.Path
) -> None:
    # PVs provisioned before the deletion-secret annotations existed: the class names the
    # secret (only ${pv.name} can be resolved without the claim).
    async with csi_env(kube_cluster, sock_dir) as env:
        ns = kube_cluster.namespace
        class_name = await create_class(
            env, parameters=secret_params("provisioner", "${pv.name}", ns)
        )
        claim = await create_claim(env, class_name)
        name = claim["metadata"]["name"]
        pv_name = f"pvc-{claim['metadata']['uid']}"
        await create_secret(env, pv_name, {"key": "from-class"})
        await wait_bound(env, name)
        volumes = ResourceClient(kube_cluster.api_client, PERSISTENT_VOLUMES)
        await volumes.patch(
            pv_name,
            {
                "metadata": {
                    "annotations": {
                        ANN_DELETION_SECRET_NAME: None,
                        ANN_DELETION_SECRET_NAMESPACE: None,
                    }
                }
            },
        )
        await delete_claim(env, name)
        await wait_volume_gone(env, pv_name)
        [delete] = env.driver.requests("DeleteVolume")
        assert isinstance(delete, v1.DeleteVolumeRequest)
        assert delete.secrets == {"key": "from-class"}

"""Helper-pod mode of the hostpath example: the test plays the kubelet.

:class:`FakeKubelet` watches for helper pods on the in-memory API server, runs each pod's argv
for real (coreutils, no shell) with ``/data`` mapped to the pod's hostPath — a temporary
directory standing for the node's basePath — and reports the result through the pods/status
subresource, as a kubelet would. It can also fail pods or leave them pending.
"""

from __future__ import annotations

import asyncio
import contextlib
import stat
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from example_support import claim_model, create_claim, create_class
from example_support import running as running_controller
from hostpath_support import DEDICATED, create_node, hostpath_class, local_volume, provision_options
from kubernetes_asyncio.client import (
    ApiClient,
    CoreV1Api,
    V1Taint,
)
from kubernetes_asyncio.client.exceptions import ApiException
from task_support import background

from pyprovlib._provisioner import ProvisioningError, ProvisioningState, ProvisionOptions
from pyprovlib.examples._paths import UnsafePathError
from pyprovlib.examples.hostpath import HostPathProvisioner
from pyprovlib.examples.hostpath._helper_pod import (
    HELPER_MOUNT_PATH,
    LABEL_MANAGED_BY,
    HelperPodDirectories,
    helper_command,
    helper_pod_name,
)
from pyprovlib.examples.hostpath._provisioner import (
    ANNOTATION_NODE,
    ANNOTATION_ON_DELETE,
    ANNOTATION_SELECTED_NODE,
    NodeInfo,
)
from pyprovlib.testing._cluster import TestCluster

NAMESPACE = "default"
NODE = "worker-1"
HOSTNAME = "worker-1-host"


class FakeKubelet:
    """Runs helper pods found in ``namespace`` on the local machine; see the module doc."""

    def __init__(self, client: ApiClient, namespace: str, sandbox: Path) -> None:
        self.core = CoreV1Api(client)
        self.api_client = client
        self.namespace = namespace
        self.sandbox = sandbox.resolve()
        self.fail_next = 0
        self.hold = False
        self.ran: list[tuple[str, list[str]]] = []
        self._seen: set[str] = set()

    async def run(self) -> None:
        while True:
            pods = await self.core.list_namespaced_pod(
                self.namespace, label_selector=f"{LABEL_MANAGED_BY}=pyprovlib-hostpath"
            )
            for pod in pods.items:
                uid = pod.metadata.uid
                if uid in self._seen or self.hold or pod.metadata.deletion_timestamp:
                    continue
                self._seen.add(uid)
                await self._execute(pod)
            await asyncio.sleep(0.02)

    async def _execute(self, pod: Any) -> None:
        (container,) = pod.spec.containers
        (volume,) = pod.spec.volumes
        assert volume.host_path.type == "DirectoryOrCreate"
        host_dir = Path(volume.host_path.path)
        # The hostPath must be a directory the test owns: never touch anything else.
        assert await asyncio.to_thread(_inside, host_dir, self.sandbox), host_dir
        # hostPath type DirectoryOrCreate
        await asyncio.to_thread(host_dir.mkdir, parents=True, exist_ok=True)
        argv = [
            str(host_dir) + a[len(HELPER_MOUNT_PATH) :]
            if a == HELPER_MOUNT_PATH or a.startswith(HELPER_MOUNT_PATH + "/")
            else a
            for a in container.command
        ]
        self.ran.append((pod.metadata.name, list(container.command)))
        if self.fail_next:
            self.fail_next -= 1
            code = 1
        else:
            proc = await asyncio.create_subprocess_exec(*argv)
            code = await proc.wait()
        # A patch, not a replace with the listed resourceVersion: on a real control plane
        # other components touch the pod meanwhile (409 Conflict).
        status = {
            "phase": "Succeeded" if code == 0 else "Failed",
            "containerStatuses": [
                {
                    "name": container.name,
                    "image": container.image,
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "state": {
                        "terminated": {
                            "exitCode": code,
                            "reason": "Completed" if code == 0 else "Error",
                        }
                    },
                }
            ],
        }
        await self.core.patch_namespaced_pod_status(
            pod.metadata.name, self.namespace, {"status": status}
        )


def _inside(path: Path, root: Path) -> bool:
    return path.resolve().is_relative_to(root)


def listing(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir())


@contextlib.asynccontextmanager
async def kubelet_running(kubelet: FakeKubelet) -> AsyncIterator[FakeKubelet]:
    async with background(kubelet.run()):
        yield kubelet


async def pods(client: ApiClient, namespace: str = NAMESPACE) -> list[str]:
    items = (await CoreV1Api(client).list_namespaced_pod(namespace)).items
    return sorted(p.metadata.name for p in items)


async def create_worker(client: ApiClient) -> None:
    await create_node(
        client, NODE, HOSTNAME, [DEDICATED, V1Taint(key="maintenance", effect="NoExecute")]
    )


def options(base: Path, pv: str = "pvc-0001") -> ProvisionOptions:
    selected = {ANNOTATION_SELECTED_NODE: NODE}
    pvc = claim_model("data", None, "1Gi", namespace=NAMESPACE, annotations=selected)
    return provision_options(hostpath_class({"basePath": str(base)}), pvc, pv)


def helper(client: ApiClient, timeout: float = 10.0) -> HelperPodDirectories:
    return HelperPodDirectories(client, NAMESPACE, timeout=timeout, poll_interval=0.02)


def test_pod_names_are_deterministic_and_short() -> None:
    assert helper_pod_name("create", "pv1") == "pyprovlib-hostpath-create-pv1"
    long_a = "pvc-0b6e1b7c-4f0d-4b59-9d7e-1d7b3bbf2a10"
    long_b = "pvc-0b6e1b7c-4f0d-4b59-9d7e-1d7b3bbf2a11"
    a, b = helper_pod_name("create", long_a), helper_pod_name("create", long_b)
    assert a == helper_pod_name("create", long_a)
    assert a != b
    assert len(a) <= 63
    assert a.startswith("pyprovlib-hostpath-create-pvc-")
    dotted = helper_pod_name("delete", "my.volume")
    assert "." not in dotted
    assert dotted != helper_pod_name("delete", "my-volume")


@pytest.mark.parametrize("name", ["../x", "a b", "A", "x;rm", "*", ""])
def test_helper_command_refuses_odd_names(name: str) -> None:
    with pytest.raises(UnsafePathError):
        helper_command("create", name)


def test_helper_commands_are_argv_lists() -> None:
    assert helper_command("create", "pv1", 0o770) == ["mkdir", "-m", "0770", "-p", "/data/pv1"]
    assert helper_command("delete", "pv1") == ["rm", "-rf", "/data/pv1"]
    archive = helper_command("archive", "pv1")
    assert archive[0] == "find"
    assert archive[-4:] == ["mv", "/data/pv1", "/data/archived-pv1", ";"]
    assert "sh" not in archive
    assert "-c" not in archive


async def test_pod_shape(kube_client: ApiClient, tmp_path: Path) -> None:
    node = NodeInfo(
        name=NODE,
        hostname=HOSTNAME,
        taints=(DEDICATED,),
    )
    directories = HelperPodDirectories(kube_client, "storage", image="registry.local/busybox:1")
    pod = directories.build_pod("create", node, str(tmp_path), "pvc-1")
    assert pod.metadata.name == "pyprovlib-hostpath-create-pvc-1"
    assert pod.metadata.namespace == "storage"
    spec = pod.spec
    assert spec.restart_policy == "Never"
    assert spec.automount_service_account_token is False
    (term,) = (
        spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution.node_selector_terms
    )
    (req,) = term.match_expressions
    assert (req.key, req.operator, req.values) == ("kubernetes.io/hostname", "In", [HOSTNAME])
    (tol,) = spec.tolerations
    assert (tol.key, tol.operator, tol.effect) == ("dedicated", "Exists", "NoSchedule")
    (container,) = spec.containers
    assert container.image == "registry.local/busybox:1"
    assert container.command == ["mkdir", "-m", "0777", "-p", "/data/pvc-1"]
    assert container.volume_mounts[0].mount_path == "/data"
    assert spec.volumes[0].host_path.path == str(tmp_path)
    assert spec.volumes[0].host_path.type == "DirectoryOrCreate"
    with pytest.raises(UnsafePathError):
        directories.build_pod("create", node, "/", "pvc-1")


async def test_create_and_delete_through_helper_pods(
    kube_client: ApiClient, tmp_path: Path
) -> None:
    await create_worker(kube_client)
    base = tmp_path / "node-disk" / "local"  # DirectoryOrCreate makes it
    prov = HostPathProvisioner(kube_client, helper(kube_client))
    async with kubelet_running(FakeKubelet(kube_client, NAMESPACE, tmp_path)) as kubelet:
        pv = await prov.provision(options(base))
        assert (base / "pvc-0001").is_dir()
        assert stat.S_IMODE((base / "pvc-0001").stat().st_mode) == 0o777
        assert pv.spec.local.path == str(base / "pvc-0001")
        assert pv.metadata.annotations[ANNOTATION_NODE] == NODE
        assert await pods(kube_client) == []  # deleted after success

        (base / "pvc-0001" / "file").write_text("data")
        pv.metadata.annotations[ANNOTATION_ON_DELETE] = "retain"
        pv.spec.storage_class_name = "local"
        await prov.delete(pv)
        assert (base / "archived-pvc-0001" / "file").read_text() == "data"
        assert not (base / "pvc-0001").exists()
        await prov.delete(pv)  # archiving a directory already gone succeeds

        await prov.provision(options(base, "pvc-0002"))
        doomed = local_volume(
            "pvc-0002",
            str(base / "pvc-0002"),
            {ANNOTATION_NODE: NODE, ANNOTATION_ON_DELETE: "delete"},
            storage_class=None,
        )
        await prov.delete(doomed)
        await prov.delete(doomed)  # missing directory: success
        assert listing(base) == ["archived-pvc-0001"]
        assert [argv[0] for _, argv in kubelet.ran] == [
            "mkdir",
            "find",
            "find",
            "mkdir",
            "rm",
            "rm",
        ]
    assert await pods(kube_client) == []


async def test_failed_pod_is_an_error_and_retried_fresh(
    kube_client: ApiClient, tmp_path: Path
) -> None:
    await create_worker(kube_client)
    prov = HostPathProvisioner(kube_client, helper(kube_client))
    async with kubelet_running(FakeKubelet(kube_client, NAMESPACE, tmp_path)) as kubelet:
        kubelet.fail_next = 1
        with pytest.raises(ProvisioningError, match="failed") as info:
            await prov.provision(options(tmp_path))
        assert info.value.state is ProvisioningState.FINISHED
        assert "exit code 1" in str(info.value)
        assert "pyprovlib-hostpath-create-pvc-0001" in str(info.value)
        assert not (tmp_path / "pvc-0001").exists()
        assert await pods(kube_client) == []
        await prov.provision(options(tmp_path))
        assert (tmp_path / "pvc-0001").is_dir()
        assert len(kubelet.ran) == 2


async def test_timeout_leaves_pod_for_the_retry(kube_client: ApiClient, tmp_path: Path) -> None:
    await create_worker(kube_client)
    prov = HostPathProvisioner(kube_client, helper(kube_client, timeout=0.3))
    kubelet = FakeKubelet(kube_client, NAMESPACE, tmp_path)
    kubelet.hold = True
    async with kubelet_running(kubelet):
        with pytest.raises(ProvisioningError, match="did not finish within") as info:
            await prov.provision(options(tmp_path))
        assert info.value.state is ProvisioningState.IN_BACKGROUND
        assert "busybox:1.36" in str(info.value)
        assert await pods(kube_client) == ["pyprovlib-hostpath-create-pvc-0001"]
        first_uid = (
            await CoreV1Api(kube_client).read_namespaced_pod(
                "pyprovlib-hostpath-create-pvc-0001", NAMESPACE
            )
        ).metadata.uid
        kubelet.hold = False
        prov.directories = helper(kube_client, timeout=10)
        await prov.provision(options(tmp_path))
    assert (tmp_path / "pvc-0001").is_dir()
    # The retry waited on the pod already launched instead of starting a second one.
    assert len(kubelet.ran) == 1
    assert kubelet._seen == {first_uid}


async def test_stale_pod_with_other_work_is_replaced(
    kube_client: ApiClient, tmp_path: Path
) -> None:
    await create_worker(kube_client)
    directories = helper(kube_client)
    node = NodeInfo(name=NODE, hostname=HOSTNAME)
    stale = directories.build_pod("create", node, str(tmp_path), "pvc-0001")
    stale.spec.containers[0].command = ["mkdir", "-p", "/data/something-else"]
    await CoreV1Api(kube_client).create_namespaced_pod(NAMESPACE, stale)
    kubelet = FakeKubelet(kube_client, NAMESPACE, tmp_path)
    kubelet.hold = True  # do not run the stale pod before the provisioner sees it
    prov = HostPathProvisioner(kube_client, directories)
    async with kubelet_running(kubelet):
        task = asyncio.create_task(prov.provision(options(tmp_path)))

        async def replaced() -> bool:
            try:
                pod = await CoreV1Api(kube_client).read_namespaced_pod(
                    "pyprovlib-hostpath-create-pvc-0001", NAMESPACE
                )
            except ApiException:
                return False
            return pod.spec.containers[0].command[-1] == "/data/pvc-0001"

        deadline = time.monotonic() + 30
        while not await replaced():
            assert time.monotonic() < deadline, "the stale helper pod was never replaced"
            await asyncio.sleep(0.01)
        kubelet.hold = False
        await task
    assert [argv for _, argv in kubelet.ran] == [["mkdir", "-m", "0777", "-p", "/data/pvc-0001"]]
    assert listing(tmp_path) == ["pvc-0001"]


# -- end to end: helper-pod mode under the real ProvisionController -------------------------


@pytest.mark.e2e
async def test_helper_pod_mode_end_to_end(kube_cluster: TestCluster, tmp_path: Path) -> None:
    # The test plays the kubelet for the helper pods (FakeKubelet), on the in-memory server
    # and on a kubelet-less real control plane alike.
    c = kube_cluster
    client = c.api_client
    core = CoreV1Api(client)
    base = tmp_path / "node-disk"
    name = c.unique_name("pyprovlib.io/hostpath-helper")
    sc = await create_class(
        c,
        "hostpath-helper",
        name,
        parameters={"basePath": str(base)},
        volume_binding_mode="WaitForFirstConsumer",
    )
    await create_claim(c, claim_model("data", sc, "1Gi"))
    prov = HostPathProvisioner(
        client, HelperPodDirectories(client, c.namespace, poll_interval=0.02)
    )
    kubelet = FakeKubelet(client, c.namespace, tmp_path)
    kubelet.fail_next = 1  # the first helper pod fails: the controller must retry
    async with kubelet_running(kubelet), running_controller(client, name, prov):
        await c.create_consumer_pod("data")

        async def bound() -> Any:
            pvc = await core.read_namespaced_persistent_volume_claim("data", c.namespace)
            return pvc.spec.volume_name if pvc.status.phase == "Bound" else None

        pv_name = await c.wait_for(bound, timeout=30, message="claim Bound")

        async def failed_event() -> bool:
            events = (await core.list_namespaced_event(c.namespace)).items
            return any(
                e.reason == "ProvisioningFailed" and "helper pod" in (e.message or "")
                for e in events
            )

        await c.wait_for(failed_event, message="ProvisioningFailed event for the failed pod")
        assert (base / pv_name).is_dir()
        assert [argv[0] for _, argv in kubelet.ran] == ["mkdir", "mkdir"]
        (base / pv_name / "file").write_text("x")

        for pod in (await core.list_namespaced_pod(c.namespace)).items:
            if pod.metadata.name.startswith("consumer"):
                # No kubelet confirms a graceful delete on a kubelet-less control plane.
                await core.delete_namespaced_pod(
                    pod.metadata.name, c.namespace, grace_period_seconds=0
                )
        await core.delete_namespaced_persistent_volume_claim("data", c.namespace)

        async def pv_gone() -> bool:
            try:
                await core.read_persistent_volume(pv_name)
            except ApiException as err:
                return err.status == 404
            return False

        await c.wait_for(pv_gone, timeout=30, message="PV deleted")
        assert not (base / pv_name).exists()
        assert kubelet.ran[-1][1] == ["rm", "-rf", f"/data/{pv_name}"]

        async def helpers_gone() -> bool:
            return not [p for p in await pods(client, c.namespace) if p.startswith("pyprovlib-")]

        await c.wait_for(helpers_gone, message="helper pods deleted")

"""The ResizeController end to end through the API server (``kube_cluster``: in memory, or a
real cluster with ``PYPROVLIB_E2E_KUBECONFIG``) with an in-Python Resizer backend.

external-resizer scenarios (controller_test.go, expand_and_recover_test.go): expansion without
and with node expansion, the claim's allocatedResources/allocatedResourceStatuses along the
way, events with upstream's reasons, failures as ControllerResizeError conditions and
VolumeResizeFailed events retried with backoff, infeasible requests marked
ControllerResizeInfeasible, recovery by lowering the request, class without
allowVolumeExpansion, volumes of other backends, a shrink attempt, leader election.
"""

from __future__ import annotations

import asyncio

import pytest
from kubernetes_asyncio.client.exceptions import ApiException
from resize_support import (
    GI,
    BinderlessCluster,
    MemoryResizer,
    Scenario,
    capacity,
    conditions,
    controller,
    status,
)
from sidecar_support import fast_leader_election, leading, running, wait_for

from pyprovlib._attacher import GrpcCode
from pyprovlib._resizer import NotExpandable, ResizeError
from pyprovlib.controller._resize import (
    ANN_NODE_EXPANSION_NOT_REQUIRED,
    LeaderElectionLostError,
    ResizeController,
)
from pyprovlib.controller._resize.options import lease_name
from pyprovlib.kube._objects import annotations_of
from pyprovlib.kube._resources import LEASES
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.testing._cluster import TestCluster


def allocated(claim: dict[str, object]) -> str | None:
    return (status(claim).get("allocatedResources") or {}).get("storage")


def resize_status(claim: dict[str, object]) -> str | None:
    return (status(claim).get("allocatedResourceStatuses") or {}).get("storage")


async def test_expand_without_node_expansion(kube_cluster: TestCluster) -> None:
    s = Scenario(kube_cluster)
    claim, pv, handle = await s.bound_claim()
    resizer = MemoryResizer(s.driver)
    async with running(controller(kube_cluster, resizer)) as ctrl:
        done = await s.expand(claim, "2Gi")
        assert resizer.calls == [(handle, 2 * GI)]
        assert (await s.get_pv(pv))["spec"]["capacity"]["storage"] == "2Gi"
        # Finished: no resize condition left, the size recorded as allocated, no status.
        assert not {"Resizing", "FileSystemResizePending"} & set(conditions(done))
        assert allocated(done) == "2Gi"
        assert resize_status(done) is None
        if kube_cluster.is_real:
            assert annotations_of(done).get(ANN_NODE_EXPANSION_NOT_REQUIRED) == "true"
        await s.wait_event(claim, "VolumeResizeSuccessful")
        reasons = await s.reasons(claim)
        assert reasons.index("Resizing") < reasons.index("VolumeResizeSuccessful")
        assert "VolumeResizeFailed" not in reasons
        # Nothing more to do: no second call.
        await s.settled(ctrl, claim)
        assert len(resizer.calls) == 1


async def test_expand_with_node_expansion_pending(kube_cluster: TestCluster) -> None:
    s = Scenario(kube_cluster)
    claim, pv, handle = await s.bound_claim()
    resizer = MemoryResizer(s.driver, node_expansion_required=True)
    async with running(controller(kube_cluster, resizer)) as ctrl:
        await s.request(claim, "3Gi")
        pending = await s.wait_claim(
            claim, lambda c: "FileSystemResizePending" in conditions(c), "FileSystemResizePending"
        )
        assert resize_status(pending) == "NodeResizePending"
        assert allocated(pending) == "3Gi"
        assert conditions(pending)["FileSystemResizePending"]["status"] == "True"
        assert (await s.get_pv(pv))["spec"]["capacity"]["storage"] == "3Gi"
        await s.wait_event(claim, "FileSystemResizeRequired")
        await s.settled(ctrl, claim)
        # The claim's capacity is kubelet's to update once the node has expanded; neither the
        # resizer nor the PV controller (the binder, in memory) may copy the PV's size over.
        assert capacity(await s.get_claim(claim)) == "1Gi"
        assert resizer.calls == [(handle, 3 * GI)]
        assert "VolumeResizeSuccessful" not in await s.reasons(claim)


async def test_node_expansion_leaves_capacity_to_kubelet() -> None:
    async with BinderlessCluster() as cluster:
        s = Scenario(cluster)
        claim, pv, handle = await s.bound_claim(bind=True)
        resizer = MemoryResizer(s.driver, node_expansion_required=True)
        async with running(controller(cluster, resizer)) as ctrl:
            await s.request(claim, "3Gi")
            pending = await s.wait_claim(
                claim, lambda c: resize_status(c) == "NodeResizePending", "NodeResizePending"
            )
            assert capacity(pending) == "1Gi"
            assert (await s.get_pv(pv))["spec"]["capacity"]["storage"] == "3Gi"
            # A spurious update (kubelet touching the claim) does not expand again.
            await s.pvcs.patch(
                claim, {"metadata": {"labels": {"touched": "yes"}}}, namespace=s.namespace
            )
            await s.settled(ctrl, claim)
            assert resizer.calls == [(handle, 3 * GI)]
            # kubelet finishes: capacity 3Gi, conditions and status cleared.
            c = await s.get_claim(claim)
            c["status"]["capacity"] = {"storage": "3Gi"}
            c["status"]["conditions"] = []
            c["status"].pop("allocatedResourceStatuses")
            await s.pvcs.replace_status(c)
            await s.settled(ctrl, claim)
            assert resizer.calls == [(handle, 3 * GI)]
            # The user asks for more while the node finished: a new expansion.
            await s.request(claim, "4Gi")
            await s.wait_claim(
                claim,
                lambda c: resize_status(c) == "NodeResizePending" and allocated(c) == "4Gi",
                "second expansion pending on the node",
            )
            assert resizer.calls == [(handle, 3 * GI), (handle, 4 * GI)]


async def test_driver_error_is_recorded_and_retried(kube_cluster: TestCluster) -> None:
    s = Scenario(kube_cluster)
    claim, pv, handle = await s.bound_claim()
    resizer = MemoryResizer(s.driver)
    resizer.errors = [
        ResizeError("backend exploded: code 42", code=GrpcCode.INTERNAL),
        ResizeError("backend still busy", code=GrpcCode.UNAVAILABLE),
    ]
    async with running(controller(kube_cluster, resizer)):
        await s.request(claim, "2Gi")
        failed = await s.wait_event(claim, "VolumeResizeFailed")
        assert "backend exploded: code 42" in failed["message"]
        assert failed["type"] == "Warning"
        done = await s.wait_claim(claim, lambda c: capacity(c) == "2Gi", "claim expanded")
        # Two failures, then success: retried with backoff at the same size.
        assert resizer.calls == [(handle, 2 * GI)] * 3
        assert "ControllerResizeError" not in conditions(done)
        assert (await s.get_pv(pv))["spec"]["capacity"]["storage"] == "2Gi"
        await s.wait_event(claim, "VolumeResizeSuccessful")


async def test_final_error_leaves_a_condition(kube_cluster: TestCluster) -> None:
    s = Scenario(kube_cluster)
    claim, _, _ = await s.bound_claim()
    resizer = MemoryResizer(s.driver)
    resizer.gate = asyncio.Event()  # hold the second call until the first error is seen
    resizer.errors = [ResizeError("quota exceeded", code=GrpcCode.INTERNAL)]
    async with running(controller(kube_cluster, resizer)):
        resizer.gate.set()
        resizer.gate = None
        await s.request(claim, "2Gi")
        resizer.errors.append(ResizeError("quota exceeded", code=GrpcCode.INTERNAL))
        c = await s.wait_claim(
            claim, lambda c: "ControllerResizeError" in conditions(c), "ControllerResizeError"
        )
        message = conditions(c)["ControllerResizeError"]["message"]
        assert message.startswith("failed to expand pvc with")
        assert "quota exceeded" in message
        # Not infeasible: the claim stays "in progress" at the size being allocated.
        assert resize_status(c) == "ControllerResizeInProgress"
        assert allocated(c) == "2Gi"
        await s.wait_claim(claim, lambda c: capacity(c) == "2Gi", "claim expanded after retry")


async def test_recovery_by_lowering_the_request(kube_cluster: TestCluster) -> None:
    s = Scenario(kube_cluster)
    claim, pv, handle = await s.bound_claim()
    resizer = MemoryResizer(s.driver)
    # The backend cannot grow past 5Gi: OUT_OF_RANGE is infeasible (final).
    too_big = ResizeError("no space for 10Gi", code=GrpcCode.OUT_OF_RANGE)
    resizer.errors = [too_big] * 100
    async with running(controller(kube_cluster, resizer, retry_interval_max=0.1)):
        await s.request(claim, "10Gi")
        infeasible = await s.wait_claim(
            claim,
            lambda c: resize_status(c) == "ControllerResizeInfeasible",
            "ControllerResizeInfeasible",
        )
        assert allocated(infeasible) == "10Gi"
        assert "no space for 10Gi" in conditions(infeasible)["ControllerResizeError"]["message"]
        assert capacity(infeasible) == "1Gi"
        assert all(call == (handle, 10 * GI) for call in resizer.calls)
        resizer.errors.clear()
        # The user gives up on 10Gi and asks for 3Gi (still more than the 1Gi it has).
        done = await s.expand(claim, "3Gi")
        assert resizer.calls[-1] == (handle, 3 * GI)
        assert allocated(done) == "3Gi"
        assert resize_status(done) is None
        assert "ControllerResizeError" not in conditions(done)
        assert (await s.get_pv(pv))["spec"]["capacity"]["storage"] == "3Gi"


async def test_uncertain_failure_keeps_the_allocated_size(kube_cluster: TestCluster) -> None:
    """After an error that leaves the expansion possibly running (not final), a lowered
    request must not be used: the volume may already be growing to the old size."""
    kube_cluster.require_in_memory("needs a deterministic order of retries")
    s = Scenario(kube_cluster)
    claim, _, handle = await s.bound_claim()
    resizer = MemoryResizer(s.driver)
    resizer.errors = [ResizeError("timed out", code=GrpcCode.DEADLINE_EXCEEDED)] * 3
    async with running(controller(kube_cluster, resizer, retry_interval_start=0.05)):
        await s.request(claim, "8Gi")
        await wait_for(lambda: _async(len(resizer.calls) >= 1), message="first call")
        await s.request(claim, "4Gi")
        await s.wait_claim(claim, lambda c: capacity(c) == "8Gi", "claim at the allocated 8Gi")
        assert set(resizer.calls) == {(handle, 8 * GI)}


async def _async(value: bool) -> bool:
    return value


async def _edit_accepted(s: Scenario, claim: str, size: str) -> bool:
    """Change the claim's request; False when the API server refuses the change."""
    try:
        await s.request(claim, size)
    except ApiException as err:
        if err.status in (403, 422):
            return False
        raise
    return True


async def test_class_without_allow_volume_expansion(kube_cluster: TestCluster) -> None:
    s = Scenario(kube_cluster)
    sc = await s.storage_class(allow_expansion=None)
    claim, pv, _ = await s.bound_claim(sc)
    resizer = MemoryResizer(s.driver)
    async with running(controller(kube_cluster, resizer)) as ctrl:
        if not await _edit_accepted(s, claim, "2Gi"):
            # A real API server's admission (PersistentVolumeClaimResize) refuses it outright.
            assert kube_cluster.is_real
            return
        event = await s.wait_event(claim, "VolumeResizeFailed")
        assert "allowVolumeExpansion" in event["message"]
        assert sc in event["message"]
        await s.settled(ctrl, claim)
        assert resizer.calls == []
        c = await s.get_claim(claim)
        assert capacity(c) == "1Gi"
        assert allocated(c) is None
        assert (await s.get_pv(pv))["spec"]["capacity"]["storage"] == "1Gi"


async def test_volume_of_another_backend_is_left_alone(kube_cluster: TestCluster) -> None:
    s = Scenario(kube_cluster)
    other = f"{s.name('other')}.test.pyprovlib.io"
    sc_other = await s.storage_class(provisioner=other)
    sc_ours = await s.storage_class()
    foreign, _, _ = await s.bound_claim(sc_other, driver=other)
    # A class naming our resizer, but a volume the backend refuses: the user is told.
    refused, _, _ = await s.bound_claim(sc_ours, driver=other)
    resizer = MemoryResizer(s.driver)
    async with running(controller(kube_cluster, resizer)) as ctrl:
        await s.request(foreign, "2Gi")
        await s.request(refused, "2Gi")
        event = await s.wait_event(refused, "VolumeResizeFailed")
        assert "does not support expanding it" in event["message"]
        await s.settled(ctrl, foreign, refused)
        assert resizer.calls == []
        for name in (foreign, refused):
            assert capacity(await s.get_claim(name)) == "1Gi"
            assert allocated(await s.get_claim(name)) is None
        assert not [r for r in await s.reasons(foreign) if r.startswith("VolumeResize")]


async def test_shrink_attempt_is_rejected(kube_cluster: TestCluster) -> None:
    s = Scenario(kube_cluster)
    claim, pv, _ = await s.bound_claim(size="2Gi")
    resizer = MemoryResizer(s.driver)
    async with running(controller(kube_cluster, resizer)) as ctrl:
        if not await _edit_accepted(s, claim, "1Gi"):
            # A real API server refuses a request below the claim's capacity.
            assert kube_cluster.is_real
        await s.settled(ctrl, claim)
        assert resizer.calls == []
        c = await s.get_claim(claim)
        assert capacity(c) == "2Gi"
        assert not conditions(c)
        assert (await s.get_pv(pv))["spec"]["capacity"]["storage"] == "2Gi"
        assert not [r for r in await s.reasons(claim) if r in ("Resizing", "VolumeResizeFailed")]


async def test_in_use_error_waits_for_the_pod_to_go(kube_cluster: TestCluster) -> None:
    kube_cluster.require_in_memory("creates a pod that is never scheduled")
    s = Scenario(kube_cluster)
    claim, _, handle = await s.bound_claim()
    pod = s.name("pod")
    await s.pods.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": pod, "namespace": s.namespace},
            "spec": {
                "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
                "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": claim}}],
            },
        }
    )
    resizer = MemoryResizer(s.driver)
    resizer.errors = [ResizeError("volume is in use", code=GrpcCode.FAILED_PRECONDITION)]
    async with running(controller(kube_cluster, resizer)):
        await s.request(claim, "2Gi")
        event = await wait_for(lambda: _offline_event(s, claim), message="offline expansion event")
        assert "only supports offline expansion" in event
        assert resizer.calls == [(handle, 2 * GI)]  # not called again while the pod exists
        await s.pods.delete(pod, s.namespace)
        await s.wait_claim(claim, lambda c: capacity(c) == "2Gi", "expanded once unused")
        assert resizer.calls == [(handle, 2 * GI)] * 2


async def _offline_event(s: Scenario, claim: str) -> str | None:
    for event in await s.events(claim):
        if "offline expansion" in str(event.get("message")):
            return str(event["message"])
    return None


async def test_leader_election_uses_external_resizer_lease(kube_cluster: TestCluster) -> None:
    s = Scenario(kube_cluster)
    claim, _, _ = await s.bound_claim()
    resizer = MemoryResizer(s.driver)
    ctrl = controller(
        kube_cluster,
        resizer,
        leader_election=True,
        leader_election_namespace=s.namespace,
        lease_duration=2.0,
        renew_deadline=1.5,
        retry_period=0.2,
    )
    async with running(ctrl):
        leases = ResourceClient(kube_cluster.api_client, LEASES)
        lease = await leases.get(lease_name(s.driver), s.namespace)
        assert lease["spec"]["holderIdentity"] == ctrl.id
        assert lease_name(s.driver).startswith("external-resizer-")
        await s.expand(claim, "2Gi")


async def test_losing_the_lease_fails_the_controller(kube_cluster: TestCluster) -> None:
    kube_cluster.require_in_memory("takes the Lease away behind the controller's back")
    s = Scenario(kube_cluster)
    ctrl = controller(kube_cluster, MemoryResizer(s.driver), **fast_leader_election(s.namespace))
    async with leading(ctrl) as task:
        leases = ResourceClient(kube_cluster.api_client, LEASES)
        name = lease_name(s.driver)
        # A merge patch, not get-then-replace: the controller renews every 0.1 s, and a
        # replace carrying the read resourceVersion would race that renewal (409).
        await leases.patch(
            name,
            {"spec": {"holderIdentity": "someone-else", "leaseDurationSeconds": 3600}},
            namespace=s.namespace,
        )
        with pytest.raises(LeaderElectionLostError):
            async with asyncio.timeout(10):
                await task
        assert not ctrl.healthy()


def test_resizer_without_name_is_refused(kube_cluster: TestCluster) -> None:
    with pytest.raises(ValueError, match="name"):
        ResizeController(kube_cluster.api_client, MemoryResizer(""))


async def test_not_expandable_backend_explains_itself(kube_cluster: TestCluster) -> None:
    """hostpath-like: the class names the backend, the backend cannot grow volumes."""
    s = Scenario(kube_cluster)
    claim, _, _ = await s.bound_claim()
    backend = NotExpandable(s.driver, "hostpath volumes are directories without a size")
    async with running(controller(kube_cluster, backend)):
        await s.request(claim, "2Gi")
        event = await s.wait_event(claim, "VolumeResizeFailed")
        assert "hostpath volumes are directories without a size" in event["message"]
        assert event["type"] == "Warning"
        c = await s.get_claim(claim)
        assert capacity(c) == "1Gi"
        assert allocated(c) is None


async def test_infeasible_size_is_retried_slowly(kube_cluster: TestCluster) -> None:
    kube_cluster.require_in_memory("counts retries over time")
    s = Scenario(kube_cluster)
    claim, _, _ = await s.bound_claim()
    resizer = MemoryResizer(s.driver)
    resizer.errors = [ResizeError("too big", code=GrpcCode.OUT_OF_RANGE)] * 100
    # Backoff starts at 10ms, but an infeasible size waits for retry_interval_max (2s).
    async with running(controller(kube_cluster, resizer, retry_interval_max=2.0)) as ctrl:
        await s.request(claim, "10Gi")
        await s.wait_claim(
            claim, lambda c: resize_status(c) == "ControllerResizeInfeasible", "infeasible"
        )
        await s.settled(ctrl, claim)  # the retry waits out its delay; it does not count
        assert len(resizer.calls) == 1
        await wait_for(lambda: _async(len(resizer.calls) >= 2), 10, "slow retry")


async def test_slow_backend_times_out_and_is_retried(kube_cluster: TestCluster) -> None:
    s = Scenario(kube_cluster)
    claim, _, handle = await s.bound_claim()
    resizer = MemoryResizer(s.driver)
    resizer.gate = asyncio.Event()
    async with running(controller(kube_cluster, resizer, timeout=0.2)):
        await s.request(claim, "2Gi")
        event = await s.wait_event(claim, "VolumeResizeFailed")
        assert "timed out" in event["message"]
        # Not final: no error condition, the claim stays in progress at the same size.
        c = await s.get_claim(claim)
        assert "ControllerResizeError" not in conditions(c)
        assert resize_status(c) == "ControllerResizeInProgress"
        resizer.gate.set()
        await s.wait_claim(claim, lambda c: capacity(c) == "2Gi", "expanded after the timeout")
        assert set(resizer.calls) == {(handle, 2 * GI)}


async def test_claim_is_marked_resizing_while_expanding(kube_cluster: TestCluster) -> None:
    s = Scenario(kube_cluster)
    claim, _, _ = await s.bound_claim()
    resizer = MemoryResizer(s.driver)
    resizer.gate = asyncio.Event()
    async with running(controller(kube_cluster, resizer)):
        await s.request(claim, "5Gi")
        c = await s.wait_claim(claim, lambda c: "Resizing" in conditions(c), "Resizing")
        assert conditions(c)["Resizing"]["status"] == "True"
        assert resize_status(c) == "ControllerResizeInProgress"
        assert allocated(c) == "5Gi"
        assert capacity(c) == "1Gi"
        await s.wait_event(claim, "Resizing")
        resizer.gate.set()
        done = await s.wait_claim(claim, lambda c: capacity(c) == "5Gi", "expanded")
        assert "Resizing" not in conditions(done)


async def test_stop_lets_the_expansion_in_flight_finish(kube_cluster: TestCluster) -> None:
    s = Scenario(kube_cluster)
    claim, _, _ = await s.bound_claim()
    resizer = MemoryResizer(s.driver)
    resizer.gate = asyncio.Event()
    ctrl = controller(kube_cluster, resizer)
    task = asyncio.create_task(ctrl.run())
    try:
        await wait_for(lambda: _async(ctrl.ready()), message="ready")
        await s.request(claim, "2Gi")
        await wait_for(lambda: _async(bool(resizer.calls)), message="expansion started")
        assert not ctrl.draining()  # busy, but not stopping
        ctrl.stop()
        # run() has shut the queue down with the expansion still in hand; it must return only
        # once that expansion finished (checked below: completed, and its event written).
        await wait_for(lambda: _async(ctrl.draining()), message="stop waiting for the worker")
        assert not task.done()
        assert not ctrl.ready()
        resizer.gate.set()
        async with asyncio.timeout(10):
            await task
        assert not ctrl.draining()
        assert ctrl.healthy()
        assert capacity(await s.get_claim(claim)) == "2Gi"
        assert "VolumeResizeSuccessful" in await s.reasons(claim)  # events flushed on stop
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

"""The AttachController end to end through the API server (``kube_cluster``: in memory, or a
real cluster with ``PYPROVLIB_E2E_KUBECONFIG``) with an in-Python Attacher backend.

Upstream (csi_handler_test.go, trivial_handler_test.go, controller_test.go) scenarios covered:
attach with finalizers on PV and VA and the node ID annotation, publish context into
attachmentMetadata, attach errors into status.attachError with errorCode, missing CSINode,
PV marked for deletion, inline volumes, controller-publish secrets, readOnly, detach on
deletion with the VA finalizer removed before the status is cleared, detach errors into
status.detachError, the PV finalizer removed once the PV is deleted and unused, VAs of other
attachers ignored, the trivial handler, timeouts (operation possibly in progress), error-only
updates not re-queued, the reconciler (ReconcileVA) and leader election.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest
from attach_support import (
    ListingAttacher,
    MemoryAttacher,
    Scenario,
    fast_options,
    finalizers,
    is_attached,
    status,
)
from sidecar_support import fast_leader_election, leading, running, wait_for

from pyprovlib import testing
from pyprovlib._attacher import AttachError, GrpcCode
from pyprovlib.controller._attach import (
    NODE_ID_ANNOTATION,
    AttachController,
    LeaderElectionLostError,
)
from pyprovlib.controller._attach.options import lease_name
from pyprovlib.kube._clock import FakeClock
from pyprovlib.kube._objects import Obj
from pyprovlib.kube._resources import LEASES
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.testing._cluster import TestCluster


async def test_attach_then_detach_with_finalizers_in_order(sc: Scenario) -> None:
    backend = MemoryAttacher({"devicePath": "/dev/sdb"})
    pv_name, va_name = sc.name("pv"), sc.name("va")
    await sc.objects.secret("publish-creds", {"password": "hunter2-secret", "user": "admin"})
    await sc.objects.pv(
        pv_name,
        "vol-1",
        secret="publish-creds",
        attributes={"pool": "gold"},
        fs_type="xfs",
        access_modes=("ReadWriteOnce",),
    )
    controller = sc.controller(backend)
    async with running(controller):
        await sc.objects.va(va_name, sc.node, pv=pv_name)
        va = await sc.attached_va(va_name)
        assert status(va)["attachmentMetadata"] == {"devicePath": "/dev/sdb"}
        registry = controller.options.registry
        assert registry is not None
        adds = registry.get_sample_value("workqueue_adds_total", {"name": "csi-attacher-va"})
        assert adds is not None
        assert adds >= 1
        assert "attachError" not in status(va)
        assert sc.finalizer in finalizers(va)
        assert va["metadata"]["annotations"][NODE_ID_ANNOTATION] == sc.node_id
        pv = await sc.objects.get_pv(pv_name)
        assert pv is not None
        assert sc.finalizer in finalizers(pv)

        (call,) = [c for c in backend.calls if c.op == "attach"]
        assert call.volume.volume_id == "vol-1"
        assert call.volume.pv_name == pv_name
        assert call.volume.fs_type == "xfs"
        assert call.volume.access_modes == ("ReadWriteOnce",)
        assert call.volume.secrets == {"password": "hunter2-secret", "user": "admin"}
        assert "hunter2" not in repr(call.volume)
        assert call.node.node_id == sc.node_id
        assert call.node.name == sc.node
        assert call.context == {"pool": "gold"}
        assert call.readonly is False
        assert backend.attached == {("vol-1", sc.node_id)}

        await sc.objects.vas.delete(va_name)
        await sc.objects.wait_va_gone(va_name)
        assert backend.attached == set()
        (detach,) = [c for c in backend.calls if c.op == "detach"]
        assert detach.volume.secrets == {"password": "hunter2-secret", "user": "admin"}

        # The PV keeps the finalizer while it lives, and loses it once deleted and unused.
        pv = await sc.objects.get_pv(pv_name)
        assert pv is not None
        assert sc.finalizer in finalizers(pv)
        await sc.objects.pvs.delete(pv_name)
        await sc.objects.wait_pv_gone(pv_name)


async def test_no_finalizer_left_after_detach_fails_several_times(sc: Scenario) -> None:
    backend = MemoryAttacher()
    backend.detach_errors = [
        AttachError("backend busy", code=GrpcCode.INTERNAL),
        AttachError("still busy", code=GrpcCode.UNAVAILABLE),
        RuntimeError("connection reset"),
    ]
    pv_name, va_name = sc.name("pv"), sc.name("va")
    await sc.objects.pv(pv_name, "vol-2")
    async with running(sc.controller(backend)):
        await sc.objects.va(va_name, sc.node, pv=pv_name)
        await sc.attached_va(va_name)
        await sc.objects.pvs.delete(pv_name)  # deleting while attached: the PV must stay
        await sc.objects.vas.delete(va_name)

        va = await sc.objects.wait_error(va_name, "detachError")
        assert sc.finalizer in finalizers(va)
        assert status(va)["detachError"]["message"]
        pv = await sc.objects.get_pv(pv_name)
        assert pv is not None
        assert sc.finalizer in finalizers(pv)

        await sc.objects.wait_va_gone(va_name)
        await sc.objects.wait_pv_gone(pv_name)
        assert backend.count("detach") == 4
        assert backend.attached == set()


async def test_attach_error_recorded_with_code_then_cleared(sc: Scenario) -> None:
    backend = MemoryAttacher()
    backend.attach_errors = [AttachError("no free LUN", code=GrpcCode.FAILED_PRECONDITION)]
    gate = asyncio.Event()
    backend.attach_gate = gate  # the retry waits until the error has been observed
    pv_name, va_name = sc.name("pv"), sc.name("va")
    await sc.objects.pv(pv_name, "vol-3")
    async with running(sc.controller(backend)):
        await sc.objects.va(va_name, sc.node, pv=pv_name)
        va = await sc.objects.wait_error(va_name)
        error = status(va)["attachError"]
        assert error["message"] == "no free LUN"
        assert error["errorCode"] == GrpcCode.FAILED_PRECONDITION
        assert error["time"]
        assert not is_attached(va)
        gate.set()
        va = await sc.attached_va(va_name)
        assert "attachError" not in status(va)


async def test_missing_csinode_is_an_error_before_the_va_finalizer(sc: Scenario) -> None:
    backend = MemoryAttacher()
    pv_name, va_name = sc.name("pv"), sc.name("va")
    other_node = sc.name("node")
    await sc.objects.pv(pv_name, "vol-4")
    async with running(sc.controller(backend)):
        await sc.objects.va(va_name, other_node, pv=pv_name)
        va = await sc.objects.wait_error(va_name)
        assert other_node in status(va)["attachError"]["message"]
        assert "errorCode" not in status(va)["attachError"]
        assert sc.finalizer not in finalizers(va)
        assert backend.count("attach") == 0
        # The node's driver registers: the retry attaches.
        await sc.objects.csinode(other_node, "late-id")
        va = await sc.attached_va(va_name)
        assert backend.attached == {("vol-4", "late-id")}
        # Nothing to detach for a VA without our finalizer... but this one has it now.
        await sc.objects.vas.delete(va_name)
        await sc.objects.wait_va_gone(va_name)
        assert backend.attached == set()


async def test_vas_of_other_attachers_are_ignored(sc: Scenario) -> None:
    backend = MemoryAttacher()
    pv_name, theirs, ours = sc.name("pv"), sc.name("va"), sc.name("va")
    await sc.objects.pv(pv_name, "vol-5")
    async with running(sc.controller(backend)):
        await sc.objects.va(theirs, sc.node, pv=pv_name, attacher=f"other-{sc.driver}")
        await sc.objects.va(ours, sc.node, pv=pv_name)
        await sc.attached_va(ours)
        va = await sc.objects.get_va(theirs)
        assert va is not None
        assert not is_attached(va)
        assert not finalizers(va)
        assert [c.op for c in backend.calls] == ["attach"]
        await sc.objects.vas.delete(theirs)
        await sc.objects.wait_va_gone(theirs)
        await sc.objects.vas.delete(ours)
        await sc.objects.wait_va_gone(ours)


async def test_inline_volume_and_readonly(sc: Scenario) -> None:
    backend = MemoryAttacher()
    va_name = sc.name("va")
    inline = {
        "accessModes": ["ReadOnlyMany"],
        "csi": {
            "driver": sc.driver,
            "volumeHandle": "inline-1",
            "readOnly": True,
            "volumeAttributes": {"k": "v"},
        },
    }
    async with running(sc.controller(backend, default_fs_type="ext4")):
        await sc.objects.va(va_name, sc.node, inline=inline)
        await sc.attached_va(va_name)
        (call,) = backend.calls
        assert call.volume.pv_name is None
        assert call.volume.volume_id == "inline-1"
        assert call.volume.fs_type == "ext4"
        assert call.volume.access_modes == ("ReadOnlyMany",)
        assert call.readonly is True
        assert call.context == {"k": "v"}
        await sc.objects.vas.delete(va_name)
        await sc.objects.wait_va_gone(va_name)


async def test_pv_marked_for_deletion_is_not_attached(sc: Scenario) -> None:
    backend = MemoryAttacher()
    pv_name, va_name = sc.name("pv"), sc.name("va")
    await sc.objects.pv(pv_name, "vol-6", finalizers=["example.com/hold"])
    await sc.objects.pvs.delete(pv_name)
    async with running(sc.controller(backend)):
        await sc.objects.va(va_name, sc.node, pv=pv_name)
        va = await sc.objects.wait_error(va_name)
        assert "marked for deletion" in status(va)["attachError"]["message"]
        assert backend.count("attach") == 0
        await sc.objects.vas.delete(va_name)
        await sc.objects.wait_va_gone(va_name)
    await sc.objects.pvs.patch(pv_name, {"metadata": {"finalizers": None}})
    await sc.objects.wait_pv_gone(pv_name)


async def test_secrets_never_reach_the_status(sc: Scenario) -> None:
    backend = MemoryAttacher()
    backend.attach_errors = [AttachError("login with hunter2-secret refused", code=16)]
    backend.attach_gate = asyncio.Event()
    pv_name, va_name = sc.name("pv"), sc.name("va")
    await sc.objects.secret("creds", {"password": "hunter2-secret"})
    await sc.objects.pv(pv_name, "vol-7", secret="creds")
    async with running(sc.controller(backend)):
        await sc.objects.va(va_name, sc.node, pv=pv_name)
        va = await sc.objects.wait_error(va_name)
        message = status(va)["attachError"]["message"]
        assert "hunter2" not in message
        assert message == "login with *** refused"
        backend.attach_gate.set()
        await sc.attached_va(va_name)
        await sc.objects.vas.delete(va_name)
        await sc.objects.wait_va_gone(va_name)


async def test_missing_secret_is_an_attach_error(sc: Scenario) -> None:
    backend = MemoryAttacher()
    pv_name, va_name = sc.name("pv"), sc.name("va")
    await sc.objects.pv(pv_name, "vol-8", secret="nowhere")
    async with running(sc.controller(backend)):
        await sc.objects.va(va_name, sc.node, pv=pv_name)
        va = await sc.objects.wait_error(va_name)
        assert (
            f'failed to load secret "{sc.cluster.namespace}/nowhere"'
            in (status(va)["attachError"]["message"])
        )
        assert backend.count("attach") == 0
        await sc.objects.secret("nowhere", {"token": "abcd1234"})
        await sc.attached_va(va_name)
        assert backend.calls[0].volume.secrets == {"token": "abcd1234"}
        await sc.objects.vas.delete(va_name)
        await sc.objects.wait_va_gone(va_name)


async def test_timeout_keeps_track_of_a_possibly_running_attach(sc: Scenario) -> None:
    backend = MemoryAttacher()
    backend.attach_gate = asyncio.Event()  # never set: the backend hangs
    pv_name, va_name = sc.name("pv"), sc.name("va")
    await sc.objects.pv(pv_name, "vol-9")
    async with running(sc.controller(backend, timeout=0.2)):
        await sc.objects.va(va_name, sc.node, pv=pv_name)
        va = await sc.objects.wait_error(va_name)
        error = status(va)["attachError"]
        assert error["errorCode"] == GrpcCode.DEADLINE_EXCEEDED
        assert "timed out" in error["message"]
        # The attach may have happened on the backend: the finalizer keeps the VA until a
        # detach confirms it is gone.
        assert sc.finalizer in finalizers(va)
        assert not is_attached(va)
        await sc.objects.vas.delete(va_name)
        await sc.objects.wait_va_gone(va_name)
        assert backend.count("detach") == 1


async def test_trivial_handler_marks_attached_without_finalizers(sc: Scenario) -> None:
    pv_name, va_name = sc.name("pv"), sc.name("va")
    await sc.objects.pv(pv_name, "vol-10")
    controller = sc.controller(None)
    assert controller.trivial
    assert not controller.reconciles
    async with running(controller):
        await sc.objects.va(va_name, sc.node, pv=pv_name)
        va = await sc.attached_va(va_name)
        assert not finalizers(va)
        assert not status(va).get("attachmentMetadata")
        pv = await sc.objects.get_pv(pv_name)
        assert pv is not None
        assert sc.finalizer not in finalizers(pv)
        await sc.objects.vas.delete(va_name)
        await sc.objects.wait_va_gone(va_name)


async def test_reconciler_reattaches_a_volume_the_backend_lost(sc: Scenario) -> None:
    backend = ListingAttacher()
    pv_name, va_name = sc.name("pv"), sc.name("va")
    await sc.objects.pv(pv_name, "vol-11")
    controller = sc.controller(backend, reconcile_sync=3600)
    assert controller.reconciles
    async with running(controller):
        await sc.objects.va(va_name, sc.node, pv=pv_name)
        await sc.attached_va(va_name)
        assert await controller.reconcile() == 0
        backend.attached.clear()  # the backend lost the attachment behind our back
        assert await controller.reconcile() == 1

        async def reattached() -> bool:
            return ("vol-11", sc.node_id) in backend.attached

        await wait_for(reattached, message="re-attached by the reconciler")
        assert backend.count("attach") == 2
        assert await controller.reconcile() == 0
        await sc.objects.vas.delete(va_name)
        await sc.objects.wait_va_gone(va_name)
        assert backend.attached == set()


async def test_reconcile_disabled_by_option(sc: Scenario) -> None:
    assert not sc.controller(ListingAttacher(), reconcile=False).reconciles
    assert not sc.controller(MemoryAttacher()).reconciles
    assert sc.controller(MemoryAttacher(), reconcile=True).reconciles


async def test_leader_election_lease(sc: Scenario) -> None:
    backend = MemoryAttacher()
    pv_name, va_name = sc.name("pv"), sc.name("va")
    await sc.objects.pv(pv_name, "vol-12")
    controller = sc.controller(
        backend,
        leader_election=True,
        leader_election_namespace=sc.cluster.namespace,
        lease_duration=3.0,
        renew_deadline=2.0,
        retry_period=0.5,
    )
    async with running(controller):
        await sc.objects.va(va_name, sc.node, pv=pv_name)
        await sc.attached_va(va_name)
        lease = await ResourceClient(sc.cluster.api_client, LEASES).get(
            lease_name(sc.driver), sc.cluster.namespace
        )
        assert lease["spec"]["holderIdentity"] == controller.id
        await sc.objects.vas.delete(va_name)
        await sc.objects.wait_va_gone(va_name)
    assert controller.healthy()


async def test_error_only_updates_do_not_break_the_backoff(kube_cluster: TestCluster) -> None:
    kube_cluster.require_in_memory("drives the retry backoff with a fake clock")
    sc = Scenario(kube_cluster)
    await sc.setup_node()
    clock = FakeClock()
    backend = MemoryAttacher()
    backend.attach_errors = [AttachError("first failure", code=GrpcCode.INTERNAL)]
    pv_name, va_name = sc.name("pv"), sc.name("va")
    await sc.objects.pv(pv_name, "vol-13")
    controller = AttachController(
        kube_cluster.api_client,
        sc.driver,
        backend,
        fast_options(retry_interval_start=10.0, retry_interval_max=60.0),
        clock=clock,
    )
    async with running(controller):
        await sc.objects.va(va_name, sc.node, pv=pv_name)

        async def error_in_cache() -> Mapping[str, Any] | None:
            va = controller.va_informer.store.get_by_key(va_name)
            return va if va is not None and "attachError" in status(va) else None

        errored = await wait_for(error_in_cache, message="attachError in the informer cache")
        # The error-only update was seen and not queued: the retry waits for its backoff.
        await testing.wait_idle(controller, errored)
        assert len(controller.va_queue) == 0
        assert backend.count("attach") == 1
        assert controller.va_queue.num_requeues(va_name) == 1
        await clock.advance(10.0)
        await sc.attached_va(va_name)
        assert backend.count("attach") == 2
        await sc.objects.vas.delete(va_name)
        await sc.objects.wait_va_gone(va_name)


async def test_losing_the_lease_fails_the_controller(kube_cluster: TestCluster) -> None:
    kube_cluster.require_in_memory("makes Lease renewals fail")
    server = kube_cluster.server
    assert server is not None
    sc = Scenario(kube_cluster)
    controller = sc.controller(MemoryAttacher(), **fast_leader_election(kube_cluster.namespace))
    try:
        async with leading(controller) as task:
            server.faults.fail(500, verb="update", resource="leases", count=None)
            with pytest.raises(LeaderElectionLostError):
                await asyncio.wait_for(task, 10)
            assert not controller.healthy()
            assert not controller.ready()
    finally:
        server.faults.clear()


async def test_many_volumes_no_finalizer_survives_failed_detaches(sc: Scenario) -> None:
    backend = MemoryAttacher()
    backend.detach_errors = [
        AttachError(f"flaky backend #{i}", code=GrpcCode.UNAVAILABLE) for i in range(8)
    ]
    pvs = [sc.name("pv") for _ in range(5)]
    vas = [sc.name("va") for _ in range(5)]
    async with running(sc.controller(backend)):
        for i, (pv_name, va_name) in enumerate(zip(pvs, vas, strict=True)):
            await sc.objects.pv(pv_name, f"vol-many-{i}")
            await sc.objects.va(va_name, sc.node, pv=pv_name)
        for va_name in vas:
            await sc.attached_va(va_name)
        for pv_name, va_name in zip(pvs, vas, strict=True):
            await sc.objects.pvs.delete(pv_name)
            await sc.objects.vas.delete(va_name)
        for va_name in vas:
            await sc.objects.wait_va_gone(va_name)
        for pv_name in pvs:
            await sc.objects.wait_pv_gone(pv_name)
    assert backend.attached == set()
    assert backend.count("detach") == 5 + 8
    leftovers = [
        o["metadata"]["name"]
        for client in (sc.objects.vas, sc.objects.pvs)
        for o in (await client.list())["items"]
        if sc.finalizer in finalizers(o)
    ]
    assert leftovers == []


async def test_detach_uses_the_remembered_node_id_when_csinode_is_gone(sc: Scenario) -> None:
    backend = MemoryAttacher()
    pv_name, va_name = sc.name("pv"), sc.name("va")
    await sc.objects.pv(pv_name, "vol-14")
    controller = sc.controller(backend)
    async with running(controller):
        await sc.objects.va(va_name, sc.node, pv=pv_name)
        await sc.attached_va(va_name)
        # The node (and its CSINode) went away while the volume was attached.
        await sc.objects.csinodes.delete(sc.node)

        async def csinode_gone_from_cache() -> bool:
            return controller.csinode_informer.store.get_by_key(sc.node) is None

        await wait_for(csinode_gone_from_cache, message="CSINode gone from the cache")
        await sc.objects.vas.delete(va_name)
        await sc.objects.wait_va_gone(va_name)
        (detach,) = [c for c in backend.calls if c.op == "detach"]
        assert detach.node.node_id == sc.node_id
        assert backend.attached == set()


async def test_workers_run_a_subclass_sync_va(sc: Scenario) -> None:
    # sync_va/sync_pv are the controller's extension points (as the resize controller's
    # sync_claim): the workers call them, not the sync object behind them.
    seen: list[str] = []

    class Recording(AttachController):
        async def sync_va(self, va: Obj) -> None:
            seen.append(va["metadata"]["name"])
            await super().sync_va(va)

    pv_name, va_name = sc.name("pv"), sc.name("va")
    await sc.objects.pv(pv_name, "vol-sub")
    controller = Recording(sc.cluster.api_client, sc.driver, None, fast_options())
    async with running(controller):
        await sc.objects.va(va_name, sc.node, pv=pv_name)
        await sc.attached_va(va_name)
    assert va_name in seen

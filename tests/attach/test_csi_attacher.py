"""The CSI handler end to end: AttachController + CSIAttacher + a Python CSI driver on a real
unix socket + the API server (``kube_cluster``: in memory, or a real cluster with
``PYPROVLIB_E2E_KUBECONFIG``), and the sidecar (``python -m pyprovlib.csi.attacher``) picking
the CSI or the trivial handler from the driver's capabilities."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from attach_support import Objects, driver_name, fast_options, finalizers, is_attached, status
from csi_attach_driver import ATTACH_CAPS, LIST_CAPS, AttachDriver, Caps, Fault
from grpclib.const import Status
from prometheus_client import CollectorRegistry
from sidecar_support import DriverSidecar, operations_ok, running, wait_for

from pyprovlib._attacher import AttachError, AttachVolume, GrpcCode
from pyprovlib.controller._attach import AttachController
from pyprovlib.controller._attach.options import finalizer_name
from pyprovlib.csi._proto.csi import v1
from pyprovlib.csi.attacher import CSIAttacher
from pyprovlib.csi.attacher._controller import csi_access_mode, volume_capability
from pyprovlib.csi.attacher._main import AttacherSidecar, build
from pyprovlib.csi.attacher._options import parser
from pyprovlib.runtime._flags import parse_common
from pyprovlib.testing._cluster import TestCluster

Mode = v1.VolumeCapabilityAccessModeMode


class CSIScenario(DriverSidecar):
    """A Python CSI driver named uniquely, a node registered for it, object helpers."""

    sidecar_module = "pyprovlib.csi.attacher"

    def __init__(self, cluster: TestCluster, socket: Path, **driver: Any) -> None:
        self.cluster = cluster
        self.name = driver_name(cluster)
        self.driver = AttachDriver(self.name, socket, **driver)
        self.endpoint = self.driver.endpoint
        self.objects = Objects(cluster, self.name)
        self.node = cluster.unique_name("node")
        self.node_id = f"csi-{self.node}"
        self.finalizer = finalizer_name(self.name)
        self.registry = CollectorRegistry()

    def unique(self, prefix: str) -> str:
        return self.cluster.unique_name(prefix)

    @contextlib.asynccontextmanager
    async def attaching(self, **options: Any) -> AsyncIterator[AttachController]:
        """An AttachController over a CSIAttacher on a connection of its own to the driver,
        running with ``fast_options(**options)``; the connection is closed afterwards."""
        async with await self.connect() as conn:
            controller = AttachController(
                self.cluster.api_client, self.name, CSIAttacher(conn), fast_options(**options)
            )
            async with running(controller):
                yield controller


@pytest.fixture
async def csi(kube_cluster: TestCluster, sock_dir: Path) -> AsyncIterator[CSIScenario]:
    scenario = CSIScenario(kube_cluster, sock_dir / "csi.sock")
    await scenario.objects.csinode(scenario.node, scenario.node_id)
    async with scenario.driver:
        yield scenario


async def test_csi_publish_and_unpublish(csi: CSIScenario) -> None:
    pv_name, va_name = csi.unique("pv"), csi.unique("va")
    await csi.objects.secret("creds", {"password": "hunter2-secret"})
    await csi.objects.pv(
        pv_name,
        "vol-a",
        secret="creds",
        read_only=True,
        fs_type="ext4",
        attributes={"pool": "fast"},
    )
    async with csi.attaching() as controller:
        assert isinstance(controller.attacher, CSIAttacher)
        assert controller.attacher.supports_publish_readonly
        assert not controller.attacher.supports_list_published
        await csi.objects.va(va_name, csi.node, pv=pv_name)
        va = await csi.objects.wait_va(va_name, is_attached, "attached")
        assert status(va)["attachmentMetadata"] == {"devicePath": "/dev/disk/vol-a"}
        assert csi.driver.state.is_published("vol-a", csi.node_id)
        (request,) = csi.driver.state.publish_requests
        assert request.volume_id == "vol-a"
        assert request.node_id == csi.node_id
        assert request.readonly is True
        assert request.secrets == {"password": "hunter2-secret"}
        assert request.volume_context == {"pool": "fast"}
        capability = request.volume_capability
        assert capability is not None
        assert capability.mount is not None
        assert capability.mount.fs_type == "ext4"
        assert capability.access_mode is not None
        assert capability.access_mode.mode == Mode.SINGLE_NODE_WRITER

        await csi.objects.vas.delete(va_name)
        await csi.objects.wait_va_gone(va_name)
        assert not csi.driver.state.is_published("vol-a", csi.node_id)
        (unpublish,) = csi.driver.state.unpublish_requests
        assert unpublish.secrets == {"password": "hunter2-secret"}
        await csi.objects.pvs.delete(pv_name)
        await csi.objects.wait_pv_gone(pv_name)
    assert operations_ok(csi.registry, csi.name, "/csi.v1.Controller/ControllerPublishVolume") == 1


async def test_readonly_is_dropped_without_publish_readonly(
    kube_cluster: TestCluster, sock_dir: Path
) -> None:
    csi = CSIScenario(
        kube_cluster, sock_dir / "csi.sock", capabilities=[Caps.PUBLISH_UNPUBLISH_VOLUME]
    )
    await csi.objects.csinode(csi.node, csi.node_id)
    async with csi.driver, await csi.connect() as conn:
        attacher = CSIAttacher(conn)
        assert not attacher.supports_publish_readonly
        pv_name, va_name = csi.unique("pv"), csi.unique("va")
        await csi.objects.pv(pv_name, "vol-ro", read_only=True)
        controller = AttachController(kube_cluster.api_client, csi.name, attacher, fast_options())
        async with running(controller):
            await csi.objects.va(va_name, csi.node, pv=pv_name)
            await csi.objects.wait_va(va_name, is_attached, "attached")
            assert csi.driver.state.publish_requests[0].readonly is False
            await csi.objects.vas.delete(va_name)
            await csi.objects.wait_va_gone(va_name)


async def test_publish_error_goes_to_status_with_its_code(csi: CSIScenario) -> None:
    csi.driver.state.fail(
        "ControllerPublishVolume", Fault(Status.FAILED_PRECONDITION, "no free slot", times=2)
    )
    pv_name, va_name = csi.unique("pv"), csi.unique("va")
    await csi.objects.pv(pv_name, "vol-b")
    async with csi.attaching(retry_interval_start=0.5, retry_interval_max=1.0):
        await csi.objects.va(va_name, csi.node, pv=pv_name)
        va = await csi.objects.wait_error(va_name)
        error = status(va)["attachError"]
        assert error["message"] == "rpc error: code = FailedPrecondition desc = no free slot"
        assert error["errorCode"] == GrpcCode.FAILED_PRECONDITION
        va = await csi.objects.wait_va(va_name, is_attached, "attached after the errors")
        assert "attachError" not in status(va)
        assert len(csi.driver.state.publish_requests) == 3
        await csi.objects.vas.delete(va_name)
        await csi.objects.wait_va_gone(va_name)


async def test_slow_publish_past_the_timeout_keeps_the_finalizer(csi: CSIScenario) -> None:
    # The first publish takes longer than --timeout but completes on the driver.
    csi.driver.state.fail("ControllerPublishVolume", Fault(delay=1.0))
    pv_name, va_name = csi.unique("pv"), csi.unique("va")
    await csi.objects.pv(pv_name, "vol-c")
    async with csi.attaching(timeout=0.3, retry_interval_start=1.0, retry_interval_max=1.0):
        await csi.objects.va(va_name, csi.node, pv=pv_name)
        va = await csi.objects.wait_error(va_name)
        error = status(va)["attachError"]
        assert error["errorCode"] == GrpcCode.DEADLINE_EXCEEDED
        assert csi.finalizer in finalizers(va)
        assert not is_attached(va)
        va = await csi.objects.wait_va(va_name, is_attached, "attached on the retry")
        assert len(csi.driver.state.publish_requests) == 2
        await csi.objects.vas.delete(va_name)
        await csi.objects.wait_va_gone(va_name)
        assert not csi.driver.state.is_published("vol-c", csi.node_id)


async def test_driver_restart_is_survived(csi: CSIScenario) -> None:
    pv_name, va_name = csi.unique("pv"), csi.unique("va")
    await csi.objects.pv(pv_name, "vol-d")
    async with csi.attaching(retry_interval_start=0.2, retry_interval_max=0.5):
        await csi.driver.stop()
        await csi.objects.va(va_name, csi.node, pv=pv_name)
        va = await csi.objects.wait_error(va_name)
        assert status(va)["attachError"]["errorCode"] == GrpcCode.UNAVAILABLE
        assert not is_attached(va)
        await csi.driver.start()
        await csi.objects.wait_va(va_name, is_attached, "attached after the restart")
        assert csi.driver.state.is_published("vol-d", csi.node_id)
        await csi.objects.vas.delete(va_name)
        await csi.objects.wait_va_gone(va_name)


async def test_detach_errors_then_no_finalizer_left(csi: CSIScenario) -> None:
    csi.driver.state.fail("ControllerUnpublishVolume", Fault(Status.INTERNAL, "stuck", times=3))
    pv_name, va_name = csi.unique("pv"), csi.unique("va")
    await csi.objects.pv(pv_name, "vol-e")
    async with csi.attaching():
        await csi.objects.va(va_name, csi.node, pv=pv_name)
        await csi.objects.wait_va(va_name, is_attached, "attached")
        await csi.objects.vas.delete(va_name)
        va = await csi.objects.wait_error(va_name, "detachError")
        assert status(va)["detachError"]["message"] == ("rpc error: code = Internal desc = stuck")
        await csi.objects.wait_va_gone(va_name)
        await csi.objects.pvs.delete(pv_name)
        await csi.objects.wait_pv_gone(pv_name)
        assert len(csi.driver.state.unpublish_requests) == 4


async def test_reconciler_repairs_drift_through_list_volumes(
    kube_cluster: TestCluster, sock_dir: Path
) -> None:
    csi = CSIScenario(kube_cluster, sock_dir / "csi.sock", capabilities=ATTACH_CAPS + LIST_CAPS)
    await csi.objects.csinode(csi.node, csi.node_id)
    async with csi.driver, await csi.connect() as conn:
        attacher = CSIAttacher(conn, max_entries=1)
        assert attacher.supports_list_published
        controller = AttachController(
            kube_cluster.api_client, csi.name, attacher, fast_options(reconcile_sync=3600)
        )
        assert controller.reconciles
        pvs = [csi.unique("pv"), csi.unique("pv")]
        vas = [csi.unique("va"), csi.unique("va")]
        async with running(controller):
            for i, (pv_name, va_name) in enumerate(zip(pvs, vas, strict=True)):
                await csi.objects.pv(pv_name, f"vol-r{i}")
                await csi.objects.va(va_name, csi.node, pv=pv_name)
                await csi.objects.wait_va(va_name, is_attached, "attached")
            listed = len(csi.driver.state.list_requests)
            assert await controller.reconcile() == 0
            # One page per volume with max_entries=1.
            assert len(csi.driver.state.list_requests) - listed == 2
            csi.driver.state.published["vol-r1"].clear()  # lost behind our back
            assert await controller.reconcile() == 1

            async def republished() -> bool:
                return csi.driver.state.is_published("vol-r1", csi.node_id)

            await wait_for(republished, message="re-published by the reconciler")
            assert await controller.reconcile() == 0
            for va_name in vas:
                await csi.objects.vas.delete(va_name)
                await csi.objects.wait_va_gone(va_name)


# -- capabilities → handler, the sidecar ----------------------------------------------------


@pytest.mark.parametrize(
    ("controller_service", "capabilities", "trivial"),
    [
        (True, ATTACH_CAPS, False),
        (True, (Caps.CREATE_DELETE_VOLUME,), True),
        (False, (), True),
    ],
)
async def test_sidecar_picks_the_handler_from_capabilities(
    kube_cluster: TestCluster,
    sock_dir: Path,
    controller_service: bool,
    capabilities: tuple[Caps, ...],
    trivial: bool,
) -> None:
    csi = CSIScenario(
        kube_cluster,
        sock_dir / "csi.sock",
        controller_service=controller_service,
        capabilities=capabilities,
    )
    await csi.objects.csinode(csi.node, csi.node_id)
    pv_name, va_name = csi.unique("pv"), csi.unique("va")
    await csi.objects.pv(pv_name, "vol-s")
    async with csi.driver:
        sidecar = await build(csi.context(parser()))
        assert isinstance(sidecar, AttacherSidecar)
        assert sidecar.controller.trivial is trivial
        assert sidecar.controller.driver_name == csi.name
        async with running(sidecar):
            await csi.objects.va(va_name, csi.node, pv=pv_name)
            va = await csi.objects.wait_va(va_name, is_attached, "attached")
            assert (csi.finalizer in finalizers(va)) is not trivial
            assert bool(csi.driver.state.publish_requests) is not trivial
            await csi.objects.vas.delete(va_name)
            await csi.objects.wait_va_gone(va_name)
        assert sidecar.connection.lost is False


async def test_sidecar_process_attaches_and_stops_on_sigterm(
    csi: CSIScenario, tmp_path: Path
) -> None:
    pv_name, va_name = csi.unique("pv"), csi.unique("va")
    await csi.objects.pv(pv_name, "vol-p")
    async with csi.sidecar(
        tmp_path,
        "--timeout",
        "2s",
        "--retry-interval-start",
        "100ms",
        "--worker-threads",
        "2",
    ) as proc:
        await csi.objects.va(va_name, csi.node, pv=pv_name)
        va = await csi.objects.wait_va(va_name, is_attached, "attached by the sidecar", 30)
        assert status(va)["attachmentMetadata"] == {"devicePath": "/dev/disk/vol-p"}
        await csi.objects.vas.delete(va_name)
        await csi.objects.wait_va_gone(va_name)
        proc.proc.send_signal(signal.SIGTERM)
        assert await proc.exit_code(20) == 0


async def test_sidecar_process_exits_when_the_driver_goes_away(
    csi: CSIScenario, tmp_path: Path
) -> None:
    pv_name, va_name = csi.unique("pv"), csi.unique("va")
    other_pv, other_va = csi.unique("pv"), csi.unique("va")
    await csi.objects.pv(pv_name, "vol-x")
    try:
        async with csi.sidecar(tmp_path) as proc:
            # An attached VA shows the sidecar is connected and working.
            await csi.objects.va(va_name, csi.node, pv=pv_name)
            await csi.objects.wait_va(va_name, is_attached, "attached by the sidecar", 30)
            await csi.driver.stop()
            # The next publish finds the driver gone (an idle connection is noticed by the
            # monitor's periodic probe too, only later).
            await csi.objects.pv(other_pv, "vol-y")
            await csi.objects.va(other_va, csi.node, pv=other_pv)
            # Upstream exits on a lost connection so that the pod restarts it.
            assert await proc.exit_code(30) == 1
    finally:
        # Nobody is left to detach: release the VAs by hand so cleanup can delete them.
        for name in (va_name, other_va):
            if await csi.objects.get_va(name) is not None:
                await csi.objects.vas.patch(name, {"metadata": {"finalizers": None}})


# -- pure pieces ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("modes", "snmw", "expected"),
    [
        (["ReadWriteOnce"], False, Mode.SINGLE_NODE_WRITER),
        (["ReadWriteOnce"], True, Mode.SINGLE_NODE_MULTI_WRITER),
        (["ReadWriteOncePod"], False, Mode.SINGLE_NODE_WRITER),
        (["ReadWriteOncePod"], True, Mode.SINGLE_NODE_SINGLE_WRITER),
        (["ReadOnlyMany"], False, Mode.MULTI_NODE_READER_ONLY),
        (["ReadWriteMany", "ReadOnlyMany"], False, Mode.MULTI_NODE_MULTI_WRITER),
        (["ReadWriteMany", "ReadWriteOnce"], True, Mode.MULTI_NODE_MULTI_WRITER),
    ],
)
def test_csi_access_mode(modes: list[str], snmw: bool, expected: Mode) -> None:
    assert csi_access_mode(modes, snmw) == expected


@pytest.mark.parametrize(
    "modes", [["ReadOnlyMany", "ReadWriteOnce"], ["ReadWriteOncePod", "ReadWriteOnce"], []]
)
def test_csi_access_mode_refuses_impossible_combinations(modes: list[str]) -> None:
    with pytest.raises(AttachError):
        csi_access_mode(modes, False)


def test_volume_capability_block_and_mount() -> None:
    block = volume_capability(
        AttachVolume("v", "d", volume_mode="Block", access_modes=("ReadWriteOnce",)), False
    )
    assert block.block is not None
    assert block.mount is None
    mount = volume_capability(
        AttachVolume(
            "v", "d", fs_type="xfs", mount_options=("noatime",), access_modes=("ReadWriteMany",)
        ),
        False,
    )
    assert mount.mount is not None
    assert mount.mount.fs_type == "xfs"
    assert mount.mount.mount_flags == ["noatime"]
    assert mount.access_mode is not None
    assert mount.access_mode.mode == Mode.MULTI_NODE_MULTI_WRITER


def test_sidecar_flags_and_defaults() -> None:
    options, args = parse_common(parser(), [])
    assert args.csi_address == "/run/csi/socket"
    assert args.resync == 600.0
    assert args.timeout == 15.0
    assert args.retry_interval_start == 1.0
    assert args.retry_interval_max == 300.0
    assert args.reconcile_sync == 60.0
    assert args.default_fstype == ""
    assert args.max_entries == 0
    assert options.workers == 10
    assert options.kube_api_qps == 5.0
    assert options.kube_api_burst == 10
    assert options.leader_election is False
    assert options.leader_election_retry_period == 5.0
    _, args = parse_common(parser(), ["--timeout", "1m30s", "--reconcile-sync=5m"])
    assert args.timeout == 90.0
    assert args.reconcile_sync == 300.0


async def test_impossible_access_modes_fail_before_the_va_finalizer(csi: CSIScenario) -> None:
    pv_name, va_name = csi.unique("pv"), csi.unique("va")
    await csi.objects.pv(pv_name, "vol-m", access_modes=("ReadOnlyMany", "ReadWriteOnce"))
    async with csi.attaching():
        await csi.objects.va(va_name, csi.node, pv=pv_name)
        va = await csi.objects.wait_error(va_name)
        assert status(va)["attachError"]["message"] == (
            "CSI does not support ReadOnlyMany and ReadWriteOnce on the same PersistentVolume"
        )
        assert csi.finalizer not in finalizers(va)
        assert csi.driver.state.publish_requests == []
        await csi.objects.vas.delete(va_name)
        await csi.objects.wait_va_gone(va_name)
        assert csi.driver.state.unpublish_requests == []


async def test_driver_error_quoting_a_secret_is_scrubbed(csi: CSIScenario) -> None:
    csi.driver.state.fail(
        "ControllerPublishVolume",
        Fault(Status.PERMISSION_DENIED, "password hunter2-secret rejected", times=1000),
    )
    pv_name, va_name = csi.unique("pv"), csi.unique("va")
    await csi.objects.secret("creds", {"password": "hunter2-secret"})
    await csi.objects.pv(pv_name, "vol-q", secret="creds")
    async with csi.attaching():
        await csi.objects.va(va_name, csi.node, pv=pv_name)
        va = await csi.objects.wait_error(va_name)
        message = status(va)["attachError"]["message"]
        assert "hunter2" not in message
        assert message.startswith("rpc error: code = PermissionDenied desc = password ")
        csi.driver.state.faults.clear()
        await csi.objects.wait_va(va_name, is_attached, "attached")
        await csi.objects.vas.delete(va_name)
        await csi.objects.wait_va_gone(va_name)

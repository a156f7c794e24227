"""The CSI resizer end to end: ResizeController + CSIResizer + a Python CSI driver on a real
unix socket + the API server (``kube_cluster``: in memory, or a real cluster with
``PYPROVLIB_E2E_KUBECONFIG``), and the sidecar (``python -m pyprovlib.csi.resizer``) picking
the CSI or the trivial resizer from the driver's capabilities."""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from csi_resize_driver import Caps, Fault
from csi_resize_support import CSIScenario, serving
from grpclib.const import Status
from resize_support import GI, capacity, conditions, fast_options
from run_support import run_python
from sidecar_support import operations_ok, running

from pyprovlib.controller._resize import ResizeController
from pyprovlib.csi._proto.csi import v1
from pyprovlib.csi.resizer import CSIResizer, TrivialResizer
from pyprovlib.csi.resizer._controller import DriverCannotExpandError
from pyprovlib.csi.resizer._options import parser
from pyprovlib.runtime._flags import parse_common
from pyprovlib.testing._cluster import TestCluster

SECRET_VALUE = "s3cr3t-expand-key"


@pytest.fixture
async def csi(kube_cluster: TestCluster, sock_dir: Path) -> AsyncIterator[CSIScenario]:
    async with serving(CSIScenario, kube_cluster, sock_dir) as scenario:
        yield scenario


@pytest.fixture
async def resizing(csi: CSIScenario) -> AsyncIterator[CSIScenario]:
    """``csi`` with a ResizeController over a CSIResizer running."""
    async with await csi.connect() as conn:
        resizer = CSIResizer(conn, csi.cluster.api_client)
        assert resizer.name == csi.driver
        controller = ResizeController(csi.cluster.api_client, resizer, fast_options())
        async with running(controller):
            csi.controller = controller
            yield csi


async def test_controller_expand_volume(resizing: CSIScenario) -> None:
    s = resizing
    claim, pv, handle = await s.volume()
    await s.expand(claim, "2Gi")
    (request,) = s.state.requests
    assert request.volume_id == handle
    assert request.capacity_range is not None
    assert request.capacity_range.required_bytes == 2 * GI
    assert request.secrets == {}
    assert request.volume_capability is not None
    assert request.volume_capability.mount is not None
    assert request.volume_capability.access_mode is not None
    assert (
        request.volume_capability.access_mode.mode
        == v1.VolumeCapabilityAccessModeMode.SINGLE_NODE_WRITER
    )
    assert s.state.sizes[handle] == 2 * GI
    assert (await s.get_pv(pv))["spec"]["capacity"]["storage"] == "2Gi"
    await s.wait_event(claim, "VolumeResizeSuccessful")
    # csi-lib-utils' operation metric, labelled with upstream's method name.
    assert operations_ok(s.registry, s.driver, "/csi.v1.Controller/ControllerExpandVolume") == 1


async def test_driver_rounds_up_and_asks_for_node_expansion(resizing: CSIScenario) -> None:
    s = resizing
    s.state.granularity = GI
    s.state.node_expansion_required = True
    claim, pv, _ = await s.volume()
    await s.request(claim, "1536Mi")
    pending = await s.wait_claim(
        claim, lambda c: "FileSystemResizePending" in conditions(c), "node expansion pending"
    )
    # The PV gets the driver's size, the claim's allocation stays what was asked.
    assert (await s.get_pv(pv))["spec"]["capacity"]["storage"] == "2Gi"
    assert pending["status"]["allocatedResources"]["storage"] == "1536Mi"
    assert pending["status"]["allocatedResourceStatuses"]["storage"] == "NodeResizePending"
    await s.wait_event(claim, "FileSystemResizeRequired")


async def test_driver_error_then_success(resizing: CSIScenario) -> None:
    s = resizing
    claim, _, _ = await s.volume()
    s.state.fail(Fault(Status.INTERNAL, "array on fire", times=2))
    await s.request(claim, "2Gi")
    failed = await s.wait_event(claim, "VolumeResizeFailed")
    assert "rpc error: code = Internal desc = array on fire" in failed["message"]
    await s.wait_claim(claim, lambda c: capacity(c) == "2Gi", "claim expanded after retries")
    assert len(s.state.requests) == 3


async def test_infeasible_request_then_recovery(resizing: CSIScenario) -> None:
    s = resizing
    s.state.max_size = 5 * GI
    claim, _, handle = await s.volume()
    await s.request(claim, "10Gi")
    c = await s.wait_claim(
        claim,
        lambda c: (
            (c["status"].get("allocatedResourceStatuses") or {}).get("storage")
            == "ControllerResizeInfeasible"
        ),
        "infeasible",
    )
    assert "code = OutOfRange" in conditions(c)["ControllerResizeError"]["message"]
    done = await s.expand(claim, "4Gi")
    assert s.state.sizes[handle] == 4 * GI
    assert "ControllerResizeError" not in conditions(done)


async def test_controller_expand_secrets_from_the_pv(resizing: CSIScenario) -> None:
    s = resizing
    secret = s.name("expand")
    await s.secret(secret, {"key": SECRET_VALUE})
    sc = await s.storage_class()
    ref = {"controllerExpandSecretRef": {"name": secret, "namespace": s.namespace}}
    claim, _, _ = await s.volume(sc, csi_extra=ref)
    # The driver echoes the secret in its error: it must not reach the claim or its events.
    s.state.fail(Fault(Status.INTERNAL, f"bad credentials {SECRET_VALUE}"))
    done = await s.expand(claim, "2Gi")
    assert all(r.secrets == {"key": SECRET_VALUE} for r in s.state.requests)
    failed = await s.wait_event(claim, "VolumeResizeFailed")
    assert "bad credentials" in failed["message"]
    assert await s.leaks(claim, SECRET_VALUE, done) == []


async def test_controller_expand_secrets_from_class_parameters(resizing: CSIScenario) -> None:
    s = resizing
    secret = s.name("expand")
    await s.secret(secret, {"user": "admin", "key": SECRET_VALUE})
    sc = await s.storage_class(
        parameters={
            "csi.storage.k8s.io/controller-expand-secret-name": secret,
            "csi.storage.k8s.io/controller-expand-secret-namespace": "${pvc.namespace}",
        }
    )
    claim, _, _ = await s.volume(sc)
    await s.expand(claim, "2Gi")
    assert s.state.requests[-1].secrets == {"user": "admin", "key": SECRET_VALUE}


async def test_missing_secret_is_an_error_not_a_call(resizing: CSIScenario) -> None:
    s = resizing
    sc = await s.storage_class()
    ref = {"controllerExpandSecretRef": {"name": "nope", "namespace": s.namespace}}
    claim, _, _ = await s.volume(sc, csi_extra=ref)
    await s.request(claim, "2Gi")
    event = await s.wait_event(claim, "VolumeResizeFailed")
    assert "error getting secret nope" in event["message"]
    assert s.state.requests == []


async def test_volumes_of_other_drivers_are_not_sent(resizing: CSIScenario) -> None:
    s = resizing
    other = f"{s.name('other')}.test.pyprovlib.io"
    sc = await s.storage_class(provisioner=other)
    claim, _, _ = await s.bound_claim(sc, driver=other)
    await s.request(claim, "2Gi")
    await s.settled(s.controller, claim)
    assert s.state.requests == []
    assert capacity(await s.get_claim(claim)) == "1Gi"


# -- the sidecar ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("capabilities", "volume_expansion", "expected"),
    [
        ((Caps.EXPAND_VOLUME,), None, CSIResizer),
        ((), v1.PluginCapabilityVolumeExpansionType.ONLINE, TrivialResizer),
    ],
)
async def test_sidecar_picks_the_resizer_from_capabilities(
    kube_cluster: TestCluster,
    sock_dir: Path,
    capabilities: tuple[Caps, ...],
    volume_expansion: v1.PluginCapabilityVolumeExpansionType | None,
    expected: type,
) -> None:
    driver = {"capabilities": capabilities, "volume_expansion": volume_expansion}
    async with serving(CSIScenario, kube_cluster, sock_dir, **driver) as s:
        sidecar = await s.build_sidecar()
        assert sidecar.resize_controller is not None
        assert isinstance(sidecar.resize_controller.resizer, expected)
        assert sidecar.resize_controller.name == s.driver
        claim, pv, _ = await s.volume()
        async with running(sidecar):
            await s.request(claim, "2Gi")
            c = await s.wait_claim(
                claim,
                lambda c: capacity(c) == "2Gi" or "FileSystemResizePending" in conditions(c),
                "expanded",
            )
            assert (await s.get_pv(pv))["spec"]["capacity"]["storage"] == "2Gi"
            if expected is TrivialResizer:
                # Only bookkeeping in the controller: the node expands.
                assert s.state.requests == []
                assert "FileSystemResizePending" in conditions(c)
            else:
                assert len(s.state.requests) == 1
        assert sidecar.connection.lost is False


async def test_sidecar_refuses_a_driver_that_can_neither_expand_nor_modify(
    kube_cluster: TestCluster, sock_dir: Path
) -> None:
    capabilities = (Caps.CREATE_DELETE_VOLUME,)
    async with serving(CSIScenario, kube_cluster, sock_dir, capabilities=capabilities) as s:
        with pytest.raises(DriverCannotExpandError, match=r"EXPAND_VOLUME.*MODIFY_VOLUME"):
            await s.build_sidecar()


async def test_sidecar_process_expands_and_stops_on_sigterm(
    csi: CSIScenario, tmp_path: Path
) -> None:
    sc = await csi.storage_class()
    claim, _, handle = await csi.volume(sc)
    async with csi.sidecar(
        tmp_path,
        "--timeout",
        "2s",
        "--retry-interval-start",
        "100ms",
        "--workers",
        "2",
        "--http-endpoint",
        "127.0.0.1:0",
    ) as proc:
        port = int((await proc.wait_for("HTTP server listening"))["port"])
        await csi.expand(claim, "3Gi", 30)
        assert csi.state.sizes[handle] == 3 * GI
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/readyz") as resp:
                assert resp.status == 200
            async with http.get(f"http://127.0.0.1:{port}/metrics") as resp:
                metrics = await resp.text()
        assert 'method_name="/csi.v1.Controller/ControllerExpandVolume"' in metrics
        assert f'workqueue_adds_total{{name="{csi.driver}-pvc"}}' in metrics
        proc.proc.send_signal(signal.SIGTERM)
        assert await proc.exit_code(20) == 0


async def test_sidecar_process_refuses_a_driver_that_cannot_expand(
    kube_cluster: TestCluster, sock_dir: Path, tmp_path: Path
) -> None:
    async with (
        serving(CSIScenario, kube_cluster, sock_dir, capabilities=()) as s,
        s.sidecar(tmp_path) as proc,
    ):
        assert await proc.exit_code(30) == 1


async def test_sidecar_process_exits_when_the_driver_goes_away(
    csi: CSIScenario, tmp_path: Path
) -> None:
    sc = await csi.storage_class()
    claim, _, _ = await csi.volume(sc)
    other, _, _ = await csi.volume(sc)
    async with csi.sidecar(tmp_path) as proc:
        await csi.expand(claim, "2Gi", 30)
        await csi.driver_process.__aexit__(None, None, None)
        await csi.request(other, "2Gi")
        # Upstream exits on a lost connection so that the pod restarts it.
        assert await proc.exit_code(30) == 1


def test_sidecar_flags_and_defaults() -> None:
    options, args = parse_common(parser(), [])
    assert args.csi_address == "/run/csi/socket"
    assert args.resync_period == 600.0
    assert args.timeout == 10.0
    assert args.retry_interval_start == 1.0
    assert args.retry_interval_max == 300.0
    assert args.handle_volume_inuse_error is True
    assert options.workers == 10
    assert options.kube_api_qps == 5.0
    assert options.kube_api_burst == 10
    assert options.leader_election is False
    assert options.leader_election_lease_duration == 15.0
    options, args = parse_common(
        parser(), ["--workers", "3", "--timeout", "1m", "--handle-volume-inuse-error=false"]
    )
    assert options.workers == 3
    assert args.timeout == 60.0
    assert args.handle_volume_inuse_error is False


async def test_sidecar_help_lists_external_resizer_flags() -> None:
    code, text, _ = await run_python("-m", "pyprovlib.csi.resizer", "--help", timeout=30)
    assert code == 0
    for flag in (
        "--csi-address",
        "--timeout",
        "--resync-period",
        "--workers",
        "--retry-interval-start",
        "--retry-interval-max",
        "--handle-volume-inuse-error",
        "--leader-election",
        "--leader-election-namespace",
        "--kube-api-qps",
        "--kube-api-burst",
        "--http-endpoint",
        "--metrics-path",
    ):
        assert flag in text, flag


async def test_block_volume_capability(resizing: CSIScenario) -> None:
    s = resizing
    claim, _, _ = await s.volume(volume_mode="Block")
    await s.expand(claim, "2Gi")
    (request,) = s.state.requests
    assert request.volume_capability is not None
    assert request.volume_capability.block is not None
    assert request.volume_capability.mount is None

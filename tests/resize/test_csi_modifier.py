"""The CSI modifier end to end: ModifyController + CSIModifier + a Python CSI driver on a real
unix socket + the API server (``kube_cluster``: in memory, or a real cluster), and the resizer
sidecar (``python -m pyprovlib.csi.resizer``) carrying the modify controller beside the resize
controller, under one Lease, with ``--extra-modify-metadata``."""

from __future__ import annotations

import shutil
import signal
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from csi_resize_driver import EXPAND_CAPS, MODIFY_CAPS, Caps, Fault, ResizeDriver
from grpclib.const import Status
from modify_support import ModifyScenario, condition_types, fast_options, modify_state
from prometheus_client import CollectorRegistry
from resize_support import conditions
from sidecar_support import running, sidecar_context, sidecar_process

from pyprovlib._modifier import NotModifiable
from pyprovlib.controller._modify import (
    PV_NAME_KEY,
    PVC_NAME_KEY,
    PVC_NAMESPACE_KEY,
    ModifyController,
)
from pyprovlib.csi._connection import ConnectionOptions, CSIConnection, CSIMetrics
from pyprovlib.csi._proto.csi import v1
from pyprovlib.csi.resizer import CSIModifier, CSIResizer
from pyprovlib.csi.resizer._controller import DriverCannotExpandError
from pyprovlib.csi.resizer._main import ResizerSidecar, build
from pyprovlib.csi.resizer._modifier import ANN_MODIFY_SECRET_NAME, ANN_MODIFY_SECRET_NAMESPACE
from pyprovlib.csi.resizer._options import parser
from pyprovlib.testing._cluster import TestCluster

pytestmark = pytest.mark.e2e

SECRET_VALUE = "s3cr3t-modify-key"


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    directory = Path(tempfile.mkdtemp(prefix="pm-", dir="/tmp"))
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


class CSIModifyScenario(ModifyScenario):
    """A Python CSI driver named like the scenario's driver, on a unix socket."""

    def __init__(self, cluster: TestCluster, socket: Path, **driver: Any) -> None:
        super().__init__(cluster)
        driver.setdefault("capabilities", MODIFY_CAPS)
        self.driver_process = ResizeDriver(self.driver, socket, **driver)
        self.registry = CollectorRegistry()

    @property
    def state(self) -> Any:
        return self.driver_process.state

    async def connect(self) -> CSIConnection:
        return await CSIConnection.open(
            self.driver_process.endpoint,
            ConnectionOptions(timeout=5.0, exit_on_connection_loss=False),
            metrics=CSIMetrics(self.registry),
        )

    async def volume(self, vac: str | None, **kwargs: Any) -> tuple[str, str, str]:
        claim, pv, handle = await self.claim_with_class(vac, **kwargs)
        self.state.sizes[handle] = 1 << 30
        return claim, pv, handle


@pytest.fixture
async def csi(kube_cluster: TestCluster, sock_dir: Path) -> AsyncIterator[CSIModifyScenario]:
    scenario = CSIModifyScenario(kube_cluster, sock_dir / "csi.sock")
    async with scenario.driver_process:
        yield scenario


@pytest.fixture
async def modifying(csi: CSIModifyScenario) -> AsyncIterator[CSIModifyScenario]:
    """``csi`` with a ModifyController over a CSIModifier running."""
    conn = await csi.connect()
    try:
        modifier = CSIModifier(conn, csi.cluster.api_client)
        assert modifier.name == csi.driver
        async with running(
            ModifyController(csi.cluster.api_client, modifier, fast_options(retry_interval_max=60))
        ):
            yield csi
    finally:
        conn.close()


async def test_controller_modify_volume(modifying: CSIModifyScenario) -> None:
    s = modifying
    gold = await s.vac({"iops": "100"})
    fast = await s.vac({"iops": "500", "throughput": "80"})
    claim, pv, handle = await s.volume(gold)
    await s.set_class(claim, fast)
    await s.wait_state(claim, (None, None, fast))
    (request,) = s.state.modify_requests
    assert request.volume_id == handle
    assert request.mutable_parameters == {"iops": "500", "throughput": "80"}
    assert request.secrets == {}
    assert s.state.mutable[handle] == {"iops": "500", "throughput": "80"}
    assert await s.pv_class(pv) == fast
    assert (
        s.registry.get_sample_value(
            "csi_sidecar_operations_seconds_count",
            {
                "driver_name": s.driver,
                "method_name": "/csi.v1.Controller/ControllerModifyVolume",
                "grpc_status_code": "OK",
            },
        )
        == 1.0
    )


async def test_parameters_the_driver_refuses_are_infeasible(modifying: CSIModifyScenario) -> None:
    s = modifying
    gold = await s.vac({"iops": "100"})
    bad = await s.vac({"colour": "blue"})
    claim, _, handle = await s.volume(gold)
    await s.set_class(claim, bad)
    failed = await s.wait_state(claim, ("Infeasible", bad, gold))
    error = conditions(failed)["ModifyVolumeError"]
    assert (error["reason"], error["message"]) == (
        "InvalidArgument",
        "invalid parameters: ['colour']",
    )
    event = await s.wait_event(claim, "VolumeModifyFailed")
    assert event["message"] == (
        "rpc error: code = InvalidArgument desc = invalid parameters: ['colour']"
    )
    assert handle not in s.state.mutable


async def test_a_transient_error_is_retried_to_one_success(modifying: CSIModifyScenario) -> None:
    s = modifying
    gold = await s.vac({"iops": "100"})
    claim, _, handle = await s.volume(None)
    s.state.fail(Fault(Status.UNAVAILABLE, "driver restarting", times=2))
    await s.set_class(claim, gold)
    done = await s.wait_state(claim, (None, None, gold))
    assert [r.mutable_parameters for r in s.state.modify_requests] == [{"iops": "100"}] * 3
    assert condition_types(done) == []
    failed = await s.wait_event(claim, "VolumeModifyFailed")
    assert failed["message"] == (
        f"rpc error: code = Unavailable desc = driver restarting. Still modifying to VAC {gold}"
    )
    assert s.state.mutable[handle] == {"iops": "100"}


async def test_controller_modify_secrets(modifying: CSIModifyScenario) -> None:
    """The Secret the provisioner recorded in the PV's annotations (else the controller-expand
    one); a driver echoing it never puts it into the claim or its events."""
    s = modifying
    modify_secret, expand_secret = s.name("modify"), s.name("expand")
    await s.secret(modify_secret, {"key": SECRET_VALUE})
    await s.secret(expand_secret, {"expand": "x"})
    gold = await s.vac({"iops": "100"})
    annotations = {ANN_MODIFY_SECRET_NAME: modify_secret, ANN_MODIFY_SECRET_NAMESPACE: s.namespace}
    expand_ref = {"controllerExpandSecretRef": {"name": expand_secret, "namespace": s.namespace}}
    claim, _, _ = await s.volume(None, annotations=annotations, csi_extra=expand_ref)
    other, _, _ = await s.volume(None, csi_extra=expand_ref)
    s.state.fail(Fault(Status.INTERNAL, f"bad credentials {SECRET_VALUE}"))
    await s.set_class(claim, gold)
    done = await s.wait_state(claim, (None, None, gold))
    await s.set_class(other, gold)
    await s.wait_state(other, (None, None, gold))
    first, second, third = s.state.modify_requests
    assert first.secrets == second.secrets == {"key": SECRET_VALUE}
    assert third.secrets == {"expand": "x"}
    failed = await s.wait_event(claim, "VolumeModifyFailed")
    assert "bad credentials ***" in failed["message"]
    texts = [str(e.get("message")) for e in await s.events(claim)] + [str(done)]
    assert not [t for t in texts if SECRET_VALUE in t]


async def test_a_missing_secret_is_reported_not_sent(modifying: CSIModifyScenario) -> None:
    s = modifying
    gold = await s.vac({"iops": "100"})
    annotations = {ANN_MODIFY_SECRET_NAME: "nope", ANN_MODIFY_SECRET_NAMESPACE: s.namespace}
    claim, _, _ = await s.volume(None, annotations=annotations)
    await s.set_class(claim, gold)
    event = await s.wait_event(claim, "VolumeModifyFailed")
    assert "error getting secret nope" in event["message"]
    assert s.state.modify_requests == []
    # InProgress while it waits: nothing says the driver will not accept it once it can ask.
    assert modify_state(await s.get_claim(claim))[:2] == ("InProgress", gold)


# -- the sidecar ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("capabilities", "volume_expansion", "resizer", "modifier"),
    [
        (MODIFY_CAPS, None, CSIResizer, CSIModifier),
        (EXPAND_CAPS, None, CSIResizer, NotModifiable),
        ((Caps.MODIFY_VOLUME,), None, None, CSIModifier),
        ((Caps.CREATE_DELETE_VOLUME,), None, None, None),
    ],
)
async def test_sidecar_builds_the_controllers_the_driver_calls_for(
    kube_cluster: TestCluster,
    sock_dir: Path,
    capabilities: tuple[Caps, ...],
    volume_expansion: v1.PluginCapabilityVolumeExpansionType | None,
    resizer: type | None,
    modifier: type | None,
) -> None:
    s = CSIModifyScenario(
        kube_cluster,
        sock_dir / "csi.sock",
        capabilities=capabilities,
        volume_expansion=volume_expansion,
    )
    async with s.driver_process:
        argv = [
            "--csi-address",
            s.driver_process.endpoint,
            "--retry-interval-start",
            "50ms",
            "--timeout",
            "7s",
        ]
        if modifier is None:
            with pytest.raises(DriverCannotExpandError, match="MODIFY_VOLUME"):
                await build(sidecar_context(parser(), argv, kube_cluster.api_client))
            return
        sidecar = await build(sidecar_context(parser(), argv, kube_cluster.api_client))
        try:
            assert isinstance(sidecar, ResizerSidecar)
            rc, mc = sidecar.resize_controller, sidecar.modify_controller
            assert (type(rc.resizer) if rc is not None else None) is resizer
            assert mc is not None
            assert type(mc.modifier) is modifier
            # --timeout bounds each call of the backends that call the driver.
            if isinstance(mc.modifier, CSIModifier):
                assert mc.modifier.timeout == 7.0
            if rc is not None and isinstance(rc.resizer, CSIResizer):
                assert rc.resizer.timeout == 7.0
            # One Lease, the resizer's, for both (as upstream).
            assert sidecar.controller.lease == f"external-resizer-{s.driver.replace('.', '-')}"
        finally:
            sidecar.connection.close()


async def test_sidecar_process_modifies_with_extra_metadata(
    csi: CSIModifyScenario, tmp_path: Path
) -> None:
    gold = await csi.vac({"iops": "100"})
    claim, pv, handle = await csi.volume(None)
    # A driver of --extra-modify-metadata takes the metadata keys.
    csi.state.mutable_keys = frozenset({"iops", PVC_NAME_KEY, PVC_NAMESPACE_KEY, PV_NAME_KEY})
    async with sidecar_process(
        "pyprovlib.csi.resizer",
        csi.cluster,
        tmp_path,
        "--csi-address",
        csi.driver_process.endpoint,
        "--extra-modify-metadata",
        "--retry-interval-start",
        "100ms",
        "--http-endpoint",
        "127.0.0.1:0",
    ) as proc:
        port = int((await proc.wait_for("HTTP server listening"))["port"])
        await csi.set_class(claim, gold)
        await csi.wait_state(claim, (None, None, gold), timeout=30)
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://127.0.0.1:{port}/metrics") as resp,
        ):
            metrics = await resp.text()
        assert 'method_name="/csi.v1.Controller/ControllerModifyVolume"' in metrics
        proc.proc.send_signal(signal.SIGTERM)
        assert await proc.exit_code(20) == 0
    (request,) = csi.state.modify_requests
    assert request.mutable_parameters == {
        "iops": "100",
        PVC_NAME_KEY: claim,
        PVC_NAMESPACE_KEY: csi.namespace,
        PV_NAME_KEY: pv,
    }
    assert await csi.pv_class(pv) == gold
    assert handle in csi.state.mutable

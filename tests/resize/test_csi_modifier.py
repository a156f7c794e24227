"""The CSI modifier end to end: ModifyController + CSIModifier + a Python CSI driver on a real
unix socket + the API server (``kube_cluster``: in memory, or a real cluster), and the resizer
sidecar (``python -m pyprovlib.csi.resizer``) carrying the modify controller beside the resize
controller, under one Lease, with ``--extra-modify-metadata``."""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from csi_resize_driver import EXPAND_CAPS, MODIFY_CAPS, Caps, Fault
from csi_resize_support import CSIModifyScenario, serving
from grpclib.const import Status
from modify_support import condition_types, fast_options, modify_state
from resize_support import conditions
from sidecar_support import operations_ok, running

from pyprovlib._modifier import NotModifiable
from pyprovlib.controller._modify import (
    PV_NAME_KEY,
    PVC_NAME_KEY,
    PVC_NAMESPACE_KEY,
    ModifyController,
)
from pyprovlib.csi.resizer import CSIModifier, CSIResizer
from pyprovlib.csi.resizer._modifier import ANN_MODIFY_SECRET_NAME, ANN_MODIFY_SECRET_NAMESPACE
from pyprovlib.testing._cluster import TestCluster

pytestmark = pytest.mark.e2e

SECRET_VALUE = "s3cr3t-modify-key"


@pytest.fixture
async def modifying(kube_cluster: TestCluster, sock_dir: Path) -> AsyncIterator[CSIModifyScenario]:
    """A driver serving, and a ModifyController over a CSIModifier on it running."""
    async with (
        serving(CSIModifyScenario, kube_cluster, sock_dir) as s,
        await s.connect() as conn,
    ):
        modifier = CSIModifier(conn, kube_cluster.api_client)
        assert modifier.name == s.driver
        options = fast_options(retry_interval_max=60)
        async with running(ModifyController(kube_cluster.api_client, modifier, options)):
            yield s


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
    assert operations_ok(s.registry, s.driver, "/csi.v1.Controller/ControllerModifyVolume") == 1


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
    assert await s.leaks(claim, SECRET_VALUE, done) == []


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
    ("capabilities", "resizer", "modifier"),
    [
        (MODIFY_CAPS, CSIResizer, CSIModifier),
        (EXPAND_CAPS, CSIResizer, NotModifiable),
        ((Caps.MODIFY_VOLUME,), None, CSIModifier),
    ],
)
async def test_sidecar_builds_the_controllers_the_driver_calls_for(
    kube_cluster: TestCluster,
    sock_dir: Path,
    capabilities: tuple[Caps, ...],
    resizer: type | None,
    modifier: type,
) -> None:
    """(A driver that can neither expand nor modify is refused: test_csi_resizer.)"""
    async with serving(CSIModifyScenario, kube_cluster, sock_dir, capabilities=capabilities) as s:
        sidecar = await s.build_sidecar("--timeout", "7s")
        try:
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
    kube_cluster: TestCluster, sock_dir: Path, tmp_path: Path
) -> None:
    async with serving(CSIModifyScenario, kube_cluster, sock_dir) as csi:
        gold = await csi.vac({"iops": "100"})
        claim, pv, handle = await csi.volume(None)
        # A driver of --extra-modify-metadata takes the metadata keys.
        csi.state.mutable_keys = frozenset({"iops", PVC_NAME_KEY, PVC_NAMESPACE_KEY, PV_NAME_KEY})
        async with csi.sidecar(
            tmp_path,
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

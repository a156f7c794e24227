"""``python -m pyprovlib.csi.provisioner`` as a real process against the in-memory API server and
the Python CSI driver: flags, start-up waits, provisioning, connection loss, signals, and the
cloning-protection controller it (and ``python -m pyprovlib.csi``) runs beside its workers."""

from __future__ import annotations

import asyncio
import pathlib
import signal
from contextlib import AbstractAsyncContextManager

import aiohttp
import pytest
from csi_driver import DriverState, Fault, serve_driver
from process_support import (
    DEADLINE,
    create_claim,
    create_class,
    entry_point,
    until,
    wait_claim_bound,
)
from run_support import run_python

from pyprovlib import testing
from pyprovlib.csi.provisioner._data_source import CLONE_FINALIZER
from pyprovlib.csi.provisioner._options import build_parser
from pyprovlib.kube._objects import Obj
from pyprovlib.testing._server import ApiServer

Sidecar = testing.ChildProcess  # the sidecar process; its JSON log lines are collected


def sidecar(kubeconfig: pathlib.Path, *args: str) -> AbstractAsyncContextManager[Sidecar]:
    return entry_point("pyprovlib.csi.provisioner", kubeconfig, *args)


async def provision_one(server: ApiServer, process: Sidecar) -> Obj:
    """The claim ``data`` of the test driver's class ``csi``, once the sidecar bound it."""
    async with server.api_client() as api:
        await create_class(api)
        claims = await create_claim(api, "data")
        return await wait_claim_bound(claims, "data", process)


def test_flags_have_external_provisioner_names_and_defaults() -> None:
    args = build_parser().parse_args([])
    assert args.csi_address == "/run/csi/socket"
    assert args.volume_name_prefix == "pvc"
    assert args.volume_name_uuid_length == -1
    assert args.timeout == 10.0
    assert args.worker_threads == 100
    assert args.retry_interval_start == 1.0
    assert args.retry_interval_max == 300.0
    assert args.extra_create_metadata is False
    assert args.default_fstype == ""
    assert args.leader_election is False
    assert args.exit_on_connection_loss is True
    # Not upstream's: protects claims deleted mid-creation (issue 486); on unless turned off.
    assert args.provisioning_finalizer is True
    parsed = build_parser().parse_args(["--timeout", "2m", "--volume-name-uuid-length", "8"])
    assert parsed.timeout == 120.0
    assert parsed.volume_name_uuid_length == 8
    assert (
        build_parser().parse_args(["--provisioning-finalizer=false"]).provisioning_finalizer
        is False
    )


def test_controller_options_are_external_provisioners() -> None:
    """external-provisioner builds its ProvisionController with FailedProvisionThreshold(0),
    FailedDeleteThreshold(0) and CreateProvisionedPVLimiter(DefaultControllerRateLimiter()),
    and a 5 s leader election retry period."""
    from pyprovlib.csi.provisioner._options import controller_options
    from pyprovlib.runtime import CommonOptions, RuntimeContext

    args = build_parser().parse_args(["--leader-election"])
    ctx = RuntimeContext(CommonOptions.from_namespace(args), args, None, None)  # type: ignore[arg-type]
    options = controller_options(ctx)
    assert options.failed_provision_threshold == 0
    assert options.failed_delete_threshold == 0
    assert options.create_provisioned_pv_limiter is not None
    assert options.workers == 100
    assert options.leader_election is True
    assert options.retry_period == 5.0


async def test_waits_for_a_late_socket_provisions_and_exits_on_connection_loss(
    server: ApiServer, kubeconfig: pathlib.Path, sock_dir: pathlib.Path
) -> None:
    socket = sock_dir / "csi.sock"
    async with sidecar(
        kubeconfig, "--csi-address", f"unix://{socket}", "--http-endpoint", "127.0.0.1:0"
    ) as proc:
        # No socket yet: the sidecar says so and keeps waiting, no crash loop.
        await proc.wait_for("waiting for the CSI socket to appear")
        assert proc.proc.returncode is None
        state = DriverState(ready=False)
        async with serve_driver(sock_dir, state=state):
            await proc.wait_for("CSI driver is not ready", times=2)
            assert proc.proc.returncode is None
            state.ready = True
            await proc.wait_for("CSI driver identified")
            # The runtime serves HTTP once the controller is built (after the driver
            # answered), as upstream starts its endpoint after connecting.
            port = int((await proc.wait_for("HTTP server listening"))["port"])
            claim = await provision_one(server, proc)
            assert claim["spec"]["volumeName"] == f"pvc-{claim['metadata']['uid']}"
            assert len(state.volumes) == 1
            async with aiohttp.ClientSession() as http:
                async with http.get(f"http://127.0.0.1:{port}/metrics") as response:
                    metrics = await response.text()
                async with http.get(f"http://127.0.0.1:{port}/healthz") as response:
                    assert response.status == 200
            assert (
                'csi_sidecar_operations_seconds_count{driver_name="test.csi.pyprovlib.io",'
                'grpc_status_code="OK",method_name="/csi.v1.Controller/CreateVolume"} 1.0'
            ) in metrics
            assert "controller_persistentvolumeclaim_provision_total" in metrics
        # The driver went away. As upstream, the idle sidecar does not probe: the next
        # call finds the connection lost, and the sidecar exits so that the container is
        # restarted.
        async with server.api_client() as api:
            await create_claim(api, "after-loss")
        code = await proc.exit_code()
        assert code != 0
        assert proc.count("lost connection to the CSI driver") >= 1


async def test_sigterm_while_waiting_for_the_driver_exits_cleanly(
    server: ApiServer, kubeconfig: pathlib.Path, sock_dir: pathlib.Path
) -> None:
    async with sidecar(kubeconfig, "--csi-address", str(sock_dir / "missing.sock")) as proc:
        await proc.wait_for("waiting for the CSI socket to appear")
        proc.proc.send_signal(signal.SIGTERM)
        assert await proc.exit_code() == 0


@pytest.mark.parametrize("flag", ["--version"])
async def test_version(flag: str) -> None:
    code, out, _ = await run_python("-m", "pyprovlib.csi.provisioner", flag, timeout=DEADLINE)
    assert code == 0
    assert "pyprovlib.csi.provisioner" in out


@pytest.mark.parametrize(
    "command",
    [("pyprovlib.csi.provisioner",), ("pyprovlib.csi", "--controllers=provisioner")],
    ids=["sidecar", "one-process"],
)
async def test_the_entry_points_run_the_cloning_protection_controller(
    server: ApiServer, kubeconfig: pathlib.Path, sock_dir: pathlib.Path, command: tuple[str, ...]
) -> None:
    state = DriverState()
    gate = asyncio.Event()
    module, *extra = command
    async with (
        serve_driver(sock_dir, state=state),
        entry_point(
            module,
            kubeconfig,
            f"--csi-address=unix://{sock_dir / 'csi.sock'}",
            "--cloning-protection-threads=2",
            "--v=5",
            *extra,
        ) as process,
        server.api_client() as api,
    ):
        await create_class(api)
        claims = await create_claim(api, "source")
        await wait_claim_bound(claims, "source", process)
        state.fail("CreateVolume", Fault(gate=gate, times=10**6))
        await claims.create(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": "clone", "namespace": "default"},
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": "csi",
                    "resources": {"requests": {"storage": "1Gi"}},
                    "dataSource": {"kind": "PersistentVolumeClaim", "name": "source"},
                },
            }
        )

        async def protected() -> bool:
            source = await claims.get("source", "default")
            return CLONE_FINALIZER in (source["metadata"].get("finalizers") or [])

        await until(protected, "cloning-protection finalizer on the source", process)
        await claims.delete("source", "default")
        gate.set()
        await wait_claim_bound(claims, "clone", process)

        async def source_gone() -> bool:
            names = [c["metadata"]["name"] for c in (await claims.list("default"))["items"]]
            return "source" not in names

        await until(source_gone, "the source deleted once its clone was done", process)
    started = [
        line
        for line in process.lines
        if line.get("event") == "started cloning-protection controller"
    ]
    assert [line.get("workers") for line in started] == [2]

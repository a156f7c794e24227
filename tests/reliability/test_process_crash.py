"""Process crashes during provisioning and deletion (issue 11, "Process crashes").

Two kinds of crash:

- task cancellation of an in-process ProvisionController at random points (the controller's
  code sees a CancelledError wherever it happens to be awaiting), replaced by a new instance;
- a real ``SIGKILL`` of a controller process — the NFS example (``python -m
  pyprovlib.examples.nfs``), whose assets are directories in a temporary "export" that
  survive the process — at random points, and exactly inside the windows "asset created, PV not
  saved" and "asset deleted, PV not deleted" (held open by API latency on the PV create/delete).

After the last restart the invariants hold: every claim Bound exactly once, one directory per
PV, no directory without a PV, nothing left of deleted claims.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from kubernetes_asyncio.client import ApiClient
from rel_support import (
    PROVISIONER,
    Backend,
    BackendProvisioner,
    all_bound,
    cancel,
    check_invariants,
    create_claims,
    create_class,
    create_namespace,
    delete_claims,
    fast_options,
    our_claims,
    our_volumes,
    running,
    unbound_report,
    unique,
    wait_until,
)

from pyprovlib.controller.provision import ProvisionController
from pyprovlib.testing.server import ApiServer

NFS_NAME = "pyprovlib.io/nfs"
PV_NAME_LEN = len("pvc-") + 36

# --------------------------------------------------------------------------------------------
# In-process: task cancellation at random points
# --------------------------------------------------------------------------------------------


async def cancellation_scenario(claims: int, kills: int, seed: int) -> None:
    rng = random.Random(seed)
    async with ApiServer(binder=True) as server, server.api_client() as client:
        ns = unique("crash")
        await create_namespace(client, ns)
        class_name = await create_class(client, reclaimPolicy="Delete")
        backend = Backend()

        async def crash_once() -> None:
            # A slow backend widens the windows between asset and PV.
            provisioner = BackendProvisioner(backend, pause=rng.uniform(0, 0.05))
            controller = ProvisionController(client, PROVISIONER, provisioner, fast_options())
            task = asyncio.create_task(controller.run())
            await asyncio.sleep(rng.uniform(0.05, 0.6))
            await cancel(task)

        keys = await create_claims(client, [ns], claims, class_name)
        for _ in range(kills):
            await crash_once()
        controller = ProvisionController(
            client, PROVISIONER, BackendProvisioner(backend), fast_options()
        )
        async with running(controller):
            await wait_until(
                lambda: all_bound(server, [ns], claims),
                timeout=60,
                message=lambda: unbound_report(server, [ns]),
            )
        check_invariants(server, [ns], [class_name], backend.assets)

        uids = [c["metadata"]["uid"] for c in our_claims(server, [ns])]
        await delete_claims(client, keys)
        for _ in range(kills):
            await crash_once()
        controller = ProvisionController(
            client, PROVISIONER, BackendProvisioner(backend), fast_options()
        )
        async with running(controller):
            await wait_until(
                lambda: not backend.assets and not our_volumes(server, [class_name]),
                timeout=60,
                message=lambda: f"{len(backend.assets)} assets left",
            )
        check_invariants(server, [ns], [class_name], backend.assets, deleted_uids=uids)


async def test_task_cancelled_at_random_points() -> None:
    await cancellation_scenario(claims=60, kills=6, seed=1)


@pytest.mark.slow
async def test_task_cancelled_at_random_points_500_claims() -> None:
    await cancellation_scenario(claims=500, kills=25, seed=2)


# --------------------------------------------------------------------------------------------
# A real process: the NFS example, SIGKILLed
# --------------------------------------------------------------------------------------------


class NFSProcess:
    """``python -m pyprovlib.examples.nfs`` against the in-memory server."""

    def __init__(self, kubeconfig: Path, root: Path, log: Path) -> None:
        self.kubeconfig = kubeconfig
        self.root = root
        self.log = log
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        argv = [
            sys.executable,
            "-m",
            "pyprovlib.examples.nfs",
            f"--kubeconfig={self.kubeconfig}",
            "--nfs-server=nfs.example.test",
            "--nfs-path=/export",
            f"--nfs-mount-path={self.root}",
            "--leader-election=false",
            "--log-format=json",
            "--worker-threads=8",
        ]
        with self.log.open("ab") as out:
            self.proc = await asyncio.create_subprocess_exec(
                *argv, stdout=out, stderr=asyncio.subprocess.STDOUT, env=dict(os.environ)
            )

    async def kill(self) -> None:
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)
        await self.proc.wait()

    async def terminate(self) -> int:
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            return await self.proc.wait()


@contextlib.asynccontextmanager
async def nfs_world(
    tmp_path: Path,
) -> AsyncIterator[tuple[ApiServer, ApiClient, NFSProcess, str, str]]:
    root = tmp_path / "export"
    root.mkdir()
    async with ApiServer(binder=True) as server, server.api_client() as client:
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        ns = unique("nfs")
        await create_namespace(client, ns)
        class_name = await create_class(
            client, NFS_NAME, reclaimPolicy="Delete", parameters={"onDelete": "delete"}
        )
        process = NFSProcess(kubeconfig, root, tmp_path / "nfs.log")
        try:
            yield server, client, process, ns, class_name
        finally:
            if process.proc is not None and process.proc.returncode is None:
                await process.kill()


def nfs_assets(root: Path) -> list[str]:
    """PV names of the volume directories (``<ns>-<claim>-<pv>``); an archived or foreign
    directory shows up under its own name and so breaks the invariants."""
    out = []
    for entry in sorted(root.iterdir()):
        name = entry.name
        out.append(name[-PV_NAME_LEN:] if name[-PV_NAME_LEN:].startswith("pvc-") else name)
    return out


def log_tail(process: NFSProcess) -> str:
    return process.log.read_text(errors="replace")[-3000:]


async def test_nfs_process_sigkilled_at_random_points(tmp_path: Path) -> None:
    await sigkill_scenario(tmp_path, claims=30, kills=2, seed=3)


@pytest.mark.slow
async def test_nfs_process_sigkilled_at_random_points_200_claims(tmp_path: Path) -> None:
    await sigkill_scenario(tmp_path, claims=200, kills=10, seed=4)


async def sigkill_scenario(tmp_path: Path, claims: int, kills: int, seed: int) -> None:
    rng = random.Random(seed)
    async with nfs_world(tmp_path) as (server, client, process, ns, class_name):
        root = process.root
        # Every PV save and delete takes a while, so kills land between asset and PV.
        server.faults.latency(0.15, verb="create", resource="persistentvolumes")
        server.faults.latency(0.15, verb="delete", resource="persistentvolumes")
        keys = await create_claims(client, [ns], claims, class_name)

        async def kill_mid_work(progress: Callable[[], int]) -> bool:
            """Start, wait until the process works, kill at a random point; True when the
            kill landed with work left to do."""
            await process.start()
            before = progress()
            with contextlib.suppress(AssertionError):
                await wait_until(lambda: progress() != before, timeout=20, message="")
            await asyncio.sleep(rng.uniform(0.0, 0.4))
            await process.kill()
            return progress() > 0 and progress() != before

        def dirs() -> int:
            return len(list(root.iterdir()))

        mid = [await kill_mid_work(dirs) for _ in range(kills)]
        await process.start()
        await wait_until(
            lambda: all_bound(server, [ns], claims),
            timeout=120,
            message=lambda: unbound_report(server, [ns]) + "\n" + log_tail(process),
        )
        check_invariants(server, [ns], [class_name], nfs_assets(root))
        uids = [c["metadata"]["uid"] for c in our_claims(server, [ns])]
        await process.kill()
        await delete_claims(client, keys)
        mid += [await kill_mid_work(dirs) for _ in range(kills)]
        await process.start()
        await wait_until(
            lambda: not list(root.iterdir()) and not our_volumes(server, [class_name]),
            timeout=120,
            message=lambda: f"left: {nfs_assets(root)[:5]}\n{log_tail(process)}",
        )
        assert await process.terminate() == 0
        check_invariants(server, [ns], [class_name], nfs_assets(root), deleted_uids=uids)
        assert any(mid), "no kill landed while the process was working"


async def test_nfs_sigkill_between_asset_created_and_pv_saved(tmp_path: Path) -> None:
    async with nfs_world(tmp_path) as (server, client, process, ns, class_name):
        root = process.root
        # The PV create hangs: the directory exists, the PV does not.
        server.faults.latency(60.0, verb="create", resource="persistentvolumes", count=1)
        keys = await create_claims(client, [ns], 1, class_name)
        await process.start()
        await wait_until(
            lambda: (
                bool(list(root.iterdir()))
                and server.requests.count("create", "persistentvolumes") >= 1
            ),
            timeout=30,
            message=lambda: "directory created and PV create in flight\n" + log_tail(process),
        )
        await process.kill()
        assert our_volumes(server, [class_name]) == []
        assert len(list(root.iterdir())) == 1  # the window: an asset without a PV

        await process.start()
        await wait_until(
            lambda: all_bound(server, [ns], 1),
            timeout=30,
            message=lambda: unbound_report(server, [ns]) + log_tail(process),
        )
        check_invariants(server, [ns], [class_name], nfs_assets(root))
        uid = our_claims(server, [ns])[0]["metadata"]["uid"]

        # Now the other window: directory removed, the PV delete hangs, kill.
        server.faults.latency(60.0, verb="delete", resource="persistentvolumes", count=1)
        await delete_claims(client, keys)
        await wait_until(
            lambda: (
                not list(root.iterdir())
                and server.requests.count("delete", "persistentvolumes") >= 1
            ),
            timeout=30,
            message=lambda: "directory removed and PV delete in flight\n" + log_tail(process),
        )
        await process.kill()
        assert len(our_volumes(server, [class_name])) == 1  # the window: a PV without asset

        await process.start()
        await wait_until(
            lambda: not our_volumes(server, [class_name]),
            timeout=30,
            message=lambda: "PV deleted after restart\n" + log_tail(process),
        )
        assert await process.terminate() == 0
        check_invariants(server, [ns], [class_name], nfs_assets(root), deleted_uids=[uid])

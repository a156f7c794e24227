"""pyprovlib.testing.ControlPlane: a real etcd + kube-apiserver (+ controllers) from an assets
directory, and its reaper, which cleans up after a test process that was killed.

The reaper tests run everywhere; the ones starting real binaries need ``PYPROVLIB_KUBE_ASSETS``
(or ``KUBEBUILDER_ASSETS``) and are skipped without it.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pyprovlib.kube._resources import NODES, PERSISTENT_VOLUME_CLAIMS
from pyprovlib.testing._binder import _Http
from pyprovlib.testing._controlplane import (
    ControlPlane,
    ControlPlaneError,
    assets_from_environment,
)

ASSETS = assets_from_environment()
needs_assets = pytest.mark.skipif(
    ASSETS is None, reason="needs PYPROVLIB_KUBE_ASSETS (an assets dir with etcd, kube-apiserver)"
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie waiting for init to reap it is as good as gone.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


async def _until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.1)


async def _run_and_kill(script: str) -> dict[str, object]:
    """Run ``script`` in a Python process of its own, read the JSON line it prints, SIGKILL it."""
    proc = subprocess.Popen(  # noqa: ASYNC220 - killed below, never awaited
        [sys.executable, "-c", textwrap.dedent(script)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = "-"
        while line and not line.startswith("{"):  # log lines may come first
            line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 180)
        assert line, f"the child exited without reporting (status {proc.poll()})"
        report: dict[str, object] = json.loads(line)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    return report


@pytest.mark.heavy
async def test_reaper_ends_processes_and_removes_directory_when_the_parent_is_killed(
    tmp_path: Path,
) -> None:
    report = await _run_and_kill(
        f"""
        import json, sys, tempfile, time
        from pathlib import Path
        from pyprovlib.testing._controlplane import _Component, _Reaper
        d = Path(tempfile.mkdtemp(dir={str(tmp_path)!r}))
        reaper = _Reaper(d)
        sleeper = _Component("sleeper", [sys.executable, "-c", "import time; time.sleep(600)"],
                             d / "sleeper.log")
        sleeper.start(reaper)
        # One that ignores SIGTERM: the reaper must SIGKILL it after the grace period.
        armed = d / "stubborn.armed"
        stubborn = _Component(
            "stubborn",
            [sys.executable, "-c",
             "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
             "open(sys.argv[1], 'w').close(); time.sleep(600)", str(armed)],
            d / "stubborn.log")
        stubborn.start(reaper)
        deadline = time.monotonic() + 60
        while not armed.exists():  # its SIGTERM handler is installed
            assert time.monotonic() < deadline, "the stubborn child never armed itself"
            time.sleep(0.01)
        print(json.dumps({{"dir": str(d), "pids": [sleeper.pid, stubborn.pid],
                          "reaper": reaper.proc.pid}}), flush=True)
        time.sleep(600)
        """
    )
    directory = Path(str(report["dir"]))
    pids = [int(p) for p in report["pids"]]  # type: ignore[attr-defined]
    assert directory.exists()  # noqa: ASYNC240
    await _until(lambda: not any(_alive(p) for p in pids), 30, f"processes {pids} to end")
    await _until(lambda: not directory.exists(), 10, f"{directory} to be removed")
    await _until(lambda: not _alive(int(report["reaper"])), 10, "the reaper to exit")  # type: ignore[call-overload]


def test_assets_without_apiserver_are_refused_with_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "etcd").write_text("")
    (tmp_path / "etcd").chmod(0o755)
    with pytest.raises(ControlPlaneError, match="kube-apiserver is missing"):
        ControlPlane(tmp_path)


class _RecordingPlane(ControlPlane):
    """A control plane whose launch and stop only record that they ran."""

    calls: list[str]

    async def launch(self) -> None:
        self.calls = ["launch"]

    async def stop(self) -> None:
        self.calls.append("stop")


async def test_start_launches_for_the_block_and_stops_after_it_even_when_it_fails(
    tmp_path: Path,
) -> None:
    for binary in ("etcd", "kube-apiserver"):
        (tmp_path / binary).write_text("")
        (tmp_path / binary).chmod(0o755)
    planes: list[_RecordingPlane] = []

    async def fail_inside() -> None:
        async with _RecordingPlane.start(tmp_path) as plane:
            assert isinstance(plane, _RecordingPlane)
            assert plane.calls == ["launch"]
            planes.append(plane)
            raise RuntimeError("the block failed")

    with pytest.raises(RuntimeError, match="the block failed"):
        await fail_inside()
    (plane,) = planes
    assert plane.calls == ["launch", "stop"]


def test_assets_come_from_either_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYPROVLIB_KUBE_ASSETS", raising=False)
    monkeypatch.setenv("KUBEBUILDER_ASSETS", "/envtest/bin")
    assert assets_from_environment() == Path("/envtest/bin")
    monkeypatch.setenv("PYPROVLIB_KUBE_ASSETS", "/ours")
    assert assets_from_environment() == Path("/ours")


@pytest.mark.e2e
@needs_assets
async def test_two_control_planes_at_once_with_stand_in_controllers() -> None:
    """Two at once on one machine; one with pyprovlib's binder and scheduler standing in for
    kube-controller-manager and kube-scheduler. Nodes are Ready and untainted, the snapshot
    CRDs are served, data survives an apiserver restart, and stop leaves nothing behind."""
    assert ASSETS is not None
    first = ControlPlane(ASSETS, controller_manager=False, scheduler=False, nodes=1)
    second = ControlPlane(ASSETS, controller_manager=False, scheduler=False, nodes=0)
    try:
        await asyncio.gather(first.launch(), second.launch())
        assert first.url != second.url
        assert first.directory is not None
        directory = first.directory
        pids = list(first.pids().values())
        assert "pyprovlib-controllers" in first.pids()
        async with first.api_client() as api:
            http = _Http(api)
            node = await http.json("GET", NODES.path(name="pyprovlib-node-1"))
            assert not (node.get("spec") or {}).get("taints")
            ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
            assert [c["status"] for c in ready] == ["True"]
            resources = await http.json("GET", "/apis/snapshot.storage.k8s.io/v1")
            assert {r["name"] for r in resources["resources"]} >= {
                "volumesnapshots",
                "volumesnapshotcontents",
                "volumesnapshotclasses",
            }
            claim = {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {"name": "kept"},
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": "1Gi"}},
                },
            }
            await http.json("POST", PERSISTENT_VOLUME_CLAIMS.path("default"), body=claim)
        old = first.pids()["kube-apiserver"]
        await first.restart_apiserver()
        assert first.pids()["kube-apiserver"] != old
        async with first.api_client() as api:
            kept = await _Http(api).json("GET", PERSISTENT_VOLUME_CLAIMS.path("default", "kept"))
            assert kept["metadata"]["name"] == "kept"
        async with second.api_client() as api:
            assert (await _Http(api).json("GET", NODES.path()))["items"] == []
    finally:
        await asyncio.gather(first.stop(), second.stop())
    assert not directory.exists()
    assert not any(_alive(p) for p in pids)
    assert not first.running


@pytest.mark.e2e
@needs_assets
async def test_nothing_is_left_when_the_test_process_is_killed() -> None:
    report = await _run_and_kill(
        f"""
        import asyncio, json, time
        from pyprovlib.testing._controlplane import ControlPlane

        async def main():
            cp = ControlPlane({str(ASSETS)!r}, nodes=0, snapshot_crds=False)
            await cp.launch()
            print(json.dumps({{"dir": str(cp.directory), "pids": list(cp.pids().values())}}),
                  flush=True)
            time.sleep(600)

        asyncio.run(main())
        """
    )
    directory = Path(str(report["dir"]))
    pids = [int(p) for p in report["pids"]]  # type: ignore[attr-defined]
    assert len(pids) >= 2
    await _until(lambda: not any(_alive(p) for p in pids), 60, f"processes {pids} to end")
    await _until(lambda: not directory.exists(), 20, f"{directory} to be removed")


def test_harness_chooses_kubeconfig_then_assets_then_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pyprovlib.testing._cluster import TestCluster

    for name in ("PYPROVLIB_E2E_KUBECONFIG", "PYPROVLIB_KUBE_ASSETS", "KUBEBUILDER_ASSETS"):
        monkeypatch.delenv(name, raising=False)
    in_memory = TestCluster.from_environment()
    assert not in_memory.is_real
    assert in_memory.owns_cluster
    assert not in_memory.snapshot_controller_may_run

    monkeypatch.setenv("KUBEBUILDER_ASSETS", "/envtest/bin")
    launched = TestCluster.from_environment()
    assert launched.is_real
    assert launched.assets == Path("/envtest/bin")
    assert launched.owns_cluster
    assert not launched.snapshot_controller_may_run

    monkeypatch.setenv("PYPROVLIB_E2E_KUBECONFIG", "/some/kubeconfig")
    shared = TestCluster.from_environment()
    assert shared.is_real
    assert shared.assets is None
    assert not shared.owns_cluster
    assert shared.snapshot_controller_may_run

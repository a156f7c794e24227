"""The benchmark scripts still run end to end (tiny sizes; no timing asserted here).

bench/csi_provision.py once stopped working when bench/provision.py's driver started waiting
for a line the CSI variant's controller never printed; nothing ran it, so nothing noticed.
"""

from __future__ import annotations

import pytest
from bench_support import run_bench

pytestmark = pytest.mark.heavy  # subprocess benches: CI runs them as their own step


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param([], id="at-once"),
        pytest.param(["--create-rate", "100", "--binder-process"], id="paced-binder-process"),
    ],
)
def test_provision_bench_runs(extra: list[str]) -> None:
    result = run_bench("provision.py", "--volumes", "20", "--threadiness", "4", *extra)
    assert result["bench"] == "provision"
    assert result["volumes"] == 20
    # Every volume was provisioned once: one PV create each, plus its two events.
    assert result["api_requests_by_resource"]["create"]["persistentvolumes"] == 20
    assert result["cpu_s_per_1000"] > 0
    assert result["peak_rss_mb"] > 0
    assert result["p99_s"] is not None
    if extra:
        assert result["binder_process"] is True
        assert result["binder_cpu_s"] is not None


def test_csi_provision_bench_runs() -> None:
    result = run_bench("csi_provision.py", "--volumes", "20", "--threadiness", "4")
    assert result["bench"] == "csi_provision"
    assert result["volumes"] == 20
    assert result["csi_calls_per_volume"] == {"CreateVolume": 1.0, "DeleteVolume": 1.0}
    assert result["cpu_s_per_1000"] > 0
    # The sidecar's default: the provisioning-protection finalizer is added once per claim and
    # removed once (a removal may still be on its way when the bench stops counting).
    assert result["provisioning_finalizer"] is True
    assert 1.0 <= result["api_requests_per_volume"]["patch"] <= 2.0


def test_entry_point_startup_bench_runs() -> None:
    result = run_bench("entry_point_startup.py", "--repeat", "1", "--settle", "0.2")
    assert result["bench"] == "entry_point_startup"
    for mode in ("lazy", "eager"):
        assert result[f"help_{mode}"]["peak_rss_mb"] > 0
        assert result[f"start_{mode}"]["ready_s"] > 0
    # the lazy imports are what pyprovlib's entry points do: the eager ones cost memory
    assert result["start_lazy"]["peak_rss_mb"] < result["start_eager"]["peak_rss_mb"]

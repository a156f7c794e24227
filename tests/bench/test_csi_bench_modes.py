"""bench/csi_provision.py's diagnostic modes still run (tiny sizes; no timing asserted here):
``--isolated`` (the CSI path alone against the driver process) and ``--transport none`` (the
end-to-end bench with CreateVolume/DeleteVolume answered in the controller), and both report
one provisioning attempt per volume."""

from __future__ import annotations

from typing import Any

import pytest
from bench_support import run_bench

pytestmark = pytest.mark.heavy  # subprocess benches: CI runs them as their own step


def _run(*args: str) -> dict[str, Any]:
    return run_bench("csi_provision.py", *args)


def test_isolated_mode_reports_cpu_per_volume_and_one_attempt_each() -> None:
    result = _run("--isolated", "--volumes", "30", "--repeat", "2", "--threadiness", "4")
    assert result["bench"] == "csi_provision_isolated"
    assert len(result["runs"]) == 2
    assert result["cpu_us_per_volume"] > 0
    assert result["provision_attempts_per_volume"] == 1.0
    # 100 warm-up volumes, then 2 runs of 30: each one CreateVolume, all answered OK.
    assert result["provision_outcomes"] == {"ok": 160}
    assert result["csi_client_calls"]["CreateVolume/OK"] == 160
    assert result["csi_calls_per_volume"] == {"CreateVolume": 1.0}


def test_end_to_end_without_grpc_counts_attempts_in_the_controller() -> None:
    result = _run("--volumes", "20", "--threadiness", "4", "--transport", "none")
    assert result["bench"] == "csi_provision"
    assert result["transport"] == "none"
    assert result["api_requests_by_resource"]["create"]["persistentvolumes"] == 20
    assert result["provision_attempts_per_volume"] == 1.0
    assert result["provision_outcomes"] == {"ok": 20}
    assert result["csi_calls_per_volume"] == {"CreateVolume": 1.0, "DeleteVolume": 1.0}

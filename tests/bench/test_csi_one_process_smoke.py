"""bench/csi_one_process.py still runs end to end (5 volumes, the one-process layout; no
timing asserted): the same work as the figures in bench/README.md, every CSI call once."""

from __future__ import annotations

import pytest
from bench_support import run_bench

pytestmark = pytest.mark.heavy  # subprocess benches: CI runs them as their own step


def test_csi_one_process_bench_runs() -> None:
    result = run_bench("csi_one_process.py", "--volumes", "5", "--layout", "one")
    assert result["bench"] == "csi_one_process"
    one = result["layouts"]["one"]
    assert one["processes"] == 1
    assert one["csi_calls_per_volume"] == {
        "ControllerExpandVolume": 1.0,
        "ControllerPublishVolume": 1.0,
        "ControllerUnpublishVolume": 1.0,
        "CreateVolume": 1.0,
        "DeleteVolume": 1.0,
    }
    assert one["cpu_s"] > 0
    assert one["peak_rss_mb"] > 0

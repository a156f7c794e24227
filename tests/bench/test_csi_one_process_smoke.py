"""bench/csi_one_process.py still runs end to end (5 volumes, the one-process layout; no
timing asserted): the same work as the figures in bench/README.md, every CSI call once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "csi_one_process.py"


def test_csi_one_process_bench_runs() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCH), "--volumes", "5", "--layout", "one"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
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

"""Running a bench/ script as the benchmark runner does, for the smoke tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parents[2] / "bench"


def run_bench(script: str, *args: str) -> dict[str, Any]:
    """Run ``bench/<script> args...`` to its end (it must exit 0); its figures, the JSON of its
    last line."""
    out = subprocess.run(
        [sys.executable, str(BENCH / script), *args],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result

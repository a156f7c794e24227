"""Run one bench script from two source trees, interleaved (A, B, B, A, A, B, ...), and report
the medians of its JSON figures and their ratio B/A.

Each tree is a directory holding ``bench/`` and ``src/`` (a ``git worktree`` or a ``git archive``
of a commit); its own bench script runs with ``PYTHONPATH=<tree>/src``, so the script and the
library are that commit's. On a shared machine only figures of the same run compare.

Usage::

    python bench/ab.py --a /tmp/base --b . --runs 3 -- provision.py --volumes 1000 --threadiness 32

Prints one line per run, then the medians, then exactly one line of JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

FIGURES = (
    "cpu_s_per_1000",
    "cpu_us_per_volume",
    "cpu_s_per_1000_delete",
    "p50_s",
    "p99_s",
    "peak_rss_mb",
    "volumes_per_s",
)


def _run(tree: Path, script: str, args: list[str]) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree / "src")
    done = subprocess.run(
        [sys.executable, str(tree / "bench" / script), *args],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"{tree}: {script} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--a", type=Path, required=True, help="tree A (the baseline)")
    p.add_argument("--b", type=Path, required=True, help="tree B")
    p.add_argument("--runs", type=int, default=3, help="runs per tree")
    p.add_argument("script", help="the bench script, e.g. provision.py")
    p.add_argument("args", nargs=argparse.REMAINDER)
    args = p.parse_args()
    trees = {"A": args.a.resolve(), "B": args.b.resolve()}
    results: dict[str, list[dict[str, Any]]] = {"A": [], "B": []}
    for i in range(args.runs):
        for name in ("A", "B") if i % 2 == 0 else ("B", "A"):
            result = _run(trees[name], args.script, args.args)
            results[name].append(result)
            shown = {k: result[k] for k in FIGURES if k in result}
            print(f"run {i} {name}: {shown}", flush=True)
    medians: dict[str, dict[str, float]] = {}
    for name, runs in results.items():
        medians[name] = {
            k: statistics.median(r[k] for r in runs) for k in FIGURES if all(k in r for r in runs)
        }
    ratio = {
        k: round(medians["B"][k] / medians["A"][k], 3)
        for k in medians["A"]
        if k in medians["B"] and medians["A"][k]
    }
    print(f"medians A {medians['A']}")
    print(f"medians B {medians['B']}")
    print(f"B/A {ratio}")
    print(
        json.dumps(
            {
                "bench": "ab",
                "script": args.script,
                "args": args.args,
                "a": str(trees["A"]),
                "b": str(trees["B"]),
                "median": medians,
                "ratio_b_over_a": ratio,
                "runs": results,
            }
        )
    )


if __name__ == "__main__":
    main()

"""Kubernetes' storage conformance suite for CSI drivers (``e2e.test``, "External Storage")
on a real node, for three stacks side by side (:mod:`stacks`): (a) the Go sidecars, (b)
``python -m pyprovlib.csi`` in their place, both on the Go hostpath driver, and (c)
``python -m pyprovlib.csi`` with pyprovlib's example driver.

The same selection runs for each (:mod:`conformance`), the three at once (their driver names
differ, so none acts on another's objects). It fails when (b) does not pass a test (a) passes,
or (c) fails one (a) passes; tests that fail for (a) too are this machine's (docs/testing.md
names them). The counts and every failure are written to ``$PYPROVLIB_CONFORMANCE_DIR`` (or the
test's temporary directory) as ``summary.txt``, with each stack's JUnit report and ginkgo log.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
import stacks
from conformance import FOCUS_VARIABLE, SKIPPED, SuiteResult, narrowed_by, regressions, run_suite
from conftest import RealNode

pytestmark = pytest.mark.conformance

PROCS = int(os.environ.get("PYPROVLIB_CONFORMANCE_PROCS", "4"))


def _report(results: list[SuiteResult], problems: list[str]) -> str:
    lines = ["Kubernetes storage e2e suite (External Storage), same selection for every stack:"]
    narrow = narrowed_by()
    if narrow is not None:
        lines.append(f"  narrowed by {FOCUS_VARIABLE}={narrow!r}: only the tests matching it")
    lines += [f"  {result.summary()}" for result in results]
    lines.append("left out (with reasons):")
    lines += [f"  {pattern}: {why}" for pattern, why in SKIPPED.items()]
    for result in results:
        failed = sorted(result.with_outcome("failed"))
        if failed:
            lines.append(f"failed for {result.stack.key}:")
            lines += [f"  {name}" for name in failed]
    if problems:
        lines.append("REGRESSIONS against the Go sidecars:")
        lines += [f"  {p}" for p in problems]
    return "\n".join(lines) + "\n"


def test_pyprovlib_passes_what_the_go_sidecars_pass(real_node: RealNode, tmp_path: Path) -> None:
    out = Path(os.environ.get("PYPROVLIB_CONFORMANCE_DIR") or tmp_path)
    node = real_node.node
    chosen = [stacks.GO, stacks.PYPROVLIB, stacks.EXAMPLE]

    async def run_all() -> list[SuiteResult]:
        for stack in chosen:
            await stacks.start_stack(node, stack, max_volumes=stacks.MAX_VOLUMES_PER_NODE)
        try:
            return list(
                await asyncio.gather(
                    *(run_suite(node, s, out / s.key, procs=PROCS) for s in chosen)
                )
            )
        finally:
            for stack in chosen:
                await stacks.stop_stack(node, stack)

    stacks.start_snapshot_controller(node)
    try:
        go, py, example = asyncio.run(run_all())
    finally:
        node.stop_process("snapshot-controller")
    for result in (go, py, example):
        assert result.outcomes, f"no test ran for {result.stack.key}; see {result.output}"
    problems = [f"(b) {name}" for name in regressions(go, py)]
    problems += [
        f"(c) {name}" for name in regressions(go, example) if example.outcomes.get(name) == "failed"
    ]
    report = _report([go, py, example], problems)
    (out / "summary.txt").write_text(report)
    print(report)
    assert not problems, report

"""Kubernetes' storage conformance suite for CSI drivers — ``e2e.test``'s "External Storage"
tests, run by ``ginkgo`` — against a stack of :mod:`stacks` on a real node, and the comparison
of two stacks' results.

One selection for every stack: the driver's "External Storage" tests, ``[Slow]``, ``[Serial]``,
snapshot and generic ephemeral tests included; out only what cannot run on this machine or
has nothing to run against, each with its reason in :data:`SKIPPED`. Test names carry the
driver's name; :func:`normalize` replaces it so two stacks' names compare.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import time
import xml.etree.ElementTree as ElementTree
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from stacks import Stack

from pyprovlib.testing._node import KubeletNode

HERE = Path(__file__).resolve().parent
DEFINITIONS = HERE / "conformance"

SKIPPED: dict[str, str] = {
    r"\[Disruptive\]": "restarts the kubelet or the node through ssh, which this node has not",
    r"\[Feature:Windows\]": "Windows nodes only",
    r"\[Feature:SELinux\]": "SELinux is not enabled on these hosts",
    r"\[Feature:VolumeSourceXFS\]": "xfs volumes: the hostpath drivers serve directories",
    r"\[Feature:volumegroupsnapshot\]": (
        "group snapshots: the groupsnapshot.storage.k8s.io CRDs and controller are not installed"
    ),
    r"\[Feature:snapshotmetadata\]": "the SnapshotMetadata service is not deployed",
    r"should provision storage with any volume data source": (
        "needs the hello-populator and volume-data-source-validator images, which only a "
        "registry has"
    ),
}
"""Regular expressions of the tests left out, with why."""


FOCUS_VARIABLE = "PYPROVLIB_CONFORMANCE_FOCUS"
"""An environment variable: a regular expression (ginkgo's, i.e. Go's RE2) that narrows the
selection to the tests whose full name also matches it, e.g. ``volume-modify`` or
``VolumeAttributesClass``; unset or empty, the whole selection runs."""


def skip_regex() -> str:
    return "|".join(SKIPPED)


def narrowed_by() -> str | None:
    """The :data:`FOCUS_VARIABLE` regular expression, or None when the whole selection runs."""
    return os.environ.get(FOCUS_VARIABLE) or None


def focus_regex(stack: Stack, narrow: str | None = None) -> str:
    """The stack's "External Storage" tests, only those also matching ``narrow`` when given."""
    driver = rf"External.Storage \[Driver: {re.escape(stack.driver)}\]"
    if narrow is None:
        return driver
    try:
        re.compile(narrow)  # Python's syntax is close enough to RE2 to catch typos early
    except re.error as err:
        raise ValueError(
            f"{FOCUS_VARIABLE}={narrow!r} is not a regular expression ({err}); set it to one "
            "that matches part of the tests' names, e.g. 'volume-modify'"
        ) from None
    return f"{driver}.*(?:{narrow})"


def normalize(name: str, stack: Stack) -> str:
    """A test's name with the stack's driver name replaced, so stacks' names compare."""
    return name.replace(f"[Driver: {stack.driver}]", "[Driver: <driver>]").strip()


@dataclass
class SuiteResult:
    """One stack's run: each test's outcome (``passed``, ``failed``, ``skipped``) by
    normalized name, the seconds it took, and where its report and output are."""

    stack: Stack
    outcomes: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    report: Path | None = None
    output: Path | None = None
    exit_code: int | None = None

    def counts(self) -> Counter[str]:
        return Counter(self.outcomes.values())

    def with_outcome(self, outcome: str) -> set[str]:
        return {name for name, o in self.outcomes.items() if o == outcome}

    def summary(self) -> str:
        counts = self.counts()
        return (
            f"{self.stack.key} ({self.stack.title}): {counts['passed']} passed, "
            f"{counts['failed']} failed, {counts['skipped']} skipped in {self.seconds:.0f} s"
        )


def parse_junit(path: Path, stack: Stack) -> dict[str, str]:
    """Each "External Storage" test case of a ginkgo JUnit report, with its outcome."""
    outcomes: dict[str, str] = {}
    tree = ElementTree.parse(path)
    ours = f"External Storage [Driver: {stack.driver}]"
    for case in tree.iter("testcase"):
        name = case.get("name") or ""
        if ours not in name:
            continue  # another driver's test, or a suite set-up or tear-down node
        name = re.sub(r"^\[It\]\s*", "", name)
        if case.find("failure") is not None or case.find("error") is not None:
            outcome = "failed"
        elif case.find("skipped") is not None:
            outcome = "skipped"
        else:
            outcome = "passed"
        outcomes[normalize(name, stack)] = outcome
    return outcomes


def ginkgo_argv(node: KubeletNode, stack: Stack, out_dir: Path, procs: int) -> list[str]:
    assets = node.plane.assets
    assert node.plane.kubeconfig_path is not None
    return [
        str(assets / "ginkgo"),
        f"--procs={procs}",
        f"--focus={focus_regex(stack, narrowed_by())}",
        f"--skip={skip_regex()}",
        "--no-color",
        "--timeout=3h",
        f"--output-dir={out_dir}",
        "--junit-report=junit.xml",
        str(assets / "e2e.test"),
        "--",
        f"--kubeconfig={node.plane.kubeconfig_path}",
        f"--storage.testdriver={DEFINITIONS / f'{stack.key}.yaml'}",
        # The definitions' VolumeAttributesClass files are named relative to it.
        f"--repo-root={DEFINITIONS}",
        f"--report-dir={out_dir}",
    ]


async def run_suite(
    node: KubeletNode, stack: Stack, out_dir: Path, *, procs: int = 3
) -> SuiteResult:
    """Run the selection for ``stack`` (already started on ``node``); the result holds every
    test's outcome. ginkgo's own exit status is kept, not raised: a failing test is data."""
    await asyncio.to_thread(out_dir.mkdir, parents=True, exist_ok=True)
    output = out_dir / "ginkgo.log"
    started = time.monotonic()
    with output.open("wb") as sink:
        process = await asyncio.create_subprocess_exec(
            *ginkgo_argv(node, stack, out_dir, procs),
            stdout=sink,
            stderr=asyncio.subprocess.STDOUT,
            cwd=out_dir,
            env={**os.environ, "KUBECONFIG": str(node.plane.kubeconfig_path)},
            start_new_session=True,  # ginkgo and its e2e.test processes, ended as a group
        )
        try:
            code = await process.wait()
        finally:
            if process.returncode is None:  # cancelled: end the suite's processes too
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                await process.wait()
    result = SuiteResult(stack, seconds=time.monotonic() - started, output=output, exit_code=code)
    report = out_dir / "junit.xml"
    if report.exists():
        result.report = report
        result.outcomes = parse_junit(report, stack)
    return result


def regressions(reference: SuiteResult, candidate: SuiteResult) -> list[str]:
    """Tests ``reference`` passes that ``candidate`` does not (failed, skipped or missing)."""
    return sorted(
        name
        for name in reference.with_outcome("passed")
        if candidate.outcomes.get(name) != "passed"
    )

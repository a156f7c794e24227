"""A bug in the user's Resizer (an exception it did not mean to raise) is logged once per
failure at error with its type and traceback, and the VolumeResizeFailed event names the
type; a ResizeError keeps its bare message."""

from __future__ import annotations

import io
import json

import pytest
from kubernetes_asyncio.client import V1PersistentVolume
from resize_support import MemoryResizer, Scenario, controller
from sidecar_support import running, wait_for

from pyprovlib._resizer import ExpansionResult
from pyprovlib.testing._cluster import TestCluster

pytestmark = pytest.mark.e2e


class BuggyResizer(MemoryResizer):
    """Divides by zero on its first expansion."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.bug = True

    async def expand(self, pv: V1PersistentVolume, new_size: int) -> ExpansionResult:
        if self.bug:
            self.bug = False
            new_size //= 0
        return await super().expand(pv, new_size)


async def test_a_resizer_bug_is_logged_with_its_traceback_and_named_in_the_event(
    kube_cluster: TestCluster, logs: io.StringIO
) -> None:
    s = Scenario(kube_cluster)
    claim, _, _ = await s.bound_claim()
    resizer = BuggyResizer(s.driver)
    async with running(controller(kube_cluster, resizer)):
        await s.expand(claim, "2Gi")

        async def failed_event() -> list[str]:
            return [
                str(e.get("message"))
                for e in await s.events(claim)
                if e.get("reason") == "VolumeResizeFailed"
            ]

        messages = await wait_for(failed_event, message="a VolumeResizeFailed event")
        assert any("ZeroDivisionError: integer division or modulo by zero" in m for m in messages)
    bugs = [json.loads(line) for line in logs.getvalue().splitlines() if '"exception"' in line]
    assert [(b["level"], b["error_type"]) for b in bugs] == [("error", "ZeroDivisionError")]
    assert "in expand" in bugs[0]["exception"]
    assert not [
        line for line in logs.getvalue().splitlines() if '"event": "expansion failed"' in line
    ]  # the bug's one record replaces the plain line

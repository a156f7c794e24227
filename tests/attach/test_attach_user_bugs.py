"""A bug in the user's Attacher (an exception it did not mean to raise) is logged once per
failure at error with its type and traceback, secrets masked, and the VolumeAttachment's
attachError names the type."""

from __future__ import annotations

import asyncio
import io
import json

import pytest
from attach_support import MemoryAttacher, Scenario, status
from sidecar_support import running

pytestmark = pytest.mark.e2e

SECRET = "hunter2-s3cret-attach"


def records(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]


class BuggyAttacher(MemoryAttacher):
    """Its first attach hits a KeyError of its own; its first detach a RuntimeError quoting
    the volume's secret."""

    def __init__(self) -> None:
        super().__init__()
        self.attach_bug = True
        self.detach_bug = True

    async def attach(self, volume, node, readonly, context):
        if self.attach_bug:
            self.attach_bug = False
            no_luns: dict[str, str] = {}
            return no_luns["lun"]
        return await super().attach(volume, node, readonly, context)

    async def detach(self, volume, node):
        if self.detach_bug:
            self.detach_bug = False
            raise RuntimeError(f"session for {volume.secrets['password']} expired")
        await super().detach(volume, node)


async def test_an_attacher_bug_is_logged_with_its_traceback_and_named_in_the_status(
    sc: Scenario,
    logs: io.StringIO,
) -> None:
    backend = BuggyAttacher()
    backend.attach_gate = asyncio.Event()  # the retry waits until the error has been seen
    await sc.objects.secret("creds", {"password": SECRET})
    pv_name, va_name = sc.name("pv"), sc.name("va")
    await sc.objects.pv(pv_name, "vol-bug", secret="creds")
    async with running(sc.controller(backend)):
        await sc.objects.va(va_name, sc.node, pv=pv_name)
        va = await sc.objects.wait_error(va_name)
        assert status(va)["attachError"]["message"] == "KeyError: 'lun'"
        backend.attach_gate.set()
        await sc.attached_va(va_name)
        await sc.objects.vas.delete(va_name)
        await sc.objects.wait_va_gone(va_name)

    bugs = [r for r in records(logs) if "exception" in r]
    assert [(r["level"], r["error_type"]) for r in bugs] == [
        ("error", "KeyError"),
        ("error", "RuntimeError"),
    ]
    attach, detach = bugs
    assert attach["error"] == "KeyError: 'lun'"
    assert "in attach" in str(attach["exception"])
    assert str(attach["exception"]).endswith("KeyError: 'lun'")
    assert str(detach["exception"]).startswith("Traceback (most recent call last):")
    assert SECRET not in logs.getvalue()  # masked in the traceback too

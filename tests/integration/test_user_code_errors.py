"""A bug in the user's provisioner (an exception it did not mean to raise) is logged once per
failure at error, with its type and traceback, and the event names the type
(``ZeroDivisionError: division by zero``); the contract's own errors keep their form. Secrets
are still scrubbed. The Qualifier and DeletionGuard hooks and ``delete`` too; the attacher
and resizer in tests/attach and tests/resize (test_*_user_bugs.py)."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from claim_support import create_claim, delete_claim
from kubernetes_asyncio.client import V1PersistentVolume, V1PersistentVolumeClaim
from provision_support import MemoryProvisioner, create_class, fast_options, provisioner_name

from pyprovlib._provisioner import (
    DeletionGuard,
    ProvisioningError,
    ProvisioningState,
    ProvisionOptions,
    Qualifier,
)
from pyprovlib.controller._provision import ProvisionController
from pyprovlib.kube._resources import PERSISTENT_VOLUMES
from pyprovlib.testing import events_of, running, wait_bound, wait_deleted, wait_event
from pyprovlib.testing._cluster import TestCluster

pytestmark = pytest.mark.e2e


def records(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]


def bug_records(stream: io.StringIO, error_type: str) -> list[dict[str, Any]]:
    return [r for r in records(stream) if r.get("error_type") == error_type]


class BuggyProvisioner(MemoryProvisioner):
    """Fails ``failures`` times with the bug ``bug`` names, then provisions."""

    def __init__(self, bug: str, failures: int = 1) -> None:
        super().__init__()
        self.bug = bug
        self.failures = failures

    async def provision(self, options: ProvisionOptions) -> V1PersistentVolume:
        if self.failures > 0:
            self.failures -= 1
            if self.bug == "zero":
                return 1 / 0  # type: ignore[return-value]
            if self.bug == "key":
                no_volumes: dict[str, V1PersistentVolume] = {}
                return no_volumes["storage"]
            if self.bug == "secret":
                raise RuntimeError("backend login failed: password=hunter2-s3cret")
            raise ProvisioningError("pool full", ProvisioningState.FINISHED)
        return await super().provision(options)


async def provision_once(cluster: TestCluster, provisioner: MemoryProvisioner) -> str:
    name = provisioner_name(cluster)
    class_name = await create_class(cluster, name)
    controller = ProvisionController(cluster.api_client, name, provisioner, fast_options())
    async with running(controller):
        claim = await create_claim(cluster, class_name)
        claim_name: str = claim["metadata"]["name"]
        await wait_bound(cluster, claim_name)
    return claim_name


@pytest.mark.parametrize(
    ("bug", "error_type", "text"),
    [
        ("zero", "ZeroDivisionError", "ZeroDivisionError: division by zero"),
        ("key", "KeyError", "KeyError: 'storage'"),
    ],
)
async def test_a_bug_in_provision_is_logged_with_its_traceback_and_named_in_the_event(
    kube_cluster: TestCluster, logs: io.StringIO, bug: str, error_type: str, text: str
) -> None:
    claim = await provision_once(kube_cluster, BuggyProvisioner(bug))
    await wait_event(kube_cluster, claim, "ProvisioningFailed", text)
    (record,) = bug_records(logs, error_type)  # once for the one failure
    assert record["level"] == "error"
    assert record["error"] == text
    exception = str(record["exception"])
    assert exception.startswith("Traceback (most recent call last):")
    assert "in provision" in exception  # the user's frame
    assert exception.endswith(text)
    assert record["claim"].endswith(claim)
    # The retry line names the type too; no other record carries the traceback.
    assert sum("exception" in r for r in records(logs)) == 1


async def test_expected_errors_keep_their_form(
    kube_cluster: TestCluster, logs: io.StringIO
) -> None:
    claim = await provision_once(kube_cluster, BuggyProvisioner("expected"))
    event = await wait_event(kube_cluster, claim, "ProvisioningFailed", "pool full")
    assert event["message"].endswith(": pool full")
    assert "ProvisioningError" not in event["message"]
    failed = [r for r in records(logs) if r["event"] == "provisioning failed"]
    assert [r["level"] for r in failed] == ["warning"]  # issue 30: it was info
    assert failed[0]["error"] == "pool full"
    assert not any("exception" in r for r in records(logs))


async def test_secrets_are_scrubbed_from_the_traceback_and_the_event(
    kube_cluster: TestCluster, logs: io.StringIO
) -> None:
    claim = await provision_once(kube_cluster, BuggyProvisioner("secret"))
    event = await wait_event(kube_cluster, claim, "ProvisioningFailed", "RuntimeError: backend")
    (record,) = bug_records(logs, "RuntimeError")
    assert "Traceback" in str(record["exception"])
    assert "hunter2-s3cret" not in logs.getvalue()
    assert "hunter2-s3cret" not in json.dumps(await events_of(kube_cluster, claim))
    assert "password=" in event["message"]  # the key stays, the value is masked


class BuggyHooks(MemoryProvisioner, Qualifier, DeletionGuard):
    """should_provision and should_delete fail once each; delete fails once."""

    def __init__(self) -> None:
        super().__init__()
        self.qualifier_failures = 1
        self.guard_failures = 1
        self.delete_failures = 1

    async def should_provision(self, claim: V1PersistentVolumeClaim) -> bool:
        if self.qualifier_failures:
            self.qualifier_failures -= 1
            raise AttributeError("'NoneType' object has no attribute 'labels'")
        return True

    async def should_delete(self, volume: V1PersistentVolume) -> bool:
        if self.guard_failures:
            self.guard_failures -= 1
            raise IndexError("list index out of range")
        return True

    async def delete(self, volume: V1PersistentVolume) -> None:
        if self.delete_failures:
            self.delete_failures -= 1
            raise ZeroDivisionError("division by zero")
        await super().delete(volume)


async def test_bugs_in_the_qualifier_guard_and_delete_are_logged_with_tracebacks(
    kube_cluster: TestCluster, logs: io.StringIO
) -> None:
    name = provisioner_name(kube_cluster)
    class_name = await create_class(kube_cluster, name, reclaimPolicy="Delete")
    backend = BuggyHooks()
    controller = ProvisionController(kube_cluster.api_client, name, backend, fast_options())
    async with running(controller):
        claim = await create_claim(kube_cluster, class_name)
        claim_name = claim["metadata"]["name"]
        pv_name = (await wait_bound(kube_cluster, claim_name))["spec"]["volumeName"]
        await delete_claim(kube_cluster, claim_name)
        await wait_event(
            kube_cluster,
            pv_name,
            "VolumeFailedDelete",
            "ZeroDivisionError: division by zero",
            namespace="default",
        )
        await wait_deleted(kube_cluster, PERSISTENT_VOLUMES, pv_name)
    for error_type, event in (
        ("AttributeError", "the provisioner's should_provision raised an unexpected exception"),
        ("IndexError", "the provisioner's should_delete raised an unexpected exception"),
        ("ZeroDivisionError", "volume deletion failed"),
    ):
        (record,) = bug_records(logs, error_type)
        assert record["event"] == event
        assert record["level"] == "error"
        assert "Traceback (most recent call last):" in str(record["exception"])

"""The small shared pieces of pyprovlib.kube: clock, resource table, keys, error helpers."""

from __future__ import annotations

import asyncio
import json

import pytest
from kubernetes_asyncio.client.exceptions import ApiException
from multidict import CIMultiDict, CIMultiDictProxy

from pyprovlib.kube import _errors as errors
from pyprovlib.kube import _objects as objects
from pyprovlib.kube._clock import FakeClock
from pyprovlib.kube._resources import (
    LEASES,
    PERSISTENT_VOLUME_CLAIMS,
    PERSISTENT_VOLUMES,
    resource_for,
)


async def test_fake_clock_wakes_sleepers_in_deadline_order() -> None:
    clock = FakeClock()
    woke: list[tuple[str, float]] = []

    async def sleeper(name: str, d: float) -> None:
        await clock.sleep(d)
        woke.append((name, clock.monotonic()))

    tasks = [asyncio.create_task(sleeper("b", 2)), asyncio.create_task(sleeper("a", 1))]
    await asyncio.sleep(0)
    assert clock.waiters == 2
    await clock.advance(1.5)
    assert woke == [("a", 1.0)]
    await clock.advance(10)
    assert woke == [("a", 1.0), ("b", 2.0)]
    assert clock.monotonic() == 11.5
    await asyncio.gather(*tasks)


async def test_fake_clock_skips_cancelled_sleepers() -> None:
    clock = FakeClock()
    t = asyncio.create_task(clock.sleep(5))
    await asyncio.sleep(0)
    t.cancel()
    with pytest.raises(asyncio.CancelledError):
        await t
    assert not await clock.step()


def test_resource_paths() -> None:
    assert PERSISTENT_VOLUMES.path() == "/api/v1/persistentvolumes"
    assert PERSISTENT_VOLUMES.path(name="pv1", subresource="status") == (
        "/api/v1/persistentvolumes/pv1/status"
    )
    assert PERSISTENT_VOLUME_CLAIMS.path("ns") == "/api/v1/namespaces/ns/persistentvolumeclaims"
    assert LEASES.path("kube-system", "x") == (
        "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases/x"
    )
    with pytest.raises(ValueError, match="cluster-scoped"):
        PERSISTENT_VOLUMES.path("ns", "pv1")
    with pytest.raises(ValueError, match="namespaced"):
        PERSISTENT_VOLUME_CLAIMS.path(None, "c")
    assert resource_for("v1", "PersistentVolume") is PERSISTENT_VOLUMES
    with pytest.raises(LookupError):
        resource_for("v1", "Widget")


def test_keys_round_trip() -> None:
    pvc = {"metadata": {"name": "c", "namespace": "ns"}}
    assert objects.meta_namespace_key(pvc) == "ns/c"
    assert objects.split_key("ns/c") == ("ns", "c")
    assert objects.meta_namespace_key({"metadata": {"name": "pv"}}) == "pv"
    assert objects.split_key("pv") == ("", "pv")
    with pytest.raises(ValueError, match="unexpected key"):
        objects.split_key("a/b/c")
    with pytest.raises(ValueError, match=r"metadata\.name"):
        objects.meta_namespace_key({})


def _api_error(status: int, reason: str, headers: dict[str, str] | None = None) -> ApiException:
    e = ApiException(status=status, reason=reason)
    e.body = json.dumps({"kind": "Status", "reason": reason, "code": status}).encode()
    e.headers = CIMultiDictProxy(CIMultiDict(headers or {}))
    return e


def test_error_classification() -> None:
    exists = _api_error(409, "AlreadyExists")
    conflict = _api_error(409, "Conflict")
    assert errors.is_already_exists(exists)
    assert not errors.is_conflict(exists)
    assert errors.is_conflict(conflict)
    assert not errors.is_already_exists(conflict)
    assert errors.is_not_found(_api_error(404, "NotFound"))
    assert errors.is_gone(_api_error(410, "Expired"))
    throttled = _api_error(429, "TooManyRequests", {"Retry-After": "3"})
    assert errors.is_retryable(throttled)
    assert errors.retry_after_seconds(throttled) == 3.0
    assert not errors.is_retryable(exists)
    assert not errors.is_not_found(ValueError("x"))

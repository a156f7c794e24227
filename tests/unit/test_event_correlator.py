"""The EventCorrelator's bookkeeping (client-go events_cache.go semantics) and the pieces the
recorder builds events from, without an API server."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubernetes_asyncio.client import (
    ApiClient,
    V1ObjectMeta,
    V1PersistentVolume,
    V1PersistentVolumeClaim,
    V1StorageClass,
)
from prometheus_client import CollectorRegistry

from pyprovlib.kube._clock import FakeClock
from pyprovlib.kube._events import (
    MAX_MESSAGE_BYTES,
    CorrelatorOptions,
    EventCorrelator,
    EventRecorder,
    object_reference,
    truncate_message,
)

PVC: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "PersistentVolumeClaim",
    "metadata": {"name": "claim", "namespace": "ns", "uid": "u-1", "resourceVersion": "7"},
}


def _event(message: str = "m", reason: str = "R", obj: dict[str, Any] | None = None) -> Any:
    ref = object_reference(obj or PVC)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{ref['name']}.{len(message):x}", "namespace": "ns"},
        "involvedObject": ref,
        "reason": reason,
        "message": message,
        "type": "Normal",
        "source": {"component": "c"},
        "reportingComponent": "c",
        "reportingInstance": "",
        "count": 1,
        "firstTimestamp": "2026-01-01T00:00:00Z",
        "lastTimestamp": "2026-01-01T00:00:00Z",
    }


def test_identical_event_becomes_a_patch_of_the_first() -> None:
    corr = EventCorrelator(clock=FakeClock())
    first = corr.correlate(_event())
    assert not first.skip
    assert first.patch is None
    assert first.event is not None
    assert first.event["count"] == 1
    corr.update_state(
        {**first.event, "metadata": {**first.event["metadata"], "resourceVersion": "5"}}
    )

    second_in = _event()
    second_in["metadata"]["name"] = "other-name"
    second_in["lastTimestamp"] = "2026-01-01T00:01:00Z"
    second = corr.correlate(second_in)
    assert second.event is not None
    assert second.event["count"] == 2
    # patched under the first event's name, keeping its first timestamp
    assert second.event["metadata"]["name"] == first.event["metadata"]["name"]
    assert second.event["metadata"]["resourceVersion"] == "5"
    assert second.patch == {"count": 2, "lastTimestamp": "2026-01-01T00:01:00Z", "message": "m"}
    third = corr.correlate(_event())
    assert third.event is not None
    assert third.event["count"] == 3


def test_different_reason_or_message_is_a_new_event() -> None:
    corr = EventCorrelator(clock=FakeClock())
    corr.correlate(_event("a"))
    other = corr.correlate(_event("b"))
    assert other.patch is None
    other_reason = corr.correlate(_event("a", reason="Other"))
    assert other_reason.patch is None


def test_aggregation_after_max_similar_events() -> None:
    clock = FakeClock()
    corr = EventCorrelator(clock=clock)
    results = [corr.correlate(_event(f"message {i}")) for i in range(12)]
    # The first 9 distinct messages are written as they are.
    for r in results[:9]:
        assert r.event is not None
        assert not r.event["message"].startswith("(combined")
    # The 10th similar one crosses the threshold: one combined event, then counted.
    tenth = results[9].event
    assert tenth is not None
    assert tenth["message"] == "(combined from similar events): message 9"
    assert tenth["count"] == 1
    assert results[9].patch is None
    eleventh = results[10].event
    assert eleventh is not None
    assert eleventh["message"] == "(combined from similar events): message 10"
    assert eleventh["count"] == 2
    assert eleventh["metadata"]["name"] == tenth["metadata"]["name"]
    assert results[10].patch is not None


async def test_aggregation_window_resets_after_interval() -> None:
    clock = FakeClock()
    corr = EventCorrelator(clock=clock, options=CorrelatorOptions(aggregate_max_events=3))
    corr.correlate(_event("a"))
    corr.correlate(_event("b"))
    await clock.advance(601)
    # More than aggregate_interval since the last similar event: a fresh record.
    r = corr.correlate(_event("c"))
    assert r.event is not None
    assert r.event["message"] == "c"
    r = corr.correlate(_event("d"))
    assert r.event is not None
    assert r.event["message"] == "d"
    r = corr.correlate(_event("e"))
    assert r.event is not None
    assert r.event["message"].startswith("(combined from similar events): ")


async def test_spam_filter_burst_then_refill() -> None:
    clock = FakeClock()
    corr = EventCorrelator(clock=clock)
    # Distinct reasons so aggregation does not kick in; same source+object for the filter.
    outcomes = [corr.correlate(_event("m", reason=f"R{i}")).skip for i in range(30)]
    assert outcomes == [False] * 25 + [True] * 5
    # Another object has its own bucket.
    other = {**PVC, "metadata": {**PVC["metadata"], "name": "c2", "uid": "u-2"}}
    assert not corr.correlate(_event("m", obj=other)).skip
    await clock.advance(299)
    assert corr.correlate(_event("m", reason="late")).skip
    await clock.advance(1)
    assert not corr.correlate(_event("m", reason="later")).skip
    assert corr.correlate(_event("m", reason="too-soon")).skip


def test_caches_stay_bounded() -> None:
    corr = EventCorrelator(clock=FakeClock(), options=CorrelatorOptions(cache_size=16))
    for i in range(500):
        obj = {**PVC, "metadata": {**PVC["metadata"], "name": f"c{i}", "uid": f"u{i}"}}
        corr.correlate(_event(f"m{i}", obj=obj))
    assert len(corr._logs) == 16
    assert len(corr._spam) == 16
    assert len(corr._aggregates) == 16


def test_correlator_options_validated() -> None:
    with pytest.raises(ValueError, match="cache_size"):
        CorrelatorOptions(cache_size=0)
    with pytest.raises(ValueError, match="spam_qps"):
        CorrelatorOptions(spam_qps=0)


def test_truncate_message() -> None:
    assert truncate_message("short") == "short"
    exact = "x" * MAX_MESSAGE_BYTES
    assert truncate_message(exact) == exact
    long = "y" * 5000
    cut = truncate_message(long)
    assert len(cut.encode()) == MAX_MESSAGE_BYTES
    assert cut.endswith(" ...")


@given(st.text(min_size=0, max_size=2000))
def test_truncate_never_exceeds_limit_nor_splits_characters(text: str) -> None:
    cut = truncate_message(text)
    assert len(cut.encode("utf-8")) <= MAX_MESSAGE_BYTES
    if len(text.encode("utf-8")) <= MAX_MESSAGE_BYTES:
        assert cut == text
    else:
        assert text.startswith(cut[: -len(" ...")])


async def test_object_reference_with_a_client() -> None:
    async with ApiClient() as client:
        pvc = V1PersistentVolumeClaim(metadata=V1ObjectMeta(name="c", namespace="ns"))
        assert object_reference(pvc, client)["kind"] == "PersistentVolumeClaim"


def test_object_reference_from_dict_and_models() -> None:
    assert object_reference(PVC) == {
        "kind": "PersistentVolumeClaim",
        "apiVersion": "v1",
        "name": "claim",
        "namespace": "ns",
        "uid": "u-1",
        "resourceVersion": "7",
    }
    client = None
    # Models from list calls carry no kind/apiVersion; they come from the class.
    pvc = V1PersistentVolumeClaim(
        metadata=V1ObjectMeta(name="c", namespace="ns", uid="u", resource_version="3")
    )
    assert object_reference(pvc, client) == {
        "kind": "PersistentVolumeClaim",
        "apiVersion": "v1",
        "name": "c",
        "namespace": "ns",
        "uid": "u",
        "resourceVersion": "3",
    }
    pv = V1PersistentVolume(metadata=V1ObjectMeta(name="pv1", uid="u2"))
    ref = object_reference(pv, client)
    assert ref["kind"] == "PersistentVolume"
    assert "namespace" not in ref
    sc = V1StorageClass(metadata=V1ObjectMeta(name="fast"), provisioner="x")
    assert object_reference(sc, client)["apiVersion"] == "storage.k8s.io/v1"
    # An ObjectReference passes through.
    assert object_reference({"kind": "Node", "apiVersion": "v1", "name": "n1"})["name"] == "n1"


@pytest.mark.parametrize(
    ("obj", "match"),
    [
        ({"metadata": {"name": "x"}}, "no kind"),
        ({"kind": "Widget", "metadata": {"name": "x"}}, "no apiVersion"),
        ({"kind": "Pod", "apiVersion": "v1", "metadata": {}}, "no name"),
        (42, "not a dict"),
    ],
)
def test_object_reference_rejects(obj: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        object_reference(obj)


async def test_recorder_event_never_raises_and_counts_invalid_and_full() -> None:
    registry = CollectorRegistry()
    clock = FakeClock()
    async with ApiClient() as client:
        rec = EventRecorder(client, "comp", clock=clock, max_buffer=2, registry=registry)
        rec.event({"metadata": {}}, "Normal", "R", "m")  # no kind, no name
        rec.event(PVC, "Fatal", "R", "m")  # unsupported type
        rec.event(object(), "Normal", "R", "m")
        assert (
            registry.get_sample_value("pyprovlib_events_dropped_total", {"reason": "invalid"}) == 3
        )
        for _ in range(5):
            rec.event(PVC, "Normal", "R", "m")
        assert rec.pending == 2
        assert (
            registry.get_sample_value("pyprovlib_events_dropped_total", {"reason": "buffer_full"})
            == 3
        )
        # Nothing writes: flush times out on the recorder's clock, not wall time.
        flushing = asyncio.create_task(rec.flush(5.0))
        for _ in range(100):
            if clock.waiters:
                break
            await asyncio.sleep(0)
        await clock.advance(4.9)
        assert not flushing.done()
        await clock.advance(0.1)
        assert await flushing is False


async def test_recorder_builds_client_go_shaped_events() -> None:
    clock = FakeClock()
    async with ApiClient() as client:
        rec = EventRecorder(
            client, "comp", host="node-1", clock=clock, registry=CollectorRegistry()
        )
        pv = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pv1"}}
        rec.event(pv, "Warning", "Failed", "x" * 3000)
        rec.event(pv, "Warning", "Failed", "again")
        # Both wait in the buffer, in order, under their one object.
        ((first, second),) = [
            [event.as_event() for event in events] for events in rec._waiting.values()
        ]
    assert first["metadata"]["namespace"] == "default"
    # name: <object>.<hex UnixNano>, unique even when the clock did not move
    name, _, nanos = first["metadata"]["name"].partition(".")
    assert name == "pv1"
    assert int(nanos, 16) == int(clock.now().timestamp()) * 10**9
    assert second["metadata"]["name"] != first["metadata"]["name"]
    assert first["source"] == {"component": "comp", "host": "node-1"}
    assert first["reportingComponent"] == "comp"
    assert first["reportingInstance"] == "node-1"
    assert first["firstTimestamp"] == first["lastTimestamp"] == "2026-01-01T00:00:00Z"
    assert len(first["message"].encode()) == MAX_MESSAGE_BYTES
    assert first["count"] == 1

"""The helpers that replaced copies of the same code (issue 29's duplicates), tested directly:
each used to be written out in two to seven places, so a bug here now hits all of them."""

from __future__ import annotations

import argparse
import asyncio
import math

import pytest

from pyprovlib.kube._objects import (
    as_mapping,
    is_dns1123_label,
    is_dns1123_subdomain,
    mapping_field,
)
from pyprovlib.kube._rest import list_query, watch_query
from pyprovlib.kube._workqueue import WorkQueue, run_worker
from pyprovlib.runtime._flag_values import parse_qps


@pytest.mark.parametrize(
    ("value", "label", "subdomain"),
    [
        ("a", True, True),
        ("pvc-1234", True, True),
        ("csi.example.com", False, True),
        ("0abc", True, True),
        ("-abc", False, False),
        ("abc-", False, False),
        ("ABC", False, False),
        ("a_b", False, False),
        ("", False, False),
        ("a..b", False, False),
        ("a" * 63, True, True),
        ("a" * 64, False, True),
        (".".join(["a" * 63] * 4)[:253], False, True),
        ("a" * 254, False, False),
    ],
)
def test_dns1123_names_follow_apimachinery(value: str, label: bool, subdomain: bool) -> None:
    assert is_dns1123_label(value) is label
    assert is_dns1123_subdomain(value) is subdomain


def test_a_field_is_read_as_a_mapping_only_when_it_is_one() -> None:
    obj = {"spec": {"a": 1}, "status": "broken", "list": [1, 2]}
    assert mapping_field(obj, "spec") == {"a": 1}
    assert mapping_field(obj, "status") == {}
    assert mapping_field(obj, "list") == {}
    assert mapping_field(obj, "missing") == {}
    assert as_mapping(None) == {}
    assert as_mapping({"x": 1}) == {"x": 1}


def test_list_and_watch_queries_send_only_what_is_set() -> None:
    assert list_query() == []
    assert list_query(limit=0, resource_version="") == [("resourceVersion", "")]
    assert list_query(
        label_selector="a=b", field_selector="f=g", limit=500, continue_="tok", resource_version="7"
    ) == [
        ("labelSelector", "a=b"),
        ("fieldSelector", "f=g"),
        ("limit", "500"),
        ("continue", "tok"),
        ("resourceVersion", "7"),
    ]
    assert watch_query() == [("watch", "true"), ("allowWatchBookmarks", "true")]
    assert watch_query(resource_version="9", timeout_seconds=0, allow_bookmarks=False) == [
        ("watch", "true"),
        ("resourceVersion", "9"),
        ("timeoutSeconds", "0"),
    ]


@pytest.mark.parametrize(("text", "value"), [("5", 5.0), ("0.5", 0.5), ("inf", math.inf)])
def test_qps_parses_go_floats(text: str, value: float) -> None:
    assert parse_qps(text) == value


@pytest.mark.parametrize("text", ["nan", "five", ""])
def test_qps_refuses_what_no_limiter_can_use(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_qps(text)


async def test_a_worker_processes_each_item_and_marks_it_done() -> None:
    queue: WorkQueue[str] = WorkQueue()
    seen: list[str] = []

    async def process(item: str) -> None:
        seen.append(item)
        if len(seen) == 3:
            queue.shut_down()

    for item in ("a", "b", "c"):
        queue.add(item)
    await asyncio.wait_for(run_worker(queue, process), 10)
    assert seen == ["a", "b", "c"]
    assert len(queue) == 0
    queue.add("a")  # done() was called: after shutdown nothing is queued, nothing is stuck
    assert len(queue) == 0


async def test_a_failing_item_is_still_marked_done_and_ends_the_worker() -> None:
    queue: WorkQueue[str] = WorkQueue()

    async def process(item: str) -> None:
        raise RuntimeError(item)

    queue.add("x")
    with pytest.raises(RuntimeError, match="x"):
        await asyncio.wait_for(run_worker(queue, process), 10)
    queue.add("x")  # not still marked processing: it is queued again
    assert len(queue) == 1


async def test_a_set_stop_event_takes_no_further_item() -> None:
    queue: WorkQueue[str] = WorkQueue()
    stop = asyncio.Event()
    seen: list[str] = []

    async def process(item: str) -> None:
        seen.append(item)
        stop.set()

    queue.add("a")
    queue.add("b")
    await asyncio.wait_for(run_worker(queue, process, stop=stop), 10)
    assert seen == ["a"]
    assert len(queue) == 1

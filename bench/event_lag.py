"""Run ``provision.py`` or ``csi_provision.py`` unchanged, and also watch the run's Events: how
many the controller wrote (Provisioning and ProvisioningSucceeded, created or counted up), how
many of them before the last PV, and how long after the last PV the last one was written.

The event recorder writes in the background; with its writers yielding to the controller's
work (``EventRecorder(busy=...)``), most of a burst's events are written after its last PV.
These figures show what that costs the events, next to what it gains the claims (p99
claim→PV, CPU per 1,000 from the wrapped bench). Run it with ``PYTHONPATH=<tree>/src`` to
measure another tree's library with the same bench scripts.

Usage::

    python bench/event_lag.py provision.py --volumes 1000 --threadiness 32
    python bench/event_lag.py csi_provision.py --volumes 1000 --threadiness 16

Prints the wrapped bench's lines, then exactly one line of JSON: its figures plus
``events_written``, ``events_before_last_pv`` and ``events_last_after_last_pv_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import io
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
REASONS = ("Provisioning", "ProvisioningSucceeded")


def _load(script: str) -> Any:
    path = HERE.with_name(script)
    spec = importlib.util.spec_from_file_location(f"bench_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


OBSERVERS: list[Any] = []


def _event_observer(base: type) -> type:
    class EventObserver(base):  # type: ignore[misc,valid-type]
        """The bench's Observer, also timestamping every write of the run's events."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.event_writes: list[float] = []  # monotonic time of each create or count-up
            self.event_names: set[str] = set()
            OBSERVERS.append(self)

        async def watch_claims(self) -> None:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self.watch_events())
                await super().watch_claims()

        async def watch_events(self) -> None:
            from pyprovlib.kube._resources import EVENTS

            async for now, event in self.watch(EVENTS, self.namespace):
                obj = event["object"]
                if event["type"] not in ("ADDED", "MODIFIED"):
                    continue
                if obj.get("reason") not in REASONS:
                    continue
                self.event_writes.append(now)
                self.event_names.add(obj["metadata"]["name"])

    return EventObserver


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in ("provision.py", "csi_provision.py"):
        raise SystemExit(__doc__)
    script = sys.argv[1]
    bench = _load(script)
    # csi_provision.py drives through provision.py's driver half, which it loads itself.
    driver = bench.provision if script == "csi_provision.py" else bench
    driver.Observer = _event_observer(driver.Observer)
    sys.argv = [str(HERE.with_name(script)), *sys.argv[2:]]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        bench.main()
    lines = out.getvalue().splitlines()
    result = json.loads(lines[-1])
    for line in lines[:-1]:
        print(line)
    (observer,) = OBSERVERS
    last_pv = max(observer.pv_seen.values())
    writes = sorted(observer.event_writes)
    result["events_written"] = len(writes)
    result["events_objects"] = len(observer.event_names)
    result["events_before_last_pv"] = sum(t <= last_pv for t in writes)
    result["events_last_after_last_pv_s"] = round(writes[-1] - last_pv, 3) if writes else None
    print(
        f"events: {len(writes)} written, {result['events_before_last_pv']} before the last PV, "
        f"the last {result['events_last_after_last_pv_s']} s after it"
    )
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()

"""Changes to measure before they are made, for ``csi_real.py --peers py+NAME``.

Each variant reproduces, inside the Python sidecar's process, the effect of a change proposed
for a file this bench does not own, so it can be measured against the unchanged code in the
same run (interleaved) before the change is made where it belongs.

- ``noconv``: ``CSIProvisioner.provision`` reads the claim and its class as the cached JSON
  (``options.claim_object`` / ``options.storage_class_object``) instead of converting them to
  models and back, and returns the PV as its JSON mapping (which ``Provisioner.provision`` may
  return) instead of a model the controller converts back to JSON: the object convention of
  issue 20 for the built-in CSI backends ("which then convert nothing").
- ``quietlogs``: a disabled ``debug``/``info`` call on a pyprovlib logger returns before
  structlog builds the record (``BoundLogger.isEnabledFor``, stdlib's cached level check), as a
  level-checking wrapper class in ``pyprovlib._logging.get_logger`` would (which would also keep
  ``structlog.testing.capture_logs`` seeing every record).
- ``writers1`` / ``writers4`` / ``writers8`` / ``writers16``: the event recorder writes with
  that many writers instead of its default (16 for a recorder of its own, 4 in the
  controllers since issue 31; client-go's recorder writes from one goroutine).
- ``tracemalloc`` / ``modules``: at exit, the largest allocation sites
  (``$CSI_REAL_TRACEMALLOC``) / the modules loaded, by package (``$CSI_REAL_MODULES``).
- ``heappeak``: Python allocations traced (tracemalloc, slow: for where memory goes, not for
  timings), and the largest allocation sites, by line, written to ``$CSI_REAL_HEAPPEAK`` as they
  were when the traced memory peaked (checked every 0.5 s): what the peak RSS holds.
- ``busy0``: the event writers all hold back while claims wait for a worker (``busy_writers``
  0 instead of 1; above ``hold_limit`` waiting events they write regardless).
- ``noevents``: events discarded instead of written: the upper bound of what writing them
  costs the provisioning (measurement only).
- ``gcstats``: every cyclic garbage collection timed, by generation, written to
  ``$CSI_REAL_GCSTATS`` at exit.
- ``looplag``: how late a 5 ms periodic callback runs, per second, written to
  ``$CSI_REAL_LOOPLAG`` at exit (the event loop's saturation during the burst).
- ``eager``: kubernetes-asyncio's generated modules all imported at start-up, as a script
  importing it does (the sidecar otherwise loads them lazily, as ``python -m`` does).
- ``switch1`` / ``switch02``: ``sys.setswitchinterval`` 1 ms / 0.2 ms instead of 5 ms (how
  long a worker thread back from a file-system call may wait for the GIL while the loop runs).
- ``nothreads``: ``asyncio.to_thread`` runs the call on the event loop (measurement only): the
  upper bound of what the NFS example's thread trips cost.
- ``pool16`` / ``pool32`` / ``pool64`` / ``pool100``: kubernetes-asyncio's
  ``Configuration.connection_pool_maxsize`` (the aiohttp connector's limit; 100 by default,
  ``ClientSettings.max_connections`` where the tree has it) at that size.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any


class _JsonOptions:
    """``ProvisionOptions`` whose ``pvc`` / ``storage_class`` are the JSON forms."""

    def __init__(self, options: Any) -> None:
        self._options = options

    def __getattr__(self, name: str) -> Any:
        if name == "pvc":
            return self._options.claim_object
        if name == "storage_class":
            return self._options.storage_class_object
        return getattr(self._options, name)


def _noconv() -> None:
    from kubernetes_asyncio.client import V1PersistentVolume

    import pyprovlib.csi.provisioner._controller as module

    from_model = module.from_model
    to_model = module.to_model
    provision = module.CSIProvisioner.provision

    def json_from_model(model: Any) -> Any:
        return model if isinstance(model, Mapping) else from_model(model)

    def json_to_model(obj: Any, cls: Any) -> Any:
        return obj if cls is V1PersistentVolume else to_model(obj, cls)

    @functools.wraps(provision)
    async def json_provision(self: Any, options: Any) -> Any:
        return await provision(self, _JsonOptions(options))

    module.from_model = json_from_model  # type: ignore[assignment]
    module.to_model = json_to_model  # type: ignore[assignment]
    module.CSIProvisioner.provision = json_provision  # type: ignore[method-assign]


def _quietlogs() -> None:
    import logging

    import structlog

    cls = structlog.stdlib.BoundLogger
    debug = cls.debug
    info = cls.info

    @functools.wraps(debug)
    def quiet_debug(self: Any, event: str | None = None, *args: Any, **kw: Any) -> Any:
        if not self.isEnabledFor(logging.DEBUG):
            return None
        return debug(self, event, *args, **kw)

    @functools.wraps(info)
    def quiet_info(self: Any, event: str | None = None, *args: Any, **kw: Any) -> Any:
        if not self.isEnabledFor(logging.INFO):
            return None
        return info(self, event, *args, **kw)

    cls.debug = quiet_debug  # type: ignore[method-assign]
    cls.info = quiet_info  # type: ignore[method-assign]


def _writers(count: int) -> None:
    from pyprovlib.kube._events import EventRecorder

    init = EventRecorder.__init__

    @functools.wraps(init)
    def fewer_writers(self: Any, *args: Any, **kwargs: Any) -> None:
        kwargs["writers"] = count
        init(self, *args, **kwargs)

    EventRecorder.__init__ = fewer_writers  # type: ignore[method-assign]


def _clientgo_events() -> None:
    """client-go's event sink: one writer and a 1,000-event buffer that drops when full
    (``watch.NewLongQueueBroadcaster(1000, DropIfChannelFull)``), instead of 16 writers and
    2,000 events."""
    from pyprovlib.kube._events import EventRecorder

    init = EventRecorder.__init__

    @functools.wraps(init)
    def clientgo(self: Any, *args: Any, **kwargs: Any) -> None:
        kwargs["writers"] = 1
        kwargs["max_buffer"] = 1000
        init(self, *args, **kwargs)

    EventRecorder.__init__ = clientgo  # type: ignore[method-assign]


def _busy_writers(count: int) -> None:
    """The recorder's writers while the controller has claims waiting for a worker:
    ``busy_writers`` (default 1; 0 holds every event back until the queue runs dry or
    ``hold_limit`` events wait)."""
    from pyprovlib.kube._events import EventRecorder

    init = EventRecorder.__init__

    @functools.wraps(init)
    def held(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.busy_writers = count

    EventRecorder.__init__ = held  # type: ignore[method-assign]


def _noevents() -> None:
    """Upper bound of what writing events costs the provisioning: every event is taken
    from the buffer and discarded without a request (not a behaviour to adopt)."""
    from pyprovlib.kube._events import EventRecorder

    async def discard(self: Any, event: Any) -> None:
        return None

    EventRecorder._record = discard  # type: ignore[method-assign]


def _tracemalloc() -> None:
    """Trace Python allocations (slow: for where memory goes, not for timings) and write the
    50 largest allocation sites, by file, to ``$CSI_REAL_TRACEMALLOC`` at exit."""
    import atexit
    import os
    import tracemalloc

    tracemalloc.start(1)

    def dump() -> None:
        snapshot = tracemalloc.take_snapshot()
        path = os.environ.get("CSI_REAL_TRACEMALLOC", "tracemalloc.txt")
        with open(path, "w") as out:
            total = sum(stat.size for stat in snapshot.statistics("filename"))
            out.write(f"traced {total / 2**20:.1f} MiB\n")
            for stat in snapshot.statistics("filename")[:50]:
                out.write(f"{stat.size / 2**20:8.2f} MiB {stat.count:9d} {stat.traceback}\n")

    atexit.register(dump)


def _heappeak() -> None:
    """tracemalloc's largest allocation sites at the traced peak (see the module docstring)."""
    import os
    import threading
    import time
    import tracemalloc

    tracemalloc.start(3)
    path = os.environ.get("CSI_REAL_HEAPPEAK", "heappeak.txt")
    best = [0]

    def watch() -> None:
        while True:
            time.sleep(0.5)
            current, _ = tracemalloc.get_traced_memory()
            if current < best[0] + 2**20:
                continue
            best[0] = current
            stats = tracemalloc.take_snapshot().statistics("lineno")
            with open(path, "w") as out:
                out.write(f"traced {current / 2**20:.1f} MiB\n")
                for stat in stats[:60]:
                    out.write(f"{stat.size / 2**20:8.2f} MiB {stat.count:9d} {stat.traceback}\n")

    threading.Thread(target=watch, daemon=True, name="heappeak").start()


def _modules() -> None:
    """Write how many modules the process loaded, by top-level package (and kubernetes-asyncio's
    generated models and APIs apart), to ``$CSI_REAL_MODULES`` at exit: what the imports hold."""
    import atexit
    import collections
    import os
    import sys

    def dump() -> None:
        names = list(sys.modules)
        by_package = collections.Counter(name.split(".")[0] for name in names)
        models = [n for n in names if n.startswith("kubernetes_asyncio.client.models.")]
        apis = [n for n in names if n.startswith("kubernetes_asyncio.client.api.")]
        path = os.environ.get("CSI_REAL_MODULES", "modules.txt")
        with open(path, "w") as out:
            out.write(f"{len(names)} modules, {len(models)} k8s models, {len(apis)} k8s APIs\n")
            out.write(" ".join(sorted(n.rsplit(".", 1)[1] for n in apis)) + "\n")
            for package, count in by_package.most_common():
                out.write(f"{count:6d} {package}\n")

    atexit.register(dump)


def _pool(size: int) -> None:
    from kubernetes_asyncio.client import Configuration

    init = Configuration.__init__

    @functools.wraps(init)
    def smaller_pool(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.connection_pool_maxsize = size

    Configuration.__init__ = smaller_pool  # type: ignore[method-assign]

    # Trees whose new_client sets the pool from ClientSettings.max_connections: the client's
    # configuration is set just before its connector is made.
    from pyprovlib.kube import _config as config

    client_init = config.LimitedApiClient.__init__

    @functools.wraps(client_init)
    def sized_client(self: Any, configuration: Any, *args: Any, **kwargs: Any) -> None:
        configuration.connection_pool_maxsize = size
        client_init(self, configuration, *args, **kwargs)

    config.LimitedApiClient.__init__ = sized_client  # type: ignore[method-assign]


def _gcstats() -> None:
    """Time every garbage collection, by generation, and write the totals (count, wall and
    CPU seconds, objects collected, the longest pause) to ``$CSI_REAL_GCSTATS`` at exit: how
    much of the sidecar's CPU and of its tail the cyclic collector takes."""
    import atexit
    import gc
    import os
    import time

    started: list[float] = [0.0, 0.0]
    totals = {g: [0, 0.0, 0.0, 0, 0.0] for g in range(3)}

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
            started[1] = time.process_time()
            return
        wall = time.perf_counter() - started[0]
        row = totals[info["generation"]]
        row[0] += 1
        row[1] += wall
        row[2] += time.process_time() - started[1]
        row[3] += info["collected"]
        row[4] = max(row[4], wall)

    gc.callbacks.append(callback)

    def dump() -> None:
        path = os.environ.get("CSI_REAL_GCSTATS", "gcstats.txt")
        cpu = time.process_time()
        with open(path, "w") as out:
            out.write(f"process CPU {cpu:.3f} s, thresholds {gc.get_threshold()}\n")
            for generation, (count, wall, gc_cpu, collected, longest) in totals.items():
                out.write(
                    f"gen{generation}: {count} collections, {wall:.3f} s wall, "
                    f"{gc_cpu:.3f} s CPU ({100 * gc_cpu / cpu:.1f} %), {collected} collected, "
                    f"longest {1000 * longest:.1f} ms\n"
                )

    atexit.register(dump)


def _looplag() -> None:
    """Measure how late the event loop runs a callback due every 5 ms (the time a ready
    task waits for the loop: its queue of ready callbacks plus the OS's scheduling), and
    write the distribution over time (per second: samples, p50/p99/max lateness, the share of
    wall time the loop was busy) to ``$CSI_REAL_LOOPLAG`` at exit."""
    import asyncio
    import atexit
    import os
    import time

    samples: list[tuple[float, float]] = []
    period = 0.005

    async def probe() -> None:
        while True:
            due = time.perf_counter() + period
            await asyncio.sleep(period)
            now = time.perf_counter()
            samples.append((now, now - due))

    start = asyncio.BaseEventLoop.run_forever

    @functools.wraps(start)
    def run_forever(self: Any) -> Any:
        task = self.create_task(probe())
        try:
            return start(self)
        finally:
            task.cancel()

    asyncio.BaseEventLoop.run_forever = run_forever  # type: ignore[method-assign]

    def dump() -> None:
        path = os.environ.get("CSI_REAL_LOOPLAG", "looplag.txt")
        if not samples:
            return
        origin = samples[0][0]
        buckets: dict[int, list[float]] = {}
        for at, late in samples:
            buckets.setdefault(int(at - origin), []).append(late)
        with open(path, "w") as out:
            for second, lates in sorted(buckets.items()):
                lates.sort()
                p50 = lates[len(lates) // 2]
                p99 = lates[min(len(lates) - 1, int(len(lates) * 0.99))]
                out.write(
                    f"{second:5d} n={len(lates):4d} p50={1000 * p50:7.1f}ms "
                    f"p99={1000 * p99:7.1f}ms max={1000 * lates[-1]:7.1f}ms\n"
                )

    atexit.register(dump)


def _uvloop() -> None:
    import asyncio

    import uvloop  # not a pyprovlib dependency: `pip install uvloop` to measure this variant

    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def _switch_interval(seconds: float) -> None:
    """How long the thread holding the GIL keeps it before one waiting is let in (5 ms by
    default): a worker thread back from ``mkdir`` waits that long while the event loop is busy."""
    import sys

    sys.setswitchinterval(seconds)


def _nothreads() -> None:
    """``asyncio.to_thread`` runs the function on the event loop (measurement only: blocking
    file-system calls belong in a thread): the upper bound of what the NFS example's thread trips
    cost."""
    import asyncio

    async def inline(function: Any, /, *args: Any, **kwargs: Any) -> Any:
        return function(*args, **kwargs)

    asyncio.to_thread = inline


VARIANTS = {
    "pool16": functools.partial(_pool, 16),
    "pool32": functools.partial(_pool, 32),
    "pool64": functools.partial(_pool, 64),
    "pool100": functools.partial(_pool, 100),
    "noconv": _noconv,
    "quietlogs": _quietlogs,
    "writers1": functools.partial(_writers, 1),
    "writers4": functools.partial(_writers, 4),
    "writers8": functools.partial(_writers, 8),
    "writers16": functools.partial(_writers, 16),
    "uvloop": _uvloop,
    "clientgoevents": _clientgo_events,
    "tracemalloc": _tracemalloc,
    "modules": _modules,
    "heappeak": _heappeak,
    "busy0": functools.partial(_busy_writers, 0),
    "noevents": _noevents,
    "gcstats": _gcstats,
    "looplag": _looplag,
    "switch1": functools.partial(_switch_interval, 0.001),
    "switch02": functools.partial(_switch_interval, 0.0002),
    "nothreads": _nothreads,
    # Handled by csi_real.py before anything is imported: kubernetes-asyncio loaded as a
    # script loads it (every generated module at start-up), not as `python -m` does.
    "eager": lambda: None,
}


def install(names: list[str]) -> None:
    for name in names:
        VARIANTS[name]()

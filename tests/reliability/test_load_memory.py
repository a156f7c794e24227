"""Load: bursts of claims across many namespaces, and memory flat once they are gone (issue 11).

The in-memory API server runs in its own process (``python -m pyprovlib.testing``), so this
process holds only the ProvisionController (informers, queues, event recorder and correlator,
metrics) and the test's client. Two identical bursts run back to back — create N claims across
M namespaces, wait until all are Bound, delete them, wait until every PV and asset is gone. After
the first burst the bounded caches are full (the event correlator's LRUs, for instance); after
the second nothing may have grown: traced Python memory (tracemalloc, after gc) and RSS stay
within a small margin, the informer stores, queues and claims-in-progress are empty, and the
metrics have the same label sets.

Default: 2 x 200 claims across 10 namespaces; ``-m slow``: 2 x 10,000 claims across 100. Both
bound the event correlator's LRUs below client-go's 4,096 (128 and 1,024) so that the first
burst fills them; with 4,096 a 10,000-claim burst leaves them ~80 % full, and the second burst's
filling them (~1.1 MB, bounded) would hide a leak elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import re
import sys
import time
import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from kubernetes_asyncio.client import ApiClient, Configuration
from kubernetes_asyncio.config import load_kube_config
from prometheus_client import CollectorRegistry, generate_latest
from rel_support import (
    PROVISIONER,
    Backend,
    BackendProvisioner,
    create_claims,
    create_class,
    create_namespace,
    delete_claims,
    fast_options,
    running,
    unique,
)

from pyprovlib import testing
from pyprovlib.controller._metrics import ProvisionMetrics
from pyprovlib.controller._provision import ProvisionController
from pyprovlib.kube._events import CorrelatorOptions, EventCorrelator
from pyprovlib.kube._resources import PERSISTENT_VOLUME_CLAIMS, PERSISTENT_VOLUMES
from pyprovlib.kube._rest import ResourceClient


@contextlib.asynccontextmanager
async def server_process(tmp_path: Path) -> AsyncIterator[ApiClient]:
    kubeconfig = tmp_path / "kubeconfig"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "pyprovlib.testing",
        "--port",
        "0",
        "--kubeconfig",
        str(kubeconfig),
        "--watch-window",
        "100000",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    drain: asyncio.Task[bytes] | None = None
    try:
        assert proc.stdout is not None
        async with asyncio.timeout(30):
            line = b""
            while not line.startswith(b"pyprovlib apiserver listening"):
                line = await proc.stdout.readline()
                assert line, "the API server process exited"
        # Its log lines keep coming: drain them so the pipe never fills.
        drain = asyncio.create_task(proc.stdout.read())
        config = Configuration()
        await load_kube_config(config_file=str(kubeconfig), client_configuration=config)
        async with ApiClient(configuration=config) as client:
            yield client
    finally:
        proc.terminate()
        async with asyncio.timeout(15):
            await proc.wait()
        if drain is not None:
            with contextlib.suppress(Exception):
                await drain


async def count(client: ApiClient, resource: object, label: str = "") -> tuple[int, int]:
    """(objects, Bound ones) of a resource, listed page by page."""
    api = ResourceClient(client, resource)  # type: ignore[arg-type]
    total = bound = 0
    token: str | None = None
    while True:
        page = await api.list(limit=2000, continue_=token)
        for item in page["items"]:
            if label and item["spec"].get("storageClassName") != label:
                continue
            total += 1
            bound += item.get("status", {}).get("phase") == "Bound"
        token = page["metadata"].get("continue")
        if not token:
            return total, bound


async def poll(check: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        ok, detail = await check()  # type: ignore[operator]
        if ok:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}: {detail}")
        await asyncio.sleep(1.0)


def rss_mb() -> float:
    text = Path("/proc/self/status").read_text()
    match = re.search(r"VmRSS:\s+(\d+) kB", text)
    return int(match.group(1)) / 1024 if match else 0.0


def label_sets(registry: CollectorRegistry) -> set[str]:
    return {
        line.split(" ")[0]
        for line in generate_latest(registry).decode().splitlines()
        if line and not line.startswith("#")
    }


async def load_scenario(
    tmp_path: Path, namespaces: int, per_namespace: int, correlator_size: int | None = None
) -> dict[str, float]:
    total = namespaces * per_namespace
    async with server_process(tmp_path) as client:
        ns_names = [unique("load") for _ in range(namespaces)]
        for ns in ns_names:
            await create_namespace(client, ns)
        class_name = await create_class(client, reclaimPolicy="Delete")
        backend = Backend()
        registry = CollectorRegistry()
        controller = ProvisionController(
            client,
            PROVISIONER,
            BackendProvisioner(backend),
            fast_options(metrics=ProvisionMetrics(registry), workers=16),
        )
        figures: dict[str, float] = {}
        if correlator_size is not None:
            # The correlator's LRUs hold 4,096 entries each (client-go's default), full only
            # after ~2,000 claims; a small bound lets a small burst fill them too.
            old = controller.recorder.correlator
            controller.recorder.correlator = EventCorrelator(
                clock=old._clock,
                options=CorrelatorOptions(cache_size=correlator_size),
                name_factory=old._name_factory,
            )
        # Log records go through stdlib logging, where pytest's capture handler keeps every
        # one for the report: that is the test harness's memory, not the controller's.
        library_logger = logging.getLogger("pyprovlib")
        library_level = library_logger.level
        library_logger.setLevel(logging.WARNING)
        tracemalloc.start()
        try:
            async with running(controller):

                async def burst(n: int) -> None:
                    start = time.monotonic()
                    keys = await create_claims(client, ns_names, per_namespace, class_name)

                    async def bound() -> tuple[bool, str]:
                        claims, ok = await count(client, PERSISTENT_VOLUME_CLAIMS)
                        return ok == total and claims == total, f"{ok}/{total} Bound"

                    await poll(bound, 60 + total / 10, "claims Bound")
                    assert len(backend.assets) == total
                    figures[f"burst{n}_provision_s"] = round(time.monotonic() - start, 1)
                    await delete_claims(client, keys)

                    async def gone() -> tuple[bool, str]:
                        pvs, _ = await count(client, PERSISTENT_VOLUMES, class_name)
                        claims, _ = await count(client, PERSISTENT_VOLUME_CLAIMS)
                        return (
                            pvs == 0 and claims == 0 and not backend.assets,
                            f"{pvs} PVs, {claims} claims, {len(backend.assets)} assets",
                        )

                    await poll(gone, 60 + total / 10, "everything deleted")
                    figures[f"burst{n}_total_s"] = round(time.monotonic() - start, 1)
                    # The test backend's own bookkeeping (one PV name per claim) is not the
                    # controller's memory.
                    backend.creations.clear()
                    backend.in_flight.clear()
                    # The informers have caught up with the deletions, and the controller
                    # has done (and the event recorder written) all they caused.
                    await testing.eventually(
                        lambda: (
                            not controller.claim_informer.store.list()
                            and not [
                                v
                                for v in controller.volume_informer.store.list()
                                if v["spec"].get("storageClassName") == class_name
                            ]
                        ),
                        timeout=30,
                        message="the controller's caches to empty",
                    )
                    await testing.wait_idle(controller)

                gc.collect()
                figures["baseline_mb"] = tracemalloc.get_traced_memory()[0] / 2**20
                figures["baseline_rss_mb"] = rss_mb()
                await burst(1)
                gc.collect()
                figures["after_1_mb"] = tracemalloc.get_traced_memory()[0] / 2**20
                figures["after_1_rss_mb"] = rss_mb()
                labels_1 = label_sets(registry)
                snapshot_1 = tracemalloc.take_snapshot()
                await burst(2)
                gc.collect()
                figures["after_2_mb"] = tracemalloc.get_traced_memory()[0] / 2**20
                figures["after_2_rss_mb"] = rss_mb()
                figures["peak_mb"] = tracemalloc.get_traced_memory()[1] / 2**20
                snapshot_2 = tracemalloc.take_snapshot()
                labels_2 = label_sets(registry)
                print("load figures (raw):", figures)

                # Nothing of the claims remains in the controller's own structures.
                assert len(controller.claim_queue) == 0
                assert len(controller.volume_queue) == 0
                assert controller.claim_informer.store.list() == []
                assert controller.claims_in_progress() == frozenset()
                # The event correlator's caches are LRUs: full, never beyond their bound.
                correlator = controller.recorder.correlator
                size = correlator.options.cache_size
                for cache in (correlator._spam, correlator._aggregates, correlator._logs):
                    assert len(cache._data) <= size
                figures["correlator_entries"] = len(correlator._logs._data)
                if correlator_size is not None:
                    # The small bound is there to be filled: then nothing may grow at all.
                    assert figures["correlator_entries"] == size, "the correlator never filled"
                assert labels_2 == labels_1, sorted(labels_2 ^ labels_1)[:10]
        finally:
            tracemalloc.stop()
            library_logger.setLevel(library_level)
        growth = figures["after_2_mb"] - figures["after_1_mb"]
        top = "\n".join(
            str(d) for d in snapshot_2.compare_to(snapshot_1, "lineno")[:8] if d.size_diff > 0
        )
        figures["growth_mb"] = growth
        for key in list(figures):
            figures[key] = round(figures[key], 3)
        print("load figures:", figures)
        # Flat: the second burst leaves at most 0.25 MB + 1 % of the peak behind — a leak of
        # one claim-sized object per claim (~3 KB) would be 0.6 MB at 200 claims.
        allowed = 0.25 + 0.01 * figures["peak_mb"]
        assert growth <= allowed, f"traced memory grew {growth:.2f} MB (> {allowed:.2f}):\n{top}"
        rss_growth = figures["after_2_rss_mb"] - figures["after_1_rss_mb"]
        assert rss_growth <= max(10.0, 0.1 * figures["after_1_rss_mb"]), figures
        return figures


@pytest.mark.parametrize(
    ("namespaces", "per_namespace", "correlator_size"),
    [
        pytest.param(10, 20, 128, marks=pytest.mark.heavy, id="200-claims"),
        pytest.param(100, 100, 1024, marks=pytest.mark.slow, id="10000-claims"),
    ],
)
async def test_burst_then_memory_flat(
    tmp_path: Path, namespaces: int, per_namespace: int, correlator_size: int
) -> None:
    await load_scenario(
        tmp_path,
        namespaces=namespaces,
        per_namespace=per_namespace,
        correlator_size=correlator_size,
    )

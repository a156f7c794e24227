"""Informers against the in-memory API server over HTTP: convergence under watch drops,
compaction (410 → relist), 5xx/429 bursts and restarts; shared LIST+WATCH; late handlers;
clean shutdown with the owning task group."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import pytest
from claim_support import volume_body
from kubernetes_asyncio.client import ApiClient

from pyprovlib.kube._informer import SharedInformer, SharedInformerFactory
from pyprovlib.kube._objects import Obj, meta_namespace_key
from pyprovlib.kube._resources import NAMESPACES, PERSISTENT_VOLUME_CLAIMS, PERSISTENT_VOLUMES
from pyprovlib.kube._rest import ResourceClient
from pyprovlib.kube._store import DeletedFinalStateUnknown
from pyprovlib.testing._server import ApiServer

PVC = "persistentvolumeclaims"


def claim(name: str, ns: str = "default") -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }


class ConsistencyRecorder:
    """A handler that keeps its own view and checks the stream makes sense as it goes."""

    def __init__(self) -> None:
        self.view: dict[str, str] = {}
        self.errors: list[str] = []
        self.deleted: set[str] = set()
        self.seen: set[str] = set()
        self.tombstones = 0
        self.adds = 0

    def on_add(self, obj: Obj) -> None:
        key = meta_namespace_key(obj)
        if key in self.view:
            self.errors.append(f"add of {key} already in view")
        self.view[key] = obj["metadata"]["resourceVersion"]
        self.seen.add(key)
        self.adds += 1

    def on_update(self, old: Obj, new: Obj) -> None:
        key = meta_namespace_key(new)
        if self.view.get(key) != old["metadata"]["resourceVersion"]:
            self.errors.append(
                f"update of {key}: old {old['metadata']['resourceVersion']} "
                f"but view has {self.view.get(key)}"
            )
        self.view[key] = new["metadata"]["resourceVersion"]

    def on_delete(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        if isinstance(obj, DeletedFinalStateUnknown):
            key = obj.key
            self.tombstones += 1
        else:
            key = meta_namespace_key(obj)
        if key not in self.view:
            self.errors.append(f"delete of {key} not in view")
        self.view.pop(key, None)
        self.deleted.add(key)


async def until(cond: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def rv_map(objs: list[Obj]) -> dict[str, str]:
    return {meta_namespace_key(o): o["metadata"]["resourceVersion"] for o in objs}


async def test_informer_converges_under_drops_compaction_and_error_bursts(
    apiserver: ApiServer, kube_client: ApiClient, task_group: asyncio.TaskGroup
) -> None:
    rng = random.Random(7)
    pvcs = ResourceClient(kube_client, PERSISTENT_VOLUME_CLAIMS)
    for i in range(30):
        await pvcs.create(claim(f"c{i}"))
    # Small pages, so relists (at a resourceVersion: the server paginates) use continue tokens.
    factory = SharedInformerFactory(kube_client, backoff_initial=0.02, backoff_cap=0.2, page_size=7)
    informer = factory.informer_for(PERSISTENT_VOLUME_CLAIMS)
    rec = ConsistencyRecorder()
    informer.add_event_handler(rec.on_add, rec.on_update, rec.on_delete)
    factory.start(task_group)
    assert await factory.wait_for_cache_sync(timeout=10)
    assert len(rec.view) == 30

    live = {f"c{i}" for i in range(30)}
    deleted: set[str] = set()
    counter = 30
    chaos = {"drop": 0, "compact": 0, "list5xx": 0, "watch429": 0, "watch5xx": 0}

    async def mutate(round_: int) -> None:
        nonlocal counter
        for _ in range(rng.randint(2, 5)):
            op = rng.random()
            if op < 0.4 or not live:
                name = f"c{counter}"
                counter += 1
                await pvcs.create(claim(name))
                live.add(name)
            elif op < 0.7:
                name = rng.choice(sorted(live))
                await pvcs.patch(
                    name, {"metadata": {"labels": {"r": str(round_)}}}, namespace="default"
                )
            else:
                name = rng.choice(sorted(live))
                await pvcs.delete(name, "default")
                live.discard(name)
                deleted.add(f"default/{name}")

    for round_ in range(10):
        # Inject each fault into a running watch, not into a reflector still backing off,
        # and after it delivered events (a watch dropped before any event counts as broken).
        await until(lambda: apiserver.open_watches >= 1, "the informer watching again")
        await mutate(round_)
        await asyncio.sleep(rng.uniform(0.0, 0.1))
        fault = round_ % 5
        if fault == 0:
            apiserver.drop_watches()
            chaos["drop"] += 1
        elif fault in (1, 2):
            # The resumed watch is held back while objects change and history is compacted:
            # it asks for a forgotten resourceVersion, gets 410, and the reflector relists.
            apiserver.faults.latency(0.3, verb="watch", resource=PVC, count=1)
            if fault == 2:
                apiserver.faults.fail(500, verb="list", resource=PVC, count=2)
                chaos["list5xx"] += 1
            apiserver.drop_watches()
            await mutate(round_)
            apiserver.compact()
            chaos["compact"] += 1
        elif fault == 3:
            apiserver.faults.fail(429, verb="watch", resource=PVC, count=1, retry_after=1)
            apiserver.drop_watches()
            chaos["watch429"] += 1
        else:
            apiserver.faults.fail(503, verb="watch", resource=PVC, count=2)
            apiserver.drop_watches()
            chaos["watch5xx"] += 1
        await mutate(round_)

    apiserver.faults.clear()

    async def fresh() -> dict[str, str]:
        return rv_map((await pvcs.list())["items"])

    expected = await fresh()
    await until(lambda: rv_map(informer.store.list()) == expected, "store equals a fresh LIST")
    assert rv_map(informer.store.list()) == await fresh()
    assert rec.view == rv_map(informer.store.list())
    assert rec.errors == []
    # every deleted object the handler had seen was reported deleted (event or tombstone)
    assert deleted & rec.seen <= rec.deleted
    assert not (deleted & set(rec.view))
    assert informer.reflector.lists >= 1 + chaos["compact"], "each compaction forces a relist"
    assert apiserver.requests.count("list", PVC) > informer.reflector.lists, "pages were used"


async def test_relist_delivers_tombstones_for_objects_deleted_while_disconnected(
    apiserver: ApiServer, kube_client: ApiClient, task_group: asyncio.TaskGroup
) -> None:
    pvcs = ResourceClient(kube_client, PERSISTENT_VOLUME_CLAIMS)
    for i in range(5):
        await pvcs.create(claim(f"t{i}"))
    factory = SharedInformerFactory(kube_client, backoff_initial=0.05, backoff_cap=0.2)
    informer = factory.informer_for(PERSISTENT_VOLUME_CLAIMS)
    rec = ConsistencyRecorder()
    informer.add_event_handler(rec.on_add, rec.on_update, rec.on_delete)
    # Every watch fails until cleared, so changes can only arrive through a relist.
    apiserver.faults.fail(500, verb="watch", resource=PVC, count=None)
    factory.start(task_group)
    assert await informer.wait_for_sync(timeout=10)
    await pvcs.delete("t1", "default")
    await pvcs.delete("t3", "default")
    await pvcs.create(claim("t9"))
    lists_before = informer.reflector.lists
    await until(lambda: informer.reflector.lists > lists_before, "a relist")
    await until(lambda: "default/t1" not in informer.store, "t1 gone")
    apiserver.faults.clear()
    assert rec.tombstones == 2
    assert sorted(rec.view) == ["default/t0", "default/t2", "default/t4", "default/t9"]
    assert rec.errors == []


async def test_informer_survives_a_server_restart(
    apiserver: ApiServer, kube_client: ApiClient, task_group: asyncio.TaskGroup
) -> None:
    pvs = ResourceClient(kube_client, PERSISTENT_VOLUMES)
    factory = SharedInformerFactory(kube_client, backoff_initial=0.05, backoff_cap=0.2)
    informer = factory.informer_for(PERSISTENT_VOLUMES)
    factory.start(task_group)
    assert await factory.wait_for_cache_sync(timeout=10)
    await apiserver.restart()
    await pvs.create(volume_body("after-restart"))
    await until(lambda: "after-restart" in informer.store, "object created after restart")


async def test_factory_shares_one_list_and_watch_and_late_handlers_get_existing_objects(
    apiserver: ApiServer, kube_client: ApiClient, task_group: asyncio.TaskGroup
) -> None:
    namespaces = ResourceClient(kube_client, NAMESPACES)
    await namespaces.create(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "other"}}
    )
    pvcs = ResourceClient(kube_client, PERSISTENT_VOLUME_CLAIMS)
    for i in range(3):
        await pvcs.create(claim(f"s{i}"))
    await pvcs.create(claim("o1", ns="other"))
    apiserver.requests.reset()

    factory = SharedInformerFactory(kube_client)
    first = factory.informer_for(PERSISTENT_VOLUME_CLAIMS)
    second = factory.informer_for(PERSISTENT_VOLUME_CLAIMS)
    assert first is second
    scoped = factory.informer_for(PERSISTENT_VOLUME_CLAIMS, namespace="other")
    assert scoped is not first
    a, b = ConsistencyRecorder(), ConsistencyRecorder()
    first.add_event_handler(a.on_add, a.on_update, a.on_delete)
    second.add_event_handler(b.on_add, b.on_update, b.on_delete)
    factory.start(task_group)
    factory.start(task_group)  # idempotent: nothing started twice
    assert await factory.wait_for_cache_sync(timeout=10)
    await until(lambda: apiserver.requests.count("watch", PVC) == 2, "two watches")
    assert apiserver.requests.count("list", PVC) == 2  # all namespaces + "other"
    assert len(a.view) == len(b.view) == 4
    assert sorted(scoped.store.list_keys()) == ["other/o1"]

    late = ConsistencyRecorder()
    handle = first.add_event_handler(late.on_add, late.on_update, late.on_delete)
    assert handle.has_synced()
    assert sorted(late.view) == sorted(a.view)
    await pvcs.create(claim("s9"))
    await until(lambda: "default/s9" in late.view and "default/s9" in a.view, "new object")
    assert apiserver.requests.count("list", PVC) == 2

    # an informer requested after start() is started by the next start()
    pv_informer = factory.informer_for(PERSISTENT_VOLUMES)
    assert not pv_informer.started
    factory.start(task_group)
    assert await pv_informer.wait_for_sync(timeout=10)
    assert a.errors == b.errors == late.errors == []


async def test_cancelling_the_task_group_stops_everything(
    apiserver: ApiServer, kube_client: ApiClient
) -> None:
    factory = SharedInformerFactory(kube_client)
    informer: SharedInformer = factory.informer_for(PERSISTENT_VOLUME_CLAIMS)
    informer.add_event_handler(on_add=lambda o: None, resync_period=60)
    before = asyncio.all_tasks()

    async def main() -> None:
        async with asyncio.TaskGroup() as tg:
            factory.start(tg)
            assert await factory.wait_for_cache_sync(timeout=10)
            await until(lambda: apiserver.open_watches == 1, "watch open")
            raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        await main()
    ours = ("informer ", "reflector ", "resync ")
    leftover = [t for t in asyncio.all_tasks() - before if t.get_name().startswith(ours)]
    assert leftover == []
    await until(lambda: apiserver.open_watches == 0, "server-side watch closed")

"""The PV binder's own caches of claims and volumes, and everything it writes: objects, status
updates and Events.

Like pv_controller (``ctrl.claims``, ``ctrl.volumes`` beside the informers), the binder keeps
its own cache of each kind, fed by the informers' handlers and by its own writes, in which an
older version never replaces a newer one (``storeObjectUpdate``): after a write, a late watch
event of the version before it must not make the binder act on stale state.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from pyprovlib._logging import get_logger
from pyprovlib.kube._clock import Clock
from pyprovlib.kube._errors import is_not_found
from pyprovlib.kube._objects import (
    Obj,
    finalizers_of,
    is_deleting,
    name_of,
    namespace_of,
    resource_version,
    uid_of,
)
from pyprovlib.kube._resources import (
    EVENTS,
    PERSISTENT_VOLUME_CLAIMS,
    PERSISTENT_VOLUMES,
    Resource,
)
from pyprovlib.kube._store import Indexer, IndexFunc
from pyprovlib.testing._binder._objects import (
    COMPONENT,
    CURRENT_VAC,
    VAC,
    as_dict,
    as_str,
    copy_obj,
    is_newer,
    quoted,
    storage_quantity,
    str_list,
    timestamp,
)
from pyprovlib.testing._binder._transport import BinderTransport

__all__ = ["BinderApi", "ObjectCache"]

log = get_logger(__name__)

# client-go's event correlator keeps this many entries; we bound our repeat cache the same way.
_EVENT_CACHE_SIZE = 4096


class ObjectCache:
    """The binder's cache of one kind: an :class:`~pyprovlib.kube.Indexer` that keeps
    the newest version it was given of each object, from the informer or from a write, and
    calls ``on_stored`` with every version it takes (the binder queues the key)."""

    def __init__(
        self,
        resource: Resource,
        on_stored: Callable[[Obj], None],
        indexers: Mapping[str, IndexFunc] | None = None,
    ) -> None:
        self.resource = resource
        self.on_stored = on_stored
        self.store = Indexer(indexers=indexers)

    @property
    def cache(self) -> Mapping[str, Obj]:
        """The cached objects by key (read-only)."""
        return dict(self.store.items())

    def get(self, key: str) -> Obj | None:
        return self.store.get_by_key(key)

    def __len__(self) -> int:
        return len(self.store)

    def update(self, obj: Obj) -> None:
        """Store ``obj`` unless the same or a newer version is cached."""
        if not name_of(obj):
            return
        if "kind" not in obj or "apiVersion" not in obj:
            # LIST items carry no kind/apiVersion; events and writes need them. A shallow copy:
            # the informer's objects are shared and never modified.
            obj = {**obj, "kind": self.resource.kind, "apiVersion": self.resource.api_version}
        old = self.store.get(obj)
        if is_newer(obj, old):
            self.store.update(obj)
            self.on_stored(obj)

    def remove(self, obj: Obj) -> Obj | None:
        """Forget ``obj``; the last cached version of it (or None)."""
        if not name_of(obj):
            return None
        old = self.store.get(obj)
        self.store.delete(obj)
        return old


@dataclass
class _EventRecord:
    name: str
    namespace: str
    count: int
    last_emitted: float
    first_timestamp: str


@dataclass(eq=False)
class BinderApi:
    """The binder's requests: writes whose results go into its caches, status updates, reads
    that bypass the caches, and Events with client-go's repeat counting."""

    http: BinderTransport
    clock: Clock
    claims: ObjectCache
    volumes: ObjectCache
    _: KW_ONLY
    event_interval: float
    _events: OrderedDict[tuple[str, str, str, str, str], _EventRecord] = field(
        init=False, default_factory=OrderedDict
    )

    # -- writes ------------------------------------------------------------------------------

    async def write(self, cache: ObjectCache, method: str, path: str, body: Obj) -> Obj:
        try:
            new = await self.http.json(method, path, body=body)
        except ApiException as err:
            if is_not_found(err):
                log.debug("binder: object vanished during write", path=path)
            raise
        new.setdefault("kind", cache.resource.kind)
        new.setdefault("apiVersion", cache.resource.api_version)
        if is_deleting(new) and not finalizers_of(new):
            # The write removed the last finalizer of a deleting object: the server deleted it.
            cache.remove(new)
        else:
            # Remember our own write so a late watch event of the old version does not undo it.
            cache.update(new)
        return new

    async def put_claim(self, claim: Obj) -> Obj:
        return await self.write(
            self.claims,
            "PUT",
            PERSISTENT_VOLUME_CLAIMS.path(namespace_of(claim), name_of(claim)),
            claim,
        )

    async def put_volume(self, volume: Obj) -> Obj:
        return await self.write(
            self.volumes, "PUT", PERSISTENT_VOLUMES.path(name=name_of(volume)), volume
        )

    async def get_claim(self, namespace: str, name: str) -> Obj | None:
        """The claim as the server has it now (None when it does not exist)."""
        if not namespace or not name:
            return None
        try:
            return await self.http.json("GET", PERSISTENT_VOLUME_CLAIMS.path(namespace, name))
        except ApiException as err:
            if is_not_found(err):
                return None
            raise

    async def update_claim_status(self, claim: Obj, phase: str, volume: Obj | None) -> Obj:
        """updateClaimStatus: the phase, and the access modes and capacity of the volume."""
        updated = copy_obj(claim)
        status = updated.get("status")
        if not isinstance(status, dict):
            status = updated["status"] = {}
        dirty = False
        becoming = status.get("phase") != phase
        if becoming:
            status["phase"] = phase
            dirty = True
        if volume is None:
            for field in ("accessModes", "capacity"):
                if status.get(field) is not None:
                    status.pop(field)
                    dirty = True
        else:
            vspec = as_dict(volume.get("spec"))
            modes = str_list(vspec.get("accessModes"))
            if status.get("accessModes") != modes:
                status["accessModes"] = modes
                dirty = True
            storage = as_dict(vspec.get("capacity")).get("storage")
            if storage is None:
                raise ValueError(
                    f"PersistentVolume {quoted(name_of(volume))} is without a storage capacity"
                )
            current = as_dict(status.get("capacity")).get("storage")
            # Like pv_controller's updateClaimStatus: capacity is copied only while the claim
            # becomes Bound. Afterwards a difference is deliberate (a volume expanded on the
            # controller side but not yet on the node keeps the claim's old capacity).
            if becoming and (
                current is None
                or storage_quantity(status.get("capacity"))
                != storage_quantity(vspec.get("capacity"))
            ):
                status["capacity"] = dict(as_dict(vspec.get("capacity")))
                dirty = True
            # Also only while becoming Bound: later, external-resizer's modify controller owns
            # the field, and a PV cache lagging its write must not set it back.
            vac = vspec.get(VAC)
            if becoming and status.get(CURRENT_VAC) != vac:
                if vac is None:
                    status.pop(CURRENT_VAC, None)
                else:
                    status[CURRENT_VAC] = vac
                dirty = True
        if not dirty:
            return claim
        return await self.write(
            self.claims,
            "PUT",
            PERSISTENT_VOLUME_CLAIMS.path(namespace_of(claim), name_of(claim), "status"),
            updated,
        )

    async def update_volume_phase(self, volume: Obj, phase: str, message: str) -> Obj:
        """updateVolumePhase: the phase and its message (none for a healthy phase)."""
        status = as_dict(volume.get("status"))
        if status.get("phase") == phase:
            return volume
        updated = copy_obj(volume)
        new_status: dict[str, Any] = dict(status)
        new_status["phase"] = phase
        if message:
            new_status["message"] = message
        else:
            new_status.pop("message", None)
        new_status["lastPhaseTransitionTime"] = timestamp(self.clock)
        updated["status"] = new_status
        return await self.write(
            self.volumes,
            "PUT",
            PERSISTENT_VOLUMES.path(name=name_of(volume), subresource="status"),
            updated,
        )

    # -- events ------------------------------------------------------------------------------

    async def event(
        self, obj: Obj, type_: str, reason: str, message: str, *, repeat: bool = True
    ) -> None:
        """Record a core/v1 Event about ``obj``. A repeat of the same event within
        ``event_interval`` is dropped; a later repeat increments the recorded event's count
        (client-go's correlator), so a long wait leaves one event, not thousands."""
        key = (namespace_of(obj), uid_of(obj), type_, reason, message)
        now = self.clock.monotonic()
        record = self._events.get(key)
        if record is not None:
            if not repeat or now - record.last_emitted < self.event_interval:
                return
            record.last_emitted = now
            record.count += 1
            self._events.move_to_end(key)
            patch = {"count": record.count, "lastTimestamp": timestamp(self.clock)}
            try:
                await self.http.json(
                    "PATCH",
                    EVENTS.path(record.namespace, record.name),
                    body=patch,
                    content_type="application/strategic-merge-patch+json",
                )
                return
            except ApiException as err:
                if not is_not_found(err):
                    log.info("binder: cannot update event", reason=reason, error=str(err.status))
                    return
                # The event expired on the server: record a fresh one.
        ts = timestamp(self.clock)
        # Events about cluster-scoped objects (PVs) live in "default", as client-go puts them.
        ns = namespace_of(obj) or "default"
        name = f"{name_of(obj)}.{secrets.token_hex(8)}"
        body: Obj = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": ns},
            "involvedObject": {
                "kind": as_str(obj.get("kind")),
                "apiVersion": as_str(obj.get("apiVersion")),
                "name": name_of(obj),
                "uid": uid_of(obj),
                "resourceVersion": resource_version(obj),
                **({"namespace": namespace_of(obj)} if namespace_of(obj) else {}),
            },
            "reason": reason,
            "message": message,
            "type": type_,
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": "",
            "firstTimestamp": ts,
            "lastTimestamp": ts,
            "count": 1,
        }
        try:
            await self.http.json("POST", EVENTS.path(ns), body=body)
        except ApiException as err:
            # Events are best effort, as in client-go: a failure must not stop binding.
            log.info("binder: cannot record event", reason=reason, error=str(err.status))
            return
        self._events[key] = _EventRecord(name, ns, 1, now, ts)
        self._events.move_to_end(key)
        while len(self._events) > _EVENT_CACHE_SIZE:
            self._events.popitem(last=False)

"""A PV binder for tests: kube-controller-manager's persistentvolume controller, reduced to what
dynamic provisioning and static binding need, talking to any API server over HTTP.

It follows ``pkg/controller/volume/persistentvolume/pv_controller.go``: claims of a class with an
external provisioner get the ``volume.kubernetes.io/storage-provisioner`` annotations (only once a
node is selected for ``WaitForFirstConsumer`` classes), pre-bound and matching PVs are bound to
their claims (PV and claim both ``Bound``), PVs whose claim went away are ``Released`` and bound
claims whose PV went away are ``Lost``. :func:`set_selected_node` plays the scheduler.

It reaches the API server through a kubernetes-asyncio ``ApiClient`` (HTTP), or, when
:class:`~pyprovlib.testing.server.ApiServer` runs it, through the server's in-process transport
(the same request pipeline without TCP and HTTP; see :class:`BinderTransport`).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import json
import secrets
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Protocol

import aiohttp
from kubernetes_asyncio.client import ApiClient
from kubernetes_asyncio.client.exceptions import ApiException

from pyprovlib._logging import get_logger
from pyprovlib.errors import PyprovlibError
from pyprovlib.kube.clock import Clock, RealClock
from pyprovlib.kube.config import use_resolved_proxy
from pyprovlib.kube.errors import is_conflict, is_gone, is_not_found
from pyprovlib.kube.objects import (
    Obj,
    annotations_of,
    labels_of,
    meta,
    name_of,
    namespace_of,
    resource_version,
    uid_of,
)
from pyprovlib.kube.resources import (
    EVENTS,
    PERSISTENT_VOLUME_CLAIMS,
    PERSISTENT_VOLUMES,
    STORAGE_CLASSES,
    Resource,
)
from pyprovlib.testing._storage import copy_json

__all__ = [
    "ANN_BETA_STORAGE_PROVISIONER",
    "ANN_BIND_COMPLETED",
    "ANN_BOUND_BY_CONTROLLER",
    "ANN_DYNAMICALLY_PROVISIONED",
    "ANN_SELECTED_NODE",
    "ANN_STORAGE_PROVISIONER",
    "BINDER_USER_AGENT",
    "COMPONENT",
    "BinderTransport",
    "PVBinder",
    "claim_class",
    "parse_quantity",
    "set_selected_node",
    "volume_class",
]

log = get_logger(__name__)

ANN_BIND_COMPLETED = "pv.kubernetes.io/bind-completed"
"""On a claim: its binding went through the controller's initial setup."""
ANN_BOUND_BY_CONTROLLER = "pv.kubernetes.io/bound-by-controller"
"""On a PV or claim: the binding was made by the controller, not pre-bound by a user."""
ANN_DYNAMICALLY_PROVISIONED = "pv.kubernetes.io/provisioned-by"
"""On a PV: the provisioner that created it."""
ANN_STORAGE_PROVISIONER = "volume.kubernetes.io/storage-provisioner"
"""On a claim: the provisioner expected to provision it."""
ANN_BETA_STORAGE_PROVISIONER = "volume.beta.kubernetes.io/storage-provisioner"
"""The deprecated spelling of :data:`ANN_STORAGE_PROVISIONER`, still set for old provisioners."""
ANN_SELECTED_NODE = "volume.kubernetes.io/selected-node"
"""On a claim: the node the scheduler picked for a ``WaitForFirstConsumer`` claim."""
ANN_BETA_STORAGE_CLASS = "volume.beta.kubernetes.io/storage-class"
ANN_DEFAULT_STORAGE_CLASS = "storageclass.kubernetes.io/is-default-class"
ANN_BETA_DEFAULT_STORAGE_CLASS = "storageclass.beta.kubernetes.io/is-default-class"

COMPONENT = "persistentvolume-controller"
"""The event source component, as kube-controller-manager reports it."""
BINDER_USER_AGENT = "pyprovlib-pv-binder (persistentvolume-controller)"
"""The User-Agent of the binder's requests when it runs inside the in-memory server."""

# Claim and volume phases (core/v1).
CLAIM_PENDING, CLAIM_BOUND, CLAIM_LOST = "Pending", "Bound", "Lost"
VOLUME_AVAILABLE, VOLUME_BOUND, VOLUME_RELEASED, VOLUME_FAILED = (
    "Available",
    "Bound",
    "Released",
    "Failed",
)

# client-go's event correlator keeps this many entries; we bound our repeat cache the same way.
_EVENT_CACHE_SIZE = 4096
_LIST_PAGE = 500
_WATCH_TIMEOUT_S = 300

ClaimKey = str  # namespace/name
Key = tuple[str, str]  # ("claim", "ns/name") or ("volume", name)


class _Gone(PyprovlibError):
    """A watch or list resourceVersion the server no longer keeps: relist."""


# ---------------------------------------------------------------------------------------------
# Small pure helpers over the JSON of claims, volumes and classes. They never raise on odd
# objects: a wrong type reads as "absent".


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _str_list(value: Any) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _claim_key(claim: Mapping[str, Any]) -> ClaimKey:
    return f"{namespace_of(claim)}/{name_of(claim)}"


def _claim_ref(volume: Mapping[str, Any]) -> dict[str, Any] | None:
    ref = _dict(volume.get("spec")).get("claimRef")
    return ref if isinstance(ref, dict) else None


def _claim_ref_key(volume: Mapping[str, Any]) -> ClaimKey | None:
    ref = _claim_ref(volume)
    if ref is None:
        return None
    return f"{_str(ref.get('namespace'))}/{_str(ref.get('name'))}"


def _phase(obj: Mapping[str, Any]) -> str:
    return _str(_dict(obj.get("status")).get("phase"))


def _volume_name_of_claim(claim: Mapping[str, Any]) -> str:
    return _str(_dict(claim.get("spec")).get("volumeName"))


def claim_class(claim: Mapping[str, Any]) -> str:
    """``GetPersistentVolumeClaimClass``: the beta annotation wins over spec.storageClassName."""
    ann = annotations_of(claim)
    if ANN_BETA_STORAGE_CLASS in ann:
        return _str(ann[ANN_BETA_STORAGE_CLASS])
    return _str(_dict(claim.get("spec")).get("storageClassName"))


def _claim_has_class(claim: Mapping[str, Any]) -> bool:
    # PersistentVolumeClaimHasClass: an explicit "" counts as asking for no class.
    if ANN_BETA_STORAGE_CLASS in annotations_of(claim):
        return True
    return _dict(claim.get("spec")).get("storageClassName") is not None


def volume_class(volume: Mapping[str, Any]) -> str:
    """``GetPersistentVolumeClass``: the beta annotation wins over spec.storageClassName."""
    ann = annotations_of(volume)
    if ANN_BETA_STORAGE_CLASS in ann:
        return _str(ann[ANN_BETA_STORAGE_CLASS])
    return _str(_dict(volume.get("spec")).get("storageClassName"))


def _is_deleting(obj: Mapping[str, Any]) -> bool:
    return bool(meta(obj).get("deletionTimestamp"))


def _volume_bound_to_claim(volume: Mapping[str, Any], claim: Mapping[str, Any]) -> bool:
    """``IsVolumeBoundToClaim``: claimRef names the claim and its uid, if set, matches."""
    ref = _claim_ref(volume)
    if ref is None:
        return False
    if _str(ref.get("name")) != name_of(claim) or _str(ref.get("namespace")) != namespace_of(claim):
        return False
    ref_uid = _str(ref.get("uid"))
    return not ref_uid or ref_uid == uid_of(claim)


_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}


def parse_quantity(value: Any) -> Decimal | None:
    """A Kubernetes resource quantity (``1Gi``, ``500M``, ``1e3``, ``100m``) as a Decimal;
    None when it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return Decimal(str(value))
    if not isinstance(value, str) or not value.strip():
        return None
    text = value.strip()
    try:
        if text[-2:] in _BINARY:
            return Decimal(text[:-2]) * _BINARY[text[-2:]]
        if text[-1:] in _DECIMAL and not text[-1:].isdigit():
            # "E" alone is a suffix, but "1E3" is an exponent: Decimal parses the latter.
            with contextlib.suppress(InvalidOperation):
                return Decimal(text)
            return Decimal(text[:-1]) * _DECIMAL[text[-1:]]
        return Decimal(text)
    except (InvalidOperation, ValueError):
        return None


def _storage_of(resources: Any) -> Any:
    return _dict(resources).get("storage")


def _volume_mode(spec: Mapping[str, Any]) -> str:
    return _str(spec.get("volumeMode")) or "Filesystem"


def _match_labels(selector: Any, labels: Mapping[str, str]) -> bool:
    """metav1.LabelSelector semantics (matchLabels AND matchExpressions); an empty selector
    matches everything, a malformed one matches nothing."""
    if selector is None:
        return True
    if not isinstance(selector, dict):
        return False
    for k, v in _dict(selector.get("matchLabels")).items():
        if labels.get(k) != v:
            return False
    exprs = selector.get("matchExpressions") or []
    if not isinstance(exprs, list):
        return False
    for expr in exprs:
        if not isinstance(expr, dict):
            return False
        key, op, values = _str(expr.get("key")), _str(expr.get("operator")), expr.get("values")
        vals = set(_str_list(values))
        if op == "In" and labels.get(key) not in vals:
            return False
        if op == "NotIn" and key in labels and labels[key] in vals:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
        if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            return False
    return True


def _rv_int(obj: Mapping[str, Any]) -> int | None:
    try:
        return int(resource_version(obj))
    except ValueError:
        return None


def _is_newer(new: Mapping[str, Any], old: Mapping[str, Any] | None) -> bool:
    """storeObjectUpdate: keep the cached object when the incoming one is older (the controller
    may already have stored the result of its own write)."""
    if old is None:
        return True
    n, o = _rv_int(new), _rv_int(old)
    if n is None or o is None:
        return True
    return n > o


# ---------------------------------------------------------------------------------------------
# Raw JSON over kubernetes-asyncio's ApiClient: no model deserialisation (see DESIGN.md).


class BinderTransport(Protocol):
    """How the binder talks to the API server: JSON requests and watch streams. Errors are
    kubernetes-asyncio ``ApiException``s (status, body, headers), as over HTTP."""

    async def json(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> Obj:
        """Send one request; the JSON object of a 2xx answer, else raise ApiException."""
        ...

    def stream(
        self, path: str, *, query: Mapping[str, Any] | None = None
    ) -> AbstractAsyncContextManager[AsyncIterator[bytes]]:
        """Open a watch: its bytes (newline-separated JSON events) until the server ends it."""
        ...


class _Http:
    """:class:`BinderTransport` over a kubernetes-asyncio ApiClient."""

    def __init__(self, api_client: ApiClient) -> None:
        self.api = api_client

    async def open(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: aiohttp.ClientTimeout | float | None = None,  # noqa: ASYNC109
    ) -> aiohttp.ClientResponse:
        resp: aiohttp.ClientResponse = await self.api.call_api(
            path,
            method,
            query_params=[(k, v) for k, v in (query or {}).items()],
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
            _preload_content=False,
            _request_timeout=timeout or 30.0,
        )
        if not 200 <= resp.status <= 299:
            try:
                data = await resp.read()
            finally:
                resp.release()
            err = ApiException(status=resp.status, reason=resp.reason)
            err.body = data
            err.headers = resp.headers
            raise err
        return resp

    async def json(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> Obj:
        resp = await self.open(method, path, query=query, body=body, content_type=content_type)
        try:
            data = await resp.read()
        finally:
            resp.release()
        out = json.loads(data)
        return out if isinstance(out, dict) else {}

    @contextlib.asynccontextmanager
    async def stream(
        self, path: str, *, query: Mapping[str, Any] | None = None
    ) -> AsyncIterator[AsyncIterator[bytes]]:
        resp = await self.open(
            "GET",
            path,
            query=query,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=None),
        )
        try:
            yield resp.content.iter_any()
        finally:
            resp.release()


async def set_selected_node(
    api_client: ApiClient, namespace: str, claim_name: str, node_name: str
) -> Obj:
    """Annotate a claim with ``volume.kubernetes.io/selected-node`` (merge patch), as the
    scheduler does when it places the first pod using a ``WaitForFirstConsumer`` claim.
    Returns the patched claim."""
    patch = {"metadata": {"annotations": {ANN_SELECTED_NODE: node_name}}}
    return await _Http(api_client).json(
        "PATCH",
        PERSISTENT_VOLUME_CLAIMS.path(namespace, claim_name),
        body=patch,
        content_type="application/merge-patch+json",
    )


# ---------------------------------------------------------------------------------------------


@dataclass
class _EventRecord:
    name: str
    namespace: str
    count: int
    last_emitted: float
    first_timestamp: str


class _Informer:
    """LIST+WATCH of one resource into a dict cache, calling back on every change."""

    def __init__(
        self,
        binder: PVBinder,
        resource: Resource,
        on_upsert: Callable[[Obj, Obj | None], None],
        on_delete: Callable[[Obj], None],
    ) -> None:
        self.binder = binder
        self.resource = resource
        self.cache: dict[str, Obj] = {}
        self.on_upsert = on_upsert
        self.on_delete = on_delete
        self.synced = asyncio.Event()
        self.rv = ""

    @staticmethod
    def key(obj: Mapping[str, Any]) -> str:
        ns = namespace_of(obj)
        return f"{ns}/{name_of(obj)}" if ns else name_of(obj)

    def upsert(self, obj: Obj) -> bool:
        """Store ``obj`` unless the cache holds a newer version; True when stored."""
        if not name_of(obj):
            return False
        key = self.key(obj)
        old = self.cache.get(key)
        if not _is_newer(obj, old):
            return False
        self.cache[key] = obj
        self.on_upsert(obj, old)
        return True

    def delete(self, obj: Obj) -> None:
        key = self.key(obj)
        old = self.cache.pop(key, None)
        self.on_delete(old if old is not None else obj)

    async def run(self) -> None:
        backoff = 0.05
        need_list = True
        while True:
            try:
                if need_list:
                    await self._list()
                    need_list = False
                    self.synced.set()
                await self._watch()
                backoff = 0.05
            except asyncio.CancelledError:
                raise
            except _Gone:
                need_list = True
            except Exception as err:
                if isinstance(err, ApiException) and is_gone(err):
                    need_list = True
                    continue
                log.info(
                    "binder watch interrupted; retrying",
                    resource=self.resource.plural,
                    error=_describe(err),
                )
                await self.binder.clock.sleep(backoff)
                backoff = min(backoff * 2, 2.0)

    async def _list(self) -> None:
        items: dict[str, Obj] = {}
        cont = ""
        while True:
            query: dict[str, Any] = {"limit": _LIST_PAGE}
            if cont:
                query["continue"] = cont
            page = await self.binder.http.json("GET", self.resource.path(), query=query)
            for item in page.get("items") or []:
                if isinstance(item, dict) and name_of(item):
                    # List items carry no kind/apiVersion; restore them for events and writes.
                    item.setdefault("kind", self.resource.kind)
                    item.setdefault("apiVersion", self.resource.api_version)
                    items[self.key(item)] = item
            page_meta = _dict(page.get("metadata"))
            cont = _str(page_meta.get("continue"))
            if not cont:
                self.rv = _str(page_meta.get("resourceVersion"))
                break
        # Replace: objects gone while we were not watching are deletions.
        for key in [k for k in self.cache if k not in items]:
            self.delete(self.cache[key])
        for key, item in items.items():
            old = self.cache.get(key)
            if old is None or resource_version(old) != resource_version(item):
                self.cache[key] = item
                self.on_upsert(item, old)

    async def _watch(self) -> None:
        query: dict[str, Any] = {
            "watch": "true",
            "allowWatchBookmarks": "true",
            "timeoutSeconds": _WATCH_TIMEOUT_S,
        }
        if self.rv:
            query["resourceVersion"] = self.rv
        async with self.binder.http.stream(self.resource.path(), query=query) as chunks:
            buf = b""
            async for chunk in chunks:
                # Split each chunk once: a chunk may hold a whole backlog of events.
                lines = (buf + chunk).split(b"\n")
                buf = lines.pop()
                for line in lines:
                    if line.strip():
                        self._handle_line(line)

    def _handle_line(self, line: bytes) -> None:
        try:
            event = json.loads(line)
        except ValueError:
            log.warning("binder: undecodable watch line", resource=self.resource.plural)
            return
        if not isinstance(event, dict):
            return
        type_, obj = event.get("type"), event.get("object")
        if not isinstance(obj, dict):
            return
        if type_ == "ERROR":
            if obj.get("code") == 410:
                raise _Gone(_str(obj.get("message")))
            raise RuntimeError(f"watch error: {obj.get('message')!r}")
        rv = resource_version(obj)
        if rv:
            self.rv = rv
        if type_ == "BOOKMARK":
            return
        obj.setdefault("kind", self.resource.kind)
        obj.setdefault("apiVersion", self.resource.api_version)
        if type_ in ("ADDED", "MODIFIED"):
            self.upsert(obj)
        elif type_ == "DELETED":
            self.delete(obj)


class PVBinder:
    """The persistentvolume controller of kube-controller-manager, for tests.

    ``PVBinder(api_client)`` (or ``PVBinder(transport=...)``, see :class:`BinderTransport`);
    ``await start()`` launches its watches and worker (owned tasks),
    ``await stop()`` cancels and awaits them. ``resync_period`` re-examines every claim and
    volume (upstream's ``--pvclaimbinder-sync-period``, shortened for tests), and
    ``event_interval`` bounds how often a still-true event (``ExternalProvisioning``,
    ``WaitForFirstConsumer``) is repeated for one claim; repeats increment the event's count
    like client-go's event correlator.

    ``workers`` claims and volumes are synced concurrently, never one key twice at a time (a
    key changed while being synced is synced again afterwards, like a client-go workqueue).
    kube-controller-manager runs one claim and one volume worker, each sync taking about a
    millisecond; here every sync waits for HTTP round trips to the API server, usually in the
    same process, so a single worker would annotate 1,000 new claims one after the other.
    Binding a claim to an unclaimed volume (static binding) stays serialised, so two claims
    never race for the same volume.
    """

    def __init__(
        self,
        api_client: ApiClient | None = None,
        *,
        resync_period: float = 2.0,
        event_interval: float = 15.0,
        clock: Clock | None = None,
        workers: int = 8,
        transport: BinderTransport | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        if (api_client is None) == (transport is None):
            raise ValueError(
                "PVBinder needs exactly one way to the API server: an api_client (HTTP) or a "
                "transport (e.g. the in-memory server's InProcessTransport), not both or neither"
            )
        self.http: BinderTransport
        if api_client is not None:
            # Resolve the proxy once instead of aiohttp's two thread-pool hops per request
            # (about a third of the binder's CPU time under load).
            use_resolved_proxy(api_client)
            self.http = _Http(api_client)
        else:
            assert transport is not None
            self.http = transport
        self.workers = workers
        self.clock: Clock = clock or RealClock()
        self.resync_period = resync_period
        self.event_interval = event_interval
        self._tasks: list[asyncio.Task[None]] = []
        self._queue: OrderedDict[Key, None] = OrderedDict()
        self._queue_ready = asyncio.Event()
        # Keys being synced, and those of them changed meanwhile (synced again when done).
        self._processing: set[Key] = set()
        self._dirty: set[Key] = set()
        # Static binding picks among shared Available volumes: one claim at a time.
        self._static_bind = asyncio.Lock()
        self._retries: dict[Key, int] = {}
        self._delayed: list[tuple[float, int, Key]] = []
        self._delayed_changed = asyncio.Event()
        self._seq = itertools.count()
        self._events: OrderedDict[tuple[str, str, str, str, str], _EventRecord] = OrderedDict()
        # PV names by the claim their claimRef names: a claim finds its pre-bound volumes in O(1).
        self._by_claim_ref: dict[ClaimKey, set[str]] = {}
        # Volumes without a claimRef, by class: candidates for static binding.
        self._unclaimed: dict[str, set[str]] = {}
        self.claims = _Informer(
            self, PERSISTENT_VOLUME_CLAIMS, self._claim_upsert, self._claim_gone
        )
        self.volumes = _Informer(self, PERSISTENT_VOLUMES, self._volume_upsert, self._volume_gone)
        self.classes = _Informer(self, STORAGE_CLASSES, lambda new, old: None, lambda obj: None)

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Start watching and binding; returns at once (see :meth:`wait_for_sync`)."""
        if self._tasks:
            raise RuntimeError("PVBinder already started")
        for name, coro in (
            ("claims", self.claims.run()),
            ("volumes", self.volumes.run()),
            ("classes", self.classes.run()),
            *((f"worker-{i}", self._worker()) for i in range(self.workers)),
            ("delayed", self._delayed_loop()),
            ("resync", self._resync_loop()),
        ):
            self._tasks.append(asyncio.create_task(coro, name=f"pvbinder-{name}"))

    async def stop(self) -> None:
        """Cancel the binder's tasks and wait for them to finish."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for task, result in zip(tasks, results, strict=True):
            if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
                log.error("binder task failed", task=task.get_name(), error=repr(result))

    async def __aenter__(self) -> PVBinder:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def synced(self) -> bool:
        """True once claims, volumes and classes have all been listed."""
        return all(i.synced.is_set() for i in (self.claims, self.volumes, self.classes))

    async def wait_for_sync(self) -> None:
        """Wait until the first LIST of claims, volumes and classes has completed."""
        for informer in (self.claims, self.volumes, self.classes):
            await informer.synced.wait()

    # -- informer callbacks: keep the indexes and enqueue ------------------------------------

    def _claim_upsert(self, claim: Obj, old: Obj | None) -> None:
        self._enqueue(("claim", _claim_key(claim)))

    def _claim_gone(self, claim: Obj) -> None:
        key = _claim_key(claim)
        # Volumes pointing at the claim must notice it is gone (Released).
        for name in self._by_claim_ref.get(key, ()):
            self._enqueue(("volume", name))
        vol = _volume_name_of_claim(claim)
        if vol:
            self._enqueue(("volume", vol))

    def _unindex_volume(self, volume: Mapping[str, Any]) -> None:
        name = name_of(volume)
        ref_key = _claim_ref_key(volume)
        if ref_key is not None:
            names = self._by_claim_ref.get(ref_key)
            if names is not None:
                names.discard(name)
                if not names:
                    del self._by_claim_ref[ref_key]
        else:
            cls = volume_class(volume)
            unclaimed = self._unclaimed.get(cls)
            if unclaimed is not None:
                unclaimed.discard(name)
                if not unclaimed:
                    del self._unclaimed[cls]

    def _volume_upsert(self, volume: Obj, old: Obj | None) -> None:
        if old is not None:
            self._unindex_volume(old)
        ref_key = _claim_ref_key(volume)
        if ref_key is not None:
            self._by_claim_ref.setdefault(ref_key, set()).add(name_of(volume))
        else:
            self._unclaimed.setdefault(volume_class(volume), set()).add(name_of(volume))
        self._enqueue(("volume", name_of(volume)))

    def _volume_gone(self, volume: Obj) -> None:
        self._unindex_volume(volume)
        # deleteVolume: sync the claim now so it turns Lost without waiting for a resync.
        ref_key = _claim_ref_key(volume)
        if ref_key is not None:
            self._enqueue(("claim", ref_key))

    # -- queue -------------------------------------------------------------------------------

    def _enqueue(self, key: Key) -> None:
        if key in self._processing:
            self._dirty.add(key)
            return
        self._queue[key] = None
        self._queue_ready.set()

    def _enqueue_after(self, key: Key, delay: float) -> None:
        heapq.heappush(self._delayed, (self.clock.monotonic() + delay, next(self._seq), key))
        self._delayed_changed.set()

    async def _delayed_loop(self) -> None:
        while True:
            self._delayed_changed.clear()
            now = self.clock.monotonic()
            while self._delayed and self._delayed[0][0] <= now:
                self._enqueue(heapq.heappop(self._delayed)[2])
            if not self._delayed:
                await self._delayed_changed.wait()
                continue
            await _first_of(
                self.clock.sleep(self._delayed[0][0] - now), self._delayed_changed.wait()
            )

    async def _resync_loop(self) -> None:
        await self.wait_for_sync()
        while True:
            await self.clock.sleep(self.resync_period)
            for key in list(self.claims.cache):
                self._enqueue(("claim", key))
            for key in list(self.volumes.cache):
                self._enqueue(("volume", key))

    async def _worker(self) -> None:
        # Like upstream, nothing is decided before the caches are complete: a claim missing
        # from a half-filled cache must not release its volume.
        await self.wait_for_sync()
        while True:
            if not self._queue:
                self._queue_ready.clear()
                await self._queue_ready.wait()
                continue
            key, _ = self._queue.popitem(last=False)
            self._processing.add(key)
            try:
                await self._sync(key)
            finally:
                self._processing.discard(key)
                if key in self._dirty:
                    self._dirty.discard(key)
                    self._enqueue(key)

    async def _sync(self, key: Key) -> None:
        try:
            if key[0] == "claim":
                await self._sync_claim_key(key[1])
            else:
                await self._sync_volume_key(key[1])
            self._retries.pop(key, None)
        except asyncio.CancelledError:
            raise
        except Exception as err:
            attempts = self._retries.get(key, 0) + 1
            self._retries[key] = attempts
            delay = min(0.005 * 2 ** min(attempts, 20), 5.0)
            level = log.debug if isinstance(err, ApiException) and is_conflict(err) else log.info
            level(
                "binder sync failed; will retry",
                kind=key[0],
                key=key[1],
                error=_describe(err),
                retry_in=delay,
            )
            self._enqueue_after(key, delay)

    # -- claims (syncClaim) ------------------------------------------------------------------

    async def _sync_claim_key(self, key: ClaimKey) -> None:
        claim = self.claims.cache.get(key)
        if claim is None:
            return
        if ANN_BIND_COMPLETED not in annotations_of(claim):
            await self._sync_unbound_claim(claim)
        else:
            await self._sync_bound_claim(claim)

    async def _sync_unbound_claim(self, claim: Obj) -> None:
        volume_name = _volume_name_of_claim(claim)
        if not volume_name:
            delay_binding = self._is_delay_binding(claim)
            volume = self._find_best_match(claim, delay_binding)
            if volume is not None and _claim_ref(volume) is None:
                async with self._static_bind:
                    # Another claim may have taken it while this one waited: look again.
                    volume = self._find_best_match(claim, delay_binding)
                    if volume is not None:
                        await self._bind(volume, claim)
                        return
            elif volume is not None:
                await self._bind(volume, claim)
                return
            if await self._assign_default_class(claim):
                return
            cls = claim_class(claim)
            if delay_binding and ANN_SELECTED_NODE not in annotations_of(claim):
                await self._event(
                    claim,
                    "Normal",
                    "WaitForFirstConsumer",
                    "waiting for first consumer to be created before binding",
                )
            elif cls:
                await self._provision_claim(claim, cls)
                return
            else:
                await self._event(
                    claim,
                    "Normal",
                    "FailedBinding",
                    "no persistent volumes available for this claim and no storage class is set",
                )
            await self._update_claim_status(claim, CLAIM_PENDING, None)
            return
        # The user (or an earlier, interrupted binding) asked for a specific volume.
        volume = self.volumes.cache.get(volume_name)
        if volume is None:
            await self._update_claim_status(claim, CLAIM_PENDING, None)
            return
        if _claim_ref(volume) is None:
            mismatch = self._volume_mismatch(volume, claim)
            if mismatch:
                await self._event(
                    claim,
                    "Warning",
                    "VolumeMismatch",
                    f"Cannot bind to requested volume {_q(volume_name)}: {mismatch}",
                )
                await self._update_claim_status(claim, CLAIM_PENDING, None)
                return
            await self._bind(volume, claim)
        elif _volume_bound_to_claim(volume, claim):
            await self._bind(volume, claim)
        elif ANN_BOUND_BY_CONTROLLER not in annotations_of(claim):
            await self._event(
                claim,
                "Warning",
                "FailedBinding",
                f"volume {_q(volume_name)} already bound to a different claim.",
            )
            await self._update_claim_status(claim, CLAIM_PENDING, None)
        else:
            await self._event(
                claim,
                "Warning",
                "FailedBinding",
                f"volume {_q(volume_name)} already bound to a different claim.",
            )
            raise RuntimeError(
                f"invalid binding of claim {_q(_claim_key(claim))} to volume {_q(volume_name)}: "
                f"volume already claimed by {_q(_claim_ref_key(volume))}"
            )

    async def _sync_bound_claim(self, claim: Obj) -> None:
        volume_name = _volume_name_of_claim(claim)
        if not volume_name:
            await self._claim_status_with_event(
                claim,
                CLAIM_LOST,
                "ClaimLost",
                "Bound claim has lost reference to PersistentVolume. Data on the volume is lost!",
            )
            return
        volume = self.volumes.cache.get(volume_name)
        if volume is None:
            await self._claim_status_with_event(
                claim,
                CLAIM_LOST,
                "ClaimLost",
                "Bound claim has lost its PersistentVolume. Data on the volume is lost!",
            )
            return
        ref = _claim_ref(volume)
        if ref is None or _str(ref.get("uid")) == uid_of(claim):
            # Unbound volume (or cache lag) is bound again; a good binding is re-asserted,
            # which writes nothing when everything is already set.
            await self._bind(volume, claim)
            return
        await self._claim_status_with_event(
            claim,
            CLAIM_LOST,
            "ClaimMisbound",
            "Two claims are bound to the same volume, this one is bound incorrectly",
        )

    def _storage_class(self, name: str) -> Obj | None:
        return self.classes.cache.get(name)

    def _is_delay_binding(self, claim: Obj) -> bool:
        cls = claim_class(claim)
        if not cls:
            return False
        sc = self._storage_class(cls)
        if sc is None:
            return False
        return _str(sc.get("volumeBindingMode")) == "WaitForFirstConsumer"

    def _default_class(self) -> Obj | None:
        # GetDefaultClass: the newest default wins; ties by name.
        defaults = [
            sc
            for sc in self.classes.cache.values()
            if annotations_of(sc).get(ANN_DEFAULT_STORAGE_CLASS) == "true"
            or annotations_of(sc).get(ANN_BETA_DEFAULT_STORAGE_CLASS) == "true"
        ]
        if not defaults:
            return None
        defaults.sort(key=lambda sc: (_str(meta(sc).get("creationTimestamp")), name_of(sc)))
        newest = _str(meta(defaults[-1]).get("creationTimestamp"))
        return min(
            (sc for sc in defaults if _str(meta(sc).get("creationTimestamp")) == newest),
            key=name_of,
        )

    async def _assign_default_class(self, claim: Obj) -> bool:
        """The retroactive default StorageClass assignment for claims that asked for none."""
        if _claim_has_class(claim):
            return False
        default = self._default_class()
        if default is None:
            return False
        updated = _copy(claim)
        updated.setdefault("spec", {})["storageClassName"] = name_of(default)
        await self._put_claim(updated)
        return True

    def _volume_mismatch(self, volume: Obj, claim: Obj) -> str:
        """Why ``volume`` cannot satisfy ``claim`` (checkVolumeSatisfyClaim), or ''."""
        if _is_deleting(volume):
            return f"the volume is marked for deletion {_q(name_of(volume))}"
        vspec, cspec = _dict(volume.get("spec")), _dict(claim.get("spec"))
        requested = parse_quantity(_storage_of(_dict(cspec.get("resources")).get("requests")))
        capacity = parse_quantity(_storage_of(vspec.get("capacity")))
        if capacity is None or (requested is not None and capacity < requested):
            return "requested PV is too small"
        if volume_class(volume) != claim_class(claim):
            return "storageClassName does not match"
        if _volume_mode(vspec) != _volume_mode(cspec):
            return "incompatible volumeMode"
        if not set(_str_list(cspec.get("accessModes"))) <= set(_str_list(vspec.get("accessModes"))):
            return "incompatible accessMode"
        return ""

    def _find_best_match(self, claim: Obj, delay_binding: bool) -> Obj | None:
        """findBestMatchForClaim: a volume pre-bound to the claim first, else (for immediate
        binding) the smallest Available volume of the claim's class that satisfies it."""
        cspec = _dict(claim.get("spec"))
        requested = parse_quantity(
            _storage_of(_dict(cspec.get("resources")).get("requests"))
        ) or Decimal(0)
        claim_modes = set(_str_list(cspec.get("accessModes")))
        claim_mode = _volume_mode(cspec)

        def usable(volume: Obj) -> Decimal | None:
            vspec = _dict(volume.get("spec"))
            if not claim_modes <= set(_str_list(vspec.get("accessModes"))):
                return None
            capacity = parse_quantity(_storage_of(vspec.get("capacity")))
            if capacity is None or capacity < requested:
                return None
            if _volume_mode(vspec) != claim_mode or _is_deleting(volume):
                return None
            return capacity

        for name in sorted(self._by_claim_ref.get(_claim_key(claim), ())):
            volume = self.volumes.cache.get(name)
            if (
                volume is not None
                and _volume_bound_to_claim(volume, claim)
                and usable(volume) is not None
            ):
                return volume
        if delay_binding:
            # The scheduler picks static volumes for delayed binding, not this controller.
            return None
        cls = claim_class(claim)
        selector = cspec.get("selector")
        best: tuple[Decimal, str] | None = None
        for name in self._unclaimed.get(cls, ()):
            volume = self.volumes.cache.get(name)
            if volume is None or _phase(volume) != VOLUME_AVAILABLE:
                continue
            capacity = usable(volume)
            if capacity is None or not _match_labels(selector, labels_of(volume)):
                continue
            if best is None or (capacity, name) < best:
                best = (capacity, name)
        return self.volumes.cache.get(best[1]) if best else None

    async def _provision_claim(self, claim: Obj, cls: str) -> None:
        """provisionClaim for external provisioners: annotate the claim and say so."""
        sc = self._storage_class(cls)
        if sc is None:
            await self._event(
                claim,
                "Warning",
                "ProvisioningFailed",
                f'storageclass.storage.k8s.io "{cls}" not found',
            )
            return
        provisioner = _str(sc.get("provisioner"))
        if provisioner.startswith("kubernetes.io/") or not provisioner:
            # In-tree plugins are not part of this binder; upstream reports an unknown one.
            await self._event(
                claim,
                "Warning",
                "ProvisioningFailed",
                f"no volume plugin matched name: {provisioner}",
            )
            return
        ann = annotations_of(claim)
        if ann.get(ANN_STORAGE_PROVISIONER) != provisioner:
            updated = _copy(claim)
            annotations = updated.setdefault("metadata", {}).setdefault("annotations", {})
            annotations[ANN_BETA_STORAGE_PROVISIONER] = provisioner
            annotations[ANN_STORAGE_PROVISIONER] = provisioner
            try:
                claim = await self._put_claim(updated)
            except ApiException as err:
                await self._event(
                    claim, "Warning", "ProvisioningFailed", f"Error saving claim: {err.reason}"
                )
                raise
        await self._event(
            claim,
            "Normal",
            "ExternalProvisioning",
            f"Waiting for a volume to be created either by the external provisioner "
            f"'{provisioner}' or manually by the system administrator. If volume creation is "
            f"delayed, please verify that the provisioner is running and correctly registered.",
        )

    # -- binding (bind, bindVolumeToClaim, bindClaimToVolume) --------------------------------

    async def _bind(self, volume: Obj, claim: Obj) -> None:
        volume = await self._bind_volume_to_claim(volume, claim)
        volume = await self._update_volume_phase(volume, VOLUME_BOUND, "")
        claim = await self._bind_claim_to_volume(claim, volume)
        await self._update_claim_status(claim, CLAIM_BOUND, volume)

    async def _bind_volume_to_claim(self, volume: Obj, claim: Obj) -> Obj:
        set_by_controller = not _volume_bound_to_claim(volume, claim)
        updated = _copy(volume)
        dirty = False
        ref = _claim_ref(volume)
        if (
            ref is None
            or _str(ref.get("name")) != name_of(claim)
            or _str(ref.get("namespace")) != namespace_of(claim)
            or _str(ref.get("uid")) != uid_of(claim)
        ):
            updated.setdefault("spec", {})["claimRef"] = {
                "kind": "PersistentVolumeClaim",
                "namespace": namespace_of(claim),
                "name": name_of(claim),
                "uid": uid_of(claim),
                "apiVersion": "v1",
                "resourceVersion": resource_version(claim),
            }
            dirty = True
        annotations = updated.setdefault("metadata", {}).setdefault("annotations", {})
        if not isinstance(annotations, dict):
            annotations = updated["metadata"]["annotations"] = {}
        if set_by_controller and ANN_BOUND_BY_CONTROLLER not in annotations:
            annotations[ANN_BOUND_BY_CONTROLLER] = "yes"
            dirty = True
        if not dirty:
            return volume
        return await self._put_volume(updated)

    async def _bind_claim_to_volume(self, claim: Obj, volume: Obj) -> Obj:
        should_bind = _volume_name_of_claim(claim) != name_of(volume)
        updated = _copy(claim)
        dirty = False
        if should_bind:
            updated.setdefault("spec", {})["volumeName"] = name_of(volume)
            dirty = True
        annotations = updated.setdefault("metadata", {}).setdefault("annotations", {})
        if not isinstance(annotations, dict):
            annotations = updated["metadata"]["annotations"] = {}
        if should_bind and ANN_BOUND_BY_CONTROLLER not in annotations:
            annotations[ANN_BOUND_BY_CONTROLLER] = "yes"
            dirty = True
        if ANN_BIND_COMPLETED not in annotations:
            annotations[ANN_BIND_COMPLETED] = "yes"
            dirty = True
        if not dirty:
            return claim
        return await self._put_claim(updated)

    async def _update_claim_status(self, claim: Obj, phase: str, volume: Obj | None) -> Obj:
        updated = _copy(claim)
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
            vspec = _dict(volume.get("spec"))
            modes = _str_list(vspec.get("accessModes"))
            if status.get("accessModes") != modes:
                status["accessModes"] = modes
                dirty = True
            storage = _storage_of(vspec.get("capacity"))
            if storage is None:
                raise ValueError(
                    f"PersistentVolume {_q(name_of(volume))} is without a storage capacity"
                )
            current = _storage_of(status.get("capacity"))
            # Like pv_controller's updateClaimStatus: capacity is copied only while the claim
            # becomes Bound. Afterwards a difference is deliberate (a volume expanded on the
            # controller side but not yet on the node keeps the claim's old capacity).
            if becoming and (current is None or parse_quantity(current) != parse_quantity(storage)):
                status["capacity"] = dict(_dict(vspec.get("capacity")))
                dirty = True
        if not dirty:
            return claim
        return await self._write(
            self.claims,
            "PUT",
            PERSISTENT_VOLUME_CLAIMS.path(namespace_of(claim), name_of(claim), "status"),
            updated,
        )

    async def _claim_status_with_event(
        self, claim: Obj, phase: str, reason: str, message: str
    ) -> None:
        if _phase(claim) == phase:
            return
        claim = await self._update_claim_status(claim, phase, None)
        await self._event(claim, "Warning", reason, message, repeat=False)

    # -- volumes (syncVolume) ----------------------------------------------------------------

    async def _sync_volume_key(self, name: str) -> None:
        volume = self.volumes.cache.get(name)
        if volume is None:
            return
        ref = _claim_ref(volume)
        if ref is None:
            await self._update_volume_phase(volume, VOLUME_AVAILABLE, "")
            return
        ref_key = f"{_str(ref.get('namespace'))}/{_str(ref.get('name'))}"
        if not _str(ref.get("uid")):
            # Pre-bound by its creator: the claim's sync finishes the binding.
            await self._update_volume_phase(volume, VOLUME_AVAILABLE, "")
            self._enqueue(("claim", ref_key))
            return
        claim = self.claims.cache.get(ref_key)
        if claim is None and _phase(volume) not in (VOLUME_RELEASED, VOLUME_FAILED):
            # Under load the claim may not have reached our cache yet: ask the server before
            # declaring the volume released.
            claim = await self._get_claim(_str(ref.get("namespace")), _str(ref.get("name")))
        if claim is not None and uid_of(claim) != _str(ref.get("uid")):
            fresh = await self._get_claim(_str(ref.get("namespace")), _str(ref.get("name")))
            claim = fresh if fresh is not None and uid_of(fresh) == _str(ref.get("uid")) else None
        if claim is None:
            if _phase(volume) not in (VOLUME_RELEASED, VOLUME_FAILED):
                volume = await self._update_volume_phase(volume, VOLUME_RELEASED, "")
            await self._reclaim_volume(volume)
            return
        claim_volume = _volume_name_of_claim(claim)
        if not claim_volume:
            cspec, vspec = _dict(claim.get("spec")), _dict(volume.get("spec"))
            if _volume_mode(cspec) != _volume_mode(vspec):
                await self._event(
                    volume,
                    "Warning",
                    "VolumeMismatch",
                    f"Cannot bind PersistentVolume to requested PersistentVolumeClaim "
                    f"{_q(name_of(claim))} due to incompatible volumeMode.",
                )
                await self._event(
                    claim,
                    "Warning",
                    "VolumeMismatch",
                    f"Cannot bind PersistentVolume {_q(name)} to requested PersistentVolumeClaim "
                    f"due to incompatible volumeMode.",
                )
                return
            # The claim is Pending while the volume points at it: the claim's sync binds it.
            self._enqueue(("claim", ref_key))
            return
        if claim_volume == name:
            await self._update_volume_phase(volume, VOLUME_BOUND, "")
            return
        # Bound to a claim that is bound elsewhere.
        spec = _dict(volume.get("spec"))
        if (
            ANN_DYNAMICALLY_PROVISIONED in annotations_of(volume)
            and spec.get("persistentVolumeReclaimPolicy") == "Delete"
        ):
            if _phase(volume) not in (VOLUME_RELEASED, VOLUME_FAILED):
                volume = await self._update_volume_phase(volume, VOLUME_RELEASED, "")
            await self._reclaim_volume(volume)
            return
        await self._unbind_volume(volume)

    async def _unbind_volume(self, volume: Obj) -> None:
        """unbindVolume: a controller-made binding is removed; a user's pre-binding keeps the
        claim's name but loses its uid."""
        updated = _copy(volume)
        spec = updated.setdefault("spec", {})
        annotations = updated.setdefault("metadata", {}).setdefault("annotations", {})
        if isinstance(annotations, dict) and ANN_BOUND_BY_CONTROLLER in annotations:
            spec.pop("claimRef", None)
            annotations.pop(ANN_BOUND_BY_CONTROLLER, None)
        elif isinstance(spec.get("claimRef"), dict):
            spec["claimRef"].pop("uid", None)
        volume = await self._put_volume(updated)
        await self._update_volume_phase(volume, VOLUME_AVAILABLE, "")

    async def _reclaim_volume(self, volume: Obj) -> None:
        """reclaimVolume, for what exists without in-tree plugins: Retain keeps the volume,
        Delete of a volume from an external provisioner waits for that provisioner, anything
        else has no plugin to act and fails like upstream."""
        policy = _str(_dict(volume.get("spec")).get("persistentVolumeReclaimPolicy")) or "Retain"
        if policy == "Retain":
            return
        if policy == "Delete":
            provisioned_by = _str(annotations_of(volume).get(ANN_DYNAMICALLY_PROVISIONED))
            if provisioned_by and not provisioned_by.startswith("kubernetes.io/"):
                return
            if provisioned_by:
                message = f"no volume plugin matched name: {provisioned_by}"
            else:
                message = (
                    f"error getting deleter volume plugin for volume {_q(name_of(volume))}: "
                    "no deletable volume plugin matched"
                )
            await self._volume_phase_with_event(
                volume, VOLUME_FAILED, "VolumeFailedDelete", message
            )
            return
        if policy == "Recycle":
            await self._volume_phase_with_event(
                volume,
                VOLUME_FAILED,
                "VolumeFailedRecycle",
                "No recycler plugin found for the volume!",
            )
            return
        await self._volume_phase_with_event(
            volume,
            VOLUME_FAILED,
            "VolumeUnknownReclaimPolicy",
            "Volume has unrecognized PersistentVolumeReclaimPolicy",
        )

    async def _volume_phase_with_event(
        self, volume: Obj, phase: str, reason: str, message: str
    ) -> None:
        if _phase(volume) == phase:
            return
        volume = await self._update_volume_phase(volume, phase, message)
        await self._event(volume, "Warning", reason, message, repeat=False)

    async def _update_volume_phase(self, volume: Obj, phase: str, message: str) -> Obj:
        status = _dict(volume.get("status"))
        if status.get("phase") == phase:
            return volume
        updated = _copy(volume)
        new_status: dict[str, Any] = dict(status)
        new_status["phase"] = phase
        if message:
            new_status["message"] = message
        else:
            new_status.pop("message", None)
        new_status["lastPhaseTransitionTime"] = _timestamp(self.clock)
        updated["status"] = new_status
        return await self._write(
            self.volumes,
            "PUT",
            PERSISTENT_VOLUMES.path(name=name_of(volume), subresource="status"),
            updated,
        )

    # -- writes ------------------------------------------------------------------------------

    async def _write(self, informer: _Informer, method: str, path: str, body: Obj) -> Obj:
        try:
            new = await self.http.json(method, path, body=body)
        except ApiException as err:
            if is_not_found(err):
                log.debug("binder: object vanished during write", path=path)
            raise
        new.setdefault("kind", informer.resource.kind)
        new.setdefault("apiVersion", informer.resource.api_version)
        # Remember our own write so a late watch event of the old version does not undo it.
        if name_of(new):
            informer.upsert(new)
        return new

    async def _put_claim(self, claim: Obj) -> Obj:
        return await self._write(
            self.claims,
            "PUT",
            PERSISTENT_VOLUME_CLAIMS.path(namespace_of(claim), name_of(claim)),
            claim,
        )

    async def _put_volume(self, volume: Obj) -> Obj:
        return await self._write(
            self.volumes, "PUT", PERSISTENT_VOLUMES.path(name=name_of(volume)), volume
        )

    async def _get_claim(self, namespace: str, name: str) -> Obj | None:
        if not namespace or not name:
            return None
        try:
            return await self.http.json("GET", PERSISTENT_VOLUME_CLAIMS.path(namespace, name))
        except ApiException as err:
            if is_not_found(err):
                return None
            raise

    # -- events ------------------------------------------------------------------------------

    async def _event(
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
            patch = {"count": record.count, "lastTimestamp": _timestamp(self.clock)}
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
        ts = _timestamp(self.clock)
        # Events about cluster-scoped objects (PVs) live in "default", as client-go puts them.
        ns = namespace_of(obj) or "default"
        name = f"{name_of(obj)}.{secrets.token_hex(8)}"
        body: Obj = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": ns},
            "involvedObject": {
                "kind": _str(obj.get("kind")),
                "apiVersion": _str(obj.get("apiVersion")),
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


def _q(value: object) -> str:
    """Go's ``%q`` for the names in upstream's messages: a double-quoted string."""
    return json.dumps("" if value is None else str(value))


def _describe(err: BaseException) -> str:
    """A one-line account of an error: the Status message for API errors."""
    if isinstance(err, ApiException):
        message = ""
        if err.body:
            try:
                body = json.loads(err.body)
                message = _str(body.get("message")) if isinstance(body, dict) else ""
            except ValueError:
                message = ""
        return f"{err.status} {err.reason}: {message}".strip()
    return f"{type(err).__name__}: {err}".strip()


def _copy(obj: Obj) -> Obj:
    copied = copy_json(obj)
    if not isinstance(copied.get("metadata"), dict):
        copied["metadata"] = {}
    if not isinstance(copied.get("spec"), dict) and "spec" in copied:
        copied["spec"] = {}
    return copied


def _timestamp(clock: Clock) -> str:
    return clock.now().strftime("%Y-%m-%dT%H:%M:%SZ")


async def _first_of(*aws: Awaitable[Any]) -> None:
    """Wait until the first of ``aws`` finishes; cancel and await the others."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

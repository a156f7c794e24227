"""An in-memory kube-apiserver speaking the real REST + watch protocol over HTTP.

``ApiServer`` serves every resource of :data:`pyprovlib.kube._resources.RESOURCES` on
127.0.0.1 with the real server's semantics for what storage controllers and kubectl use:
resourceVersions, optimistic concurrency, finalizers, status subresources, the three patch
types, selectors, pagination, watches with bookmarks and 410 Expired, discovery, a minimal
OpenAPI and Table output. Tests drive it with the real kubernetes-asyncio client::

    async with ApiServer() as server, server.api_client() as client:
        await CoreV1Api(client).list_namespace()

``faults`` injects failures and latency, ``requests`` counts calls, ``drop_watches()``,
``compact()`` and ``restart()`` simulate what a real control plane does to its clients.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kubernetes_asyncio.client import ApiClient, Configuration

from pyprovlib._logging import get_logger
from pyprovlib.kube import _resources as R
from pyprovlib.kube._clock import Clock, RealClock
from pyprovlib.kube._objects import Obj
from pyprovlib.kube._resources import RESOURCES, Resource
from pyprovlib.testing import _discovery
from pyprovlib.testing._events import core_to_v1
from pyprovlib.testing._faults import Faults, Requests
from pyprovlib.testing._http import HttpServer, Reply, Request, Stream
from pyprovlib.testing._inprocess import InProcessTransport
from pyprovlib.testing._lifecycle import Listener
from pyprovlib.testing._registry import DeleteOptions, Registry
from pyprovlib.testing._requests import (
    Target,
    parse_target,
    selectors,
    table_mode,
    truthy,
    validate_list_options,
    validate_write_options,
)
from pyprovlib.testing._selectors import (
    parse_field_selector,
    parse_label_selector,
)
from pyprovlib.testing._status import (
    ApiError,
    bad_request,
    internal_error,
    method_not_allowed,
    unsupported_media_type,
)
from pyprovlib.testing._storage import Storage, copy_json, dumps
from pyprovlib.testing._watch import open_watch

if TYPE_CHECKING:
    from pyprovlib.testing._binder import PVBinder

__all__ = ["ApiServer", "InProcessTransport", "StorageView"]

log = get_logger(__name__)

_JSON = "application/json"
_MAX_BODY_BYTES = 64 * 1024 * 1024
_TEXT_HEADERS = {"Content-Type": "text/plain; charset=utf-8"}
_NOT_FOUND_PATH = ApiError(404, "the server could not find the requested resource", "NotFound", {})


class StorageView:
    """Read-only access to the server's objects for direct assertions (returns copies)."""

    def __init__(self, storage: Storage) -> None:
        self._storage = storage

    @staticmethod
    def _resource(resource: Resource | str) -> Resource:
        if isinstance(resource, Resource):
            return resource
        group, _, plural = resource.rpartition("/") if "/" in resource else ("", "", resource)
        for r in RESOURCES:
            if r.plural == plural and (not group or r.group == group):
                return r
        raise LookupError(f"unknown resource {resource!r}")

    def get(self, resource: Resource | str, namespace: str | None, name: str) -> Obj | None:
        """One object, or None. ``resource`` is a Resource or a plural (``"group/plural"`` for
        an ambiguous one such as ``"events.k8s.io/events"``)."""
        r = self._resource(resource)
        obj = self._storage.get(R.EVENTS if r is R.EVENTS_V1 else r, namespace, name)
        if obj is None:
            return None
        return core_to_v1(copy_json(obj)) if r is R.EVENTS_V1 else copy_json(obj)

    def list(self, resource: Resource | str, namespace: str | None = None) -> list[Obj]:
        """Every object of a resource (in one namespace when given), in key order."""
        r = self._resource(resource)
        if r is R.EVENTS_V1:
            return [
                core_to_v1(copy_json(o))
                for _k, o in self._storage.iter_from(R.EVENTS, namespace, None)
            ]
        return [copy_json(o) for _k, o in self._storage.iter_from(r, namespace, None)]

    @property
    def resource_version(self) -> int:
        """The current global resourceVersion."""
        return self._storage.rv


class ApiServer(Listener):
    """The in-memory API server. Use as an async context manager or start()/stop()."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        binder: bool = False,
        watch_window: int = 10000,
        bookmark_interval: float = 1.0,
        clock: Clock | None = None,
        binder_resync_period: float | None = None,
    ) -> None:
        super().__init__(host, port)
        self._want_binder = binder
        self._binder_resync_period = binder_resync_period
        self.bookmark_interval = bookmark_interval
        self.clock: Clock = clock or RealClock()
        self._storage = Storage(watch_window)
        self._registry = Registry(self._storage, self.clock)
        self.storage = StorageView(self._storage)
        """Direct read access to stored objects."""
        self.faults = Faults()
        """Fault injection: ``fail``, ``latency``, ``clear``."""
        self.requests = Requests()
        """Request counters by (verb, resource) and recent User-Agents."""
        self._http: HttpServer | None = None
        self._binder: PVBinder | None = None
        self._in_flight = 0

    # --- lifecycle ---------------------------------------------------------------------------

    @property
    def feature_gates(self) -> set[str]:
        """The alpha feature gates turned on, as kube-apiserver's ``--feature-gates``; empty
        by default. Only ``CrossNamespaceVolumeDataSource`` changes anything (a claim's
        ``dataSourceRef.namespace`` is kept instead of the reference being dropped)."""
        return self._registry.feature_gates

    @property
    def binder(self) -> PVBinder | None:
        """The PV binder while a server made with ``binder=True`` runs (None otherwise), for
        :func:`~pyprovlib.testing.wait_idle` before asserting what the binder did *not* do."""
        return self._binder

    @property
    def listening(self) -> bool:
        """Whether the server accepts connections (not before start, after stop, or while
        restarting)."""
        return self._http is not None

    async def _listen(self) -> None:
        http_server = HttpServer(self._serve, max_body=_MAX_BODY_BYTES, too_large=self._too_large)
        self._port = await http_server.start(self.host, self._port)
        self._http = http_server

    async def start(self) -> None:
        """Listen, then start the PV binder when asked for."""
        await self._listen()
        log.info("apiserver listening", url=self.url)
        if self._want_binder:
            from pyprovlib.testing._binder import BINDER_USER_AGENT, PVBinder

            # In-process, the binder skips TCP and HTTP but not the request pipeline: as seen
            # over the API it is the same client (see InProcessTransport).
            transport = InProcessTransport(self, BINDER_USER_AGENT)
            if self._binder_resync_period is None:
                self._binder = PVBinder(transport=transport, clock=self.clock)
            else:
                self._binder = PVBinder(
                    transport=transport,
                    clock=self.clock,
                    resync_period=self._binder_resync_period,
                )
            await self._binder.start()

    async def _close_site(self) -> None:
        self._storage.drop_watches()
        if self._http is not None:
            http_server, self._http = self._http, None
            await http_server.close()

    async def stop(self) -> None:
        """Stop the binder, end every watch, close every connection."""
        if self._binder is not None:
            binder, self._binder = self._binder, None
            await binder.stop()
        await self._close_site()

    async def restart(self) -> None:
        """Drop every connection (open watches end) and listen again on the same port; objects,
        history and counters are kept. Once begun, a restart completes even when the caller is
        cancelled (the cancellation is re-raised afterwards)."""
        # Cancelled half-way, a restart left either nothing listening or the old site still
        # bound with ``_http`` already cleared, so every later restart failed with EADDRINUSE.
        task = asyncio.ensure_future(self._restart())
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            await task
            raise

    async def _restart(self) -> None:
        await self._close_site()
        await self._listen()

    # --- clients -----------------------------------------------------------------------------

    def configuration(self) -> Configuration:
        """A kubernetes-asyncio Configuration pointing at this server."""
        config = Configuration(host=self.url)
        return config

    def api_client(self) -> ApiClient:
        """A new client for this server (close it, or use ``async with``): a
        kubernetes-asyncio ``ApiClient`` as controllers get it from
        :func:`~pyprovlib.kube.new_client` — a
        :class:`~pyprovlib.kube._config.LimitedApiClient`, unthrottled, whose raw-JSON requests
        (informers, events, leases, ``ResourceClient``) go through kubernetes-asyncio's aiohttp
        session as in production — so tests exercise the production request path."""
        from pyprovlib.kube._config import LimitedApiClient
        from pyprovlib.kube._ratelimit import TokenBucket

        return LimitedApiClient(self.configuration(), limiter=TokenBucket(0, 0))

    def write_kubeconfig(self, path: str | Path) -> Path:
        """Write a kubeconfig naming this server (no credentials) and return its path."""
        target = Path(path)
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "pyprovlib", "cluster": {"server": self.url}}],
            "users": [{"name": "pyprovlib", "user": {}}],
            "contexts": [
                {
                    "name": "pyprovlib",
                    "context": {
                        "cluster": "pyprovlib",
                        "user": "pyprovlib",
                        "namespace": "default",
                    },
                }
            ],
            "current-context": "pyprovlib",
            "preferences": {},
        }
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(doc, indent=2) + "\n")
        return target

    # --- control-plane events ----------------------------------------------------------------

    def drop_watches(self) -> int:
        """End every open watch stream now; returns how many were open."""
        return self._storage.drop_watches()

    def compact(self) -> None:
        """Forget the event history: a watch or continue token from before now gets 410."""
        self._storage.compact()

    @property
    def open_watches(self) -> int:
        """Watch streams currently open."""
        return self._storage.watcher_count()

    @property
    def in_flight(self) -> int:
        """Requests being served now (held by injected latency, say), not counting open watch
        streams: 0 is the point after which a request that was cancelled, or answered, can
        have no further effect."""
        return self._in_flight

    # --- HTTP --------------------------------------------------------------------------------

    async def _serve(self, request: Request) -> Reply | Stream:
        """One request, whichever way it came (HTTP, or the in-process binder's transport)."""
        self._in_flight += 1
        try:
            return await self._dispatch(request)
        except ApiError as e:
            return self._error(e)
        except asyncio.CancelledError:
            raise
        except (ConnectionResetError, BrokenPipeError):
            raise
        except RecursionError:
            # Only a body nested deeper than Python can parse or copy gets here: the client's
            # fault, not the server's (it used to be a 500 Internal error).
            return self._error(bad_request("the request body is nested too deeply"))
        except Exception as e:
            log.exception("apiserver request failed", method=request.method, path=request.path)
            return self._error(internal_error(f"{type(e).__name__}: {e}"))
        finally:
            self._in_flight -= 1

    @classmethod
    def _too_large(cls) -> Reply:
        # the real server's answer to a body over its limit
        return cls._error(
            ApiError(
                413,
                f"Request entity too large: limit is {_MAX_BODY_BYTES}",
                "RequestEntityTooLarge",
                {},
            )
        )

    @staticmethod
    def _error(err: ApiError) -> Reply:
        return Reply(err.code, dumps(err.body()), {"Content-Type": _JSON, **err.headers})

    @staticmethod
    def _json(obj: Any, status: int = 200) -> Reply:
        return Reply(status, dumps(obj))

    async def _dispatch(self, request: Request) -> Reply | Stream:
        path = request.path.rstrip("/") or "/"
        if path.startswith(("/api", "/apis")):
            target = parse_target(path)
            if target is not None:
                return await self._resource_request(request, target)
        if request.method not in ("GET", "HEAD"):
            raise (_NOT_FOUND_PATH if self._discovery(path) is None else method_not_allowed(""))
        if path in ("/healthz", "/readyz", "/livez") or path.startswith(
            ("/healthz/", "/readyz/", "/livez/")
        ):
            return Reply(200, b"ok", _TEXT_HEADERS)
        body = self._discovery(path)
        if body is None:
            raise _NOT_FOUND_PATH
        return self._json(body)

    def _discovery(self, path: str) -> Any:
        if path == "/version":
            return _discovery.version_info()
        if path == "/api":
            return _discovery.api_versions(f"{self.host}:{self._port}")
        if path == "/apis":
            return _discovery.api_group_list()
        if path == "/openapi/v3":
            return _discovery.openapi_v3_root()
        if path.startswith("/openapi/v3/"):
            return _discovery.openapi_v3_document(path[len("/openapi/v3/") :])
        parts = [p for p in path.split("/") if p]
        if parts[:1] == ["api"] and len(parts) == 2:
            return _discovery.resource_list(parts[1])
        if parts[:1] == ["apis"] and len(parts) == 2:
            return _discovery.api_group(parts[1])
        if parts[:1] == ["apis"] and len(parts) == 3:
            return _discovery.resource_list(f"{parts[1]}/{parts[2]}")
        return None

    async def _resource_request(self, request: Request, target: Target) -> Reply | Stream:
        q = request.query
        method = request.method
        r = target.resource
        is_watch = target.watch_path or truthy(q.get("watch"))
        if target.name is None:
            verb = {
                "GET": "watch" if is_watch else "list",
                "POST": "create",
                "DELETE": "deletecollection",
            }.get(method, "")
            if target.watch_path and method != "GET":
                verb = ""
        else:
            verb = {
                "GET": "watch" if is_watch else "get",
                "PUT": "update",
                "PATCH": "patch",
                "DELETE": "delete",
            }.get(method, "")
            if target.subresource and verb in ("delete", "watch"):
                verb = ""
        counted = r.plural + (f"/{target.subresource}" if target.subresource else "")
        self.requests.record(verb or method.lower(), counted, request.headers.get("User-Agent", ""))
        delay = self.faults.take_latency(verb, counted, target.namespace, target.name)
        if delay > 0:
            await self.clock.sleep(delay)
        if not verb:
            raise method_not_allowed(method)
        injected = self.faults.take_failure(verb, counted, target.namespace, target.name)
        if injected is None:
            return await self._carry_out(request, target, verb)
        error, applied = injected
        if applied:
            await self._carry_out(request, target, verb)
        raise error

    async def _carry_out(self, request: Request, target: Target, verb: str) -> Reply | Stream:
        q = request.query
        r = target.resource
        dry_run = q.get("dryRun") == "All"
        validate_write_options(verb, q.getall("dryRun", []), q.get("fieldValidation"))
        ns, name = target.namespace, target.name

        if verb == "watch":
            return self._watch(request, target)
        if verb == "list":
            return self._list(request, target)
        if verb == "get":
            obj = self._registry.get(r, ns, name or "")
            if r is not R.EVENTS_V1 and not table_mode(request):
                return Reply(200, self._storage.encoded_item(r, (ns or "", name or ""), obj))
            return self._respond(request, r, obj)
        if verb == "create":
            body = await self._read_body(request)
            obj = self._registry.create(r, ns, body, dry_run=dry_run)
            return self._respond(request, r, obj, 201)
        if verb == "update":
            body = await self._read_body(request)
            obj, created = self._registry.update(
                r, ns, name or "", body, subresource=target.subresource, dry_run=dry_run
            )
            return self._respond(request, r, obj, 201 if created else 200)
        if verb == "patch":
            content_type = request.content_type
            raw = await request.read()
            obj = self._registry.patch(
                r,
                ns,
                name or "",
                content_type,
                raw,
                subresource=target.subresource,
                dry_run=dry_run,
            )
            return self._respond(request, r, obj)
        options = await self._delete_options(request)
        if verb == "delete":
            return self._json(self._registry.delete(r, ns, name or "", options))
        # deletecollection
        labels = parse_label_selector(q.get("labelSelector"))
        fields = parse_field_selector(q.get("fieldSelector"), r.group, r.plural)
        items = self._registry.delete_collection(r, ns, labels, fields, options)
        return self._json(
            {
                "kind": r.list_kind,
                "apiVersion": r.api_version,
                "metadata": {"resourceVersion": str(self._storage.rv)},
                "items": items,
            }
        )

    async def _read_body(self, request: Request) -> Any:
        content_type = request.content_type
        raw = await request.read()
        if content_type in ("application/yaml", "application/x-yaml"):
            import yaml

            try:
                return yaml.safe_load(raw)
            except yaml.YAMLError as e:
                raise bad_request(f"error converting YAML to JSON: {e}") from e
        if content_type not in (
            _JSON,
            "application/octet-stream",
            "",
            "text/plain",
        ) and not content_type.endswith("+json"):
            raise unsupported_media_type(content_type)
        try:
            return json.loads(raw) if raw else {}
        except ValueError as e:
            raise bad_request(f"couldn't get version/kind; json parse error: {e}") from e

    async def _delete_options(self, request: Request) -> DeleteOptions:
        q = request.query
        body: Any = {}
        raw = await request.read()
        if raw:
            try:
                body = json.loads(raw)
            except ValueError as e:
                raise bad_request(f"couldn't get version/kind; json parse error: {e}") from e
            if not isinstance(body, dict):
                raise bad_request("DeleteOptions must be an object")
        pre = body.get("preconditions") or {}
        grace = body.get("gracePeriodSeconds", q.get("gracePeriodSeconds"))
        dry_run = body.get("dryRun") or q.getall("dryRun", [])
        try:
            grace_value = int(grace) if grace is not None else None
        except ValueError as e:
            raise bad_request(f"invalid gracePeriodSeconds: {grace}") from e
        return DeleteOptions(
            uid=pre.get("uid"),
            resource_version=pre.get("resourceVersion"),
            dry_run="All" in dry_run,
            propagation_policy=body.get("propagationPolicy") or q.get("propagationPolicy"),
            grace_period_seconds=grace_value,
        )

    # --- output ------------------------------------------------------------------------------

    def _respond(self, request: Request, r: Resource, obj: Obj, status: int = 200) -> Reply:
        if table_mode(request):
            include = request.query.get("includeObject", "Metadata")
            table = _discovery.to_table(
                r,
                [obj],
                self.clock.now(),
                include,
                {"resourceVersion": obj.get("metadata", {}).get("resourceVersion", "")},
            )
            return self._json(table, status)
        # A write's response shares its encoding with the watch lines of the same event.
        return Reply(status, self._storage.encoded(obj))

    def _list(self, request: Request, target: Target) -> Reply:
        q = request.query
        r = target.resource
        labels, fields = selectors(request.query, r)
        try:
            limit = max(int(q.get("limit") or 0), 0)  # a negative limit means none
        except ValueError as e:
            raise bad_request(f"invalid limit: {q.get('limit')}") from e
        rv_param = q.get("resourceVersion")
        validate_list_options(rv_param, q.get("resourceVersionMatch"))
        if rv_param not in (None, "", "0"):
            try:
                wanted = int(rv_param or 0)
            except ValueError as e:
                raise bad_request(f"invalid resource version: {rv_param}") from e
            if wanted > self._storage.rv:
                raise ApiError(
                    504,
                    f"Too large resource version: {wanted}, current: {self._storage.rv}",
                    "Timeout",
                    {
                        "causes": [
                            {
                                "reason": "ResourceVersionTooLarge",
                                "message": "Too large resource version",
                            }
                        ],
                        "retryAfterSeconds": 1,
                    },
                )
        if rv_param == "0" and not q.get("continue"):
            # served from the "cache": pagination is ignored, like the real watch cache
            limit = 0
        result = self._registry.list_page(
            r,
            target.namespace,
            labels=labels,
            fields=fields,
            field_text=q.get("fieldSelector"),
            limit=limit,
            token=q.get("continue"),
        )
        meta: Obj = {"resourceVersion": result.resource_version}
        if result.continue_token:
            meta["continue"] = result.continue_token
            if result.remaining is not None:
                meta["remainingItemCount"] = result.remaining
        if table_mode(request):
            include = q.get("includeObject", "Metadata")
            return self._json(_discovery.to_table(r, result.items, self.clock.now(), include, meta))
        # Stored objects keep their encoding until they change: a relist re-encodes nothing
        # that has not been written since (the bytes are what dumps(body) would write).
        stored = R.EVENTS if r is R.EVENTS_V1 else r
        items = [self._storage.encoded_item(stored, key, obj) for key, obj in result.keyed_items]
        body = b'{"kind":%s,"apiVersion":%s,"metadata":%s,"items":[%s]}' % (
            dumps(r.list_kind),
            dumps(r.api_version),
            dumps(meta),
            b",".join(items),
        )
        return Reply(200, body)

    # --- watch -------------------------------------------------------------------------------

    def _watch(self, request: Request, target: Target) -> Stream:
        return open_watch(
            self._storage,
            self.clock,
            self.bookmark_interval,
            request,
            target,
            table=table_mode(request),
        )

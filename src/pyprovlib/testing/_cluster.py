"""One harness for end-to-end tests that run in memory by default, against a real cluster
when ``PYPROVLIB_E2E_KUBECONFIG`` names a kubeconfig, and against a real control plane started
from an assets directory when ``PYPROVLIB_KUBE_ASSETS`` (or ``KUBEBUILDER_ASSETS``) names one.

``TestCluster.from_environment()`` is an async context manager yielding a kubernetes-asyncio
``ApiClient``, a fresh namespace, and helpers that behave the same in both places. Steps that
need in-memory-only control (fault injection, restarts) call :meth:`TestCluster.require_in_memory`
and are skipped on a real cluster.

Scheduling: on a real cluster the scheduler sets ``volume.kubernetes.io/selected-node`` on a
``WaitForFirstConsumer`` claim once a pod using it is created, so tests should call
:meth:`TestCluster.create_consumer_pod` rather than annotate claims themselves; in memory that
method plays the scheduler.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from kubernetes_asyncio.client import ApiClient, Configuration
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config import load_kube_config

from pyprovlib._logging import get_logger
from pyprovlib.kube._errors import is_already_exists, is_not_found
from pyprovlib.kube._objects import Obj, annotations_of, meta, name_of
from pyprovlib.kube._resources import (
    NAMESPACES,
    NODES,
    PERSISTENT_VOLUME_CLAIMS,
    PERSISTENT_VOLUMES,
    PODS,
    STORAGE_CLASSES,
    Resource,
)
from pyprovlib.testing._binder import (
    ANN_SELECTED_NODE,
    HttpTransport,
    claim_class,
    set_selected_node,
)

if TYPE_CHECKING:
    from pyprovlib.testing._controlplane import ControlPlane
    from pyprovlib.testing._server import ApiServer

__all__ = ["DEFAULT_POD_IMAGE", "ENV_KUBECONFIG", "ENV_POD_IMAGE", "TestCluster"]

log = get_logger(__name__)

ENV_KUBECONFIG = "PYPROVLIB_E2E_KUBECONFIG"
"""Names the kubeconfig of a real cluster to run end-to-end tests against."""
ENV_POD_IMAGE = "PYPROVLIB_E2E_POD_IMAGE"
"""Overrides the image of the pods :meth:`TestCluster.create_consumer_pod` creates."""
DEFAULT_POD_IMAGE = "registry.k8s.io/pause:3.10"
"""A tiny image that does nothing, forever."""

_IN_MEMORY_NODE = "pyprovlib-node-1"
HOSTNAME_LABEL = "kubernetes.io/hostname"

T = TypeVar("T")


class TestCluster:
    """A cluster for one test: the in-memory API server with its PV binder, a real cluster,
    or a real control plane started from an assets directory.

    Attributes: ``api_client`` (kubernetes-asyncio), ``namespace`` (unique, created on entry,
    deleted on exit), ``server`` (the :class:`~pyprovlib.testing.ApiServer`, or None on
    a real cluster), ``control_plane`` (the
    :class:`~pyprovlib.testing.ControlPlane` when running on one, else None) and
    ``is_real``.

    ``TestCluster(assets=DIR)`` runs on the process's shared control plane
    (:func:`~pyprovlib.testing.shared_control_plane`), launched from ``DIR`` on
    first use; ``TestCluster(control_plane=cp)`` on one the caller launched.
    """

    __test__ = False  # a harness, not a pytest test class

    def __init__(
        self,
        kubeconfig: str | os.PathLike[str] | None = None,
        *,
        assets: str | os.PathLike[str] | None = None,
        control_plane: ControlPlane | None = None,
    ) -> None:
        if sum(x is not None for x in (kubeconfig, assets, control_plane)) > 1:
            raise ValueError("give at most one of kubeconfig, assets and control_plane")
        self.kubeconfig: Path | None = Path(kubeconfig) if kubeconfig else None
        self.assets: Path | None = Path(assets) if assets else None
        self.control_plane: ControlPlane | None = control_plane
        self.is_real = any(x is not None for x in (kubeconfig, assets, control_plane))
        self.namespace = f"pyprovlib-e2e-{secrets.token_hex(4)}"
        self.server: ApiServer | None = None
        self._api_client: ApiClient | None = None
        self._tracked: list[tuple[Resource, str]] = []

    @classmethod
    def from_environment(cls) -> TestCluster:
        """A cluster on ``$PYPROVLIB_E2E_KUBECONFIG`` if set; else on the shared control plane
        of ``$PYPROVLIB_KUBE_ASSETS`` / ``$KUBEBUILDER_ASSETS`` if set; else an in-memory one."""
        from pyprovlib.testing._controlplane import assets_from_environment

        kubeconfig = os.environ.get(ENV_KUBECONFIG)
        if kubeconfig:
            return cls(kubeconfig)
        return cls(assets=assets_from_environment())

    @property
    def api_client(self) -> ApiClient:
        """The kubernetes-asyncio client for this cluster (only inside ``async with``)."""
        if self._api_client is None:
            raise RuntimeError("TestCluster is not entered; use `async with`")
        return self._api_client

    # -- lifecycle ---------------------------------------------------------------------------

    async def __aenter__(self) -> TestCluster:
        try:
            if self.assets is not None:
                from pyprovlib.testing._controlplane import shared_control_plane

                self.control_plane = await shared_control_plane(self.assets)
            if self.control_plane is not None:
                self.kubeconfig = self.control_plane.kubeconfig_path
            if self.kubeconfig is not None:
                configuration = Configuration()
                await load_kube_config(
                    config_file=str(self.kubeconfig), client_configuration=configuration
                )
                self._api_client = ApiClient(configuration=configuration)
            else:
                from pyprovlib.testing._server import ApiServer

                server = ApiServer(binder=True)
                self.server = server
                await server.start()
                self._api_client = server.api_client()
            await self._http().json(
                "POST",
                NAMESPACES.path(),
                body={
                    "apiVersion": "v1",
                    "kind": "Namespace",
                    "metadata": {
                        "name": self.namespace,
                        "labels": {"app.kubernetes.io/created-by": "pyprovlib-e2e"},
                    },
                },
            )
        except BaseException:
            await self._close()
            raise
        log.info("test cluster ready", namespace=self.namespace, real=self.is_real)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        try:
            await self._cleanup()
        finally:
            await self._close()

    async def _cleanup(self) -> None:
        if self._api_client is None:
            return
        http = self._http()
        for resource, name in reversed(self._tracked):
            path = resource.path(name=name)
            await _delete_quietly(http, path)
            if self.is_real:
                await _release_finalizers(http, path)
        self._tracked.clear()
        # Namespaced objects go with the namespace (asynchronously on a real cluster).
        await _delete_quietly(http, NAMESPACES.path(name=self.namespace))
        if self.is_real:
            # The in-memory server goes away with the test; a real cluster keeps the PVs made
            # for this namespace's claims (Released, their provisioner stopped) forever.
            await self._delete_namespace_volumes(http)

    async def _delete_namespace_volumes(self, http: HttpTransport) -> None:
        cont = ""
        names: list[str] = []
        while True:
            query: dict[str, str | int] = {"limit": 500}
            if cont:
                query["continue"] = cont
            try:
                page = await http.json("GET", PERSISTENT_VOLUMES.path(), query=query)
            except (ApiException, TimeoutError, OSError) as err:
                log.warning("test cluster cleanup: listing PVs failed", error=repr(err))
                return
            for pv in page.get("items") or []:
                ref = (pv.get("spec") or {}).get("claimRef") or {}
                if ref.get("namespace") == self.namespace:
                    names.append(name_of(pv))
            cont = str((page.get("metadata") or {}).get("continue") or "")
            if not cont:
                break
        for name in names:
            path = PERSISTENT_VOLUMES.path(name=name)
            await _delete_quietly(http, path)
            await _release_finalizers(http, path)

    async def _close(self) -> None:
        if self._api_client is not None:
            await self._api_client.close()
            self._api_client = None
        if self.server is not None:
            await self.server.stop()
            self.server = None

    def _http(self) -> HttpTransport:
        return HttpTransport(self.api_client)

    # -- helpers that work in both places ----------------------------------------------------

    @staticmethod
    def unique_name(prefix: str) -> str:
        """``prefix-<random>``: a DNS-1123 name unlikely to collide across runs."""
        return f"{prefix.rstrip('-').lower()}-{secrets.token_hex(4)}"

    def require_in_memory(self, reason: str) -> None:
        """Skip the calling test on a real cluster: for steps needing the in-memory server's
        control (fault injection, restarts, compaction)."""
        if self.is_real:
            import pytest

            pytest.skip(f"needs the in-memory API server: {reason}")

    @property
    def owns_cluster(self) -> bool:
        """True in memory and on a :class:`~pyprovlib.testing.ControlPlane` the
        harness launched (nothing else uses it, no kubelet or cloud controller acts on fake
        Nodes); False on a cluster named by ``PYPROVLIB_E2E_KUBECONFIG``."""
        return not self.is_real or self.control_plane is not None or self.assets is not None

    def require_own_cluster(self, reason: str) -> None:
        """Skip the calling test on a cluster the harness does not own
        (:attr:`owns_cluster`): for steps that create fake Nodes or CSINodes, or set
        ``selected-node`` without a pod."""
        if not self.owns_cluster:
            import pytest

            pytest.skip(
                f"needs a cluster of its own (in memory or a launched control plane): {reason}"
            )

    @property
    def snapshot_controller_may_run(self) -> bool:
        """Whether a snapshot controller may act on VolumeSnapshots behind the test's back:
        False in memory and on a :class:`~pyprovlib.testing.ControlPlane` (which
        installs the CRDs but runs none), True on any other real cluster."""
        return self.is_real and self.control_plane is None and self.assets is None

    def require_no_snapshot_controller(self, reason: str) -> None:
        """Skip the calling test where a snapshot controller may run
        (:attr:`snapshot_controller_may_run`): for snapshot states one would not leave alone."""
        if self.snapshot_controller_may_run:
            import pytest

            pytest.skip(f"a snapshot controller may run on this cluster: {reason}")

    def track(self, resource: Resource, name: str) -> None:
        """Delete the cluster-scoped object ``name`` of ``resource`` when the cluster exits
        (namespaced objects go with the namespace)."""
        if resource.namespaced:
            raise ValueError(f"{resource.plural} is namespaced; its namespace is cleaned up")
        self._tracked.append((resource, name))

    async def wait_for(
        self,
        predicate: Callable[[], Awaitable[T | None]],
        timeout: float = 30.0,  # noqa: ASYNC109
        message: str = "condition",
        interval: float = 0.02,
    ) -> T:
        """Poll the async ``predicate`` until it returns something truthy and return that.

        Raises ``AssertionError`` naming ``message`` and the last value seen after
        ``timeout`` seconds. The poll interval grows from ``interval`` to half a second.
        """
        deadline = time.monotonic() + timeout
        while True:
            last = await predicate()
            if last:
                return last
            if time.monotonic() >= deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {message}: {last!r}")
            await asyncio.sleep(min(interval, max(0.0, deadline - time.monotonic())))
            interval = min(interval * 1.5, 0.5)

    async def schedule(self, claim_name: str, node: str) -> None:
        """Set ``volume.kubernetes.io/selected-node`` on a claim, as the scheduler would.

        In memory and on a launched control plane (no pod uses the claim, so kube-scheduler
        leaves it alone); on another real cluster the scheduler owns this annotation, so tests
        use :meth:`create_consumer_pod` there."""
        self.require_own_cluster("selected-node is set by the scheduler on a shared cluster")
        await set_selected_node(self.api_client, self.namespace, claim_name, node)

    async def ready_nodes(self, count: int) -> list[Obj]:
        """``count`` nodes to place claims on, sorted by name.

        On a real cluster: Ready, schedulable, untainted nodes that exist (the test is skipped
        when there are fewer). In memory: ``count`` new nodes, Ready, labelled
        ``kubernetes.io/hostname=<name>.internal`` (a hostname that is not the node name, as on
        some clouds, so tests see which of the two a component uses), deleted when the cluster
        exits."""
        from pyprovlib.testing._scheduler import node_schedulable

        http = self._http()
        if self.is_real:
            listed = await http.json("GET", NODES.path())
            usable = sorted(
                (n for n in listed.get("items") or [] if node_schedulable(n)), key=name_of
            )
            if len(usable) < count:
                import pytest

                pytest.skip(
                    f"needs {count} Ready, schedulable nodes; the cluster has {len(usable)}"
                )
            return usable[:count]
        nodes: list[Obj] = []
        for _ in range(count):
            node_name = self.unique_name("node")
            body: Obj = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": node_name,
                    "labels": {HOSTNAME_LABEL: f"{node_name}.internal"},
                },
                "status": {"conditions": [{"type": "Ready", "status": "True"}]},
            }
            nodes.append(await http.json("POST", NODES.path(), body=body))
            self.track(NODES, node_name)
        return sorted(nodes, key=name_of)

    async def create_consumer_pod(
        self,
        claim_name: str,
        *,
        name: str | None = None,
        image: str | None = None,
        node: Obj | None = None,
    ) -> Obj:
        """Create a small pod mounting ``claim_name`` and return it.

        On a real cluster the scheduler then picks a node (and sets selected-node on a
        ``WaitForFirstConsumer`` claim); ``node`` (one of :meth:`ready_nodes`) pins the pod to
        that node with a ``nodeSelector`` on its ``kubernetes.io/hostname`` label. In memory this
        plays the scheduler: it picks ``node``, or a node (creating one if the cluster has none),
        and sets selected-node on the claim when its class delays binding and it is not bound
        yet. The pod itself is never run in memory.
        """
        pod_name = name or self.unique_name("consumer")
        pod: Obj = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": pod_name, "namespace": self.namespace},
            "spec": {
                "terminationGracePeriodSeconds": 0,
                "containers": [
                    {
                        "name": "consumer",
                        "image": image or os.environ.get(ENV_POD_IMAGE) or DEFAULT_POD_IMAGE,
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                    }
                ],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim_name}}],
            },
        }
        if node is not None:
            hostname = (meta(node).get("labels") or {}).get(HOSTNAME_LABEL)
            if not hostname:
                raise ValueError(f"node {name_of(node)!r} has no {HOSTNAME_LABEL} label to pin to")
            pod["spec"]["nodeSelector"] = {HOSTNAME_LABEL: hostname}
        http = self._http()
        created = await http.json("POST", PODS.path(self.namespace), body=pod)
        if not self.is_real:
            await self._play_scheduler(claim_name, None if node is None else name_of(node))
        return created

    async def _play_scheduler(self, claim_name: str, node: str | None = None) -> None:
        http = self._http()
        claim = await http.json("GET", PERSISTENT_VOLUME_CLAIMS.path(self.namespace, claim_name))
        spec = claim.get("spec")
        if isinstance(spec, dict) and spec.get("volumeName"):
            return
        if ANN_SELECTED_NODE in annotations_of(claim):
            return
        cls = claim_class(claim)
        if not cls:
            return
        try:
            sc = await http.json("GET", STORAGE_CLASSES.path(name=cls))
        except ApiException as err:
            if is_not_found(err):
                return
            raise
        if sc.get("volumeBindingMode") != "WaitForFirstConsumer":
            return
        await set_selected_node(
            self.api_client, self.namespace, claim_name, node or await self._node()
        )

    async def _node(self) -> str:
        http = self._http()
        nodes = await http.json("GET", NODES.path(), query={"limit": 1})
        items = nodes.get("items")
        if isinstance(items, list) and items and isinstance(items[0], dict) and name_of(items[0]):
            return name_of(items[0])
        try:
            await http.json(
                "POST",
                NODES.path(),
                body={
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {
                        "name": _IN_MEMORY_NODE,
                        "labels": {HOSTNAME_LABEL: _IN_MEMORY_NODE},
                    },
                },
            )
            self.track(NODES, _IN_MEMORY_NODE)
        except ApiException as err:
            if not is_already_exists(err):
                raise
        return _IN_MEMORY_NODE


def _kubernetes_finalizer(name: str) -> bool:
    """A finalizer the cluster's own controllers remove (``kubernetes.io/pv-protection``,
    the garbage collector's ``foregroundDeletion`` and ``orphan``)."""
    return name.startswith("kubernetes.io/") or name in ("foregroundDeletion", "orphan")


async def _release_finalizers(http: HttpTransport, path: str, attempts: int = 5) -> None:
    """Remove from the deleted test object at ``path`` the finalizers of the test's own
    controllers (a provisioner's, an attacher's): they stopped with the test and would never
    remove them, so the object would stay Terminating in the cluster forever. The cluster's
    own finalizers are left to the cluster. A conflict (kube-controller-manager updating the
    object meanwhile) is retried on a fresh read."""
    for _ in range(attempts):
        try:
            obj = await http.json("GET", path)
        except (ApiException, TimeoutError, OSError):
            return
        finalizers = meta(obj).get("finalizers") or []
        kept = [f for f in finalizers if _kubernetes_finalizer(f)]
        if kept == finalizers:
            return
        try:
            await http.json(
                "PATCH",
                path,
                body={
                    "metadata": {
                        "finalizers": kept or None,
                        "resourceVersion": meta(obj).get("resourceVersion"),
                    }
                },
                content_type="application/merge-patch+json",
            )
            return
        except ApiException as err:
            if err.status != 409:
                log.warning("test cluster cleanup failed", path=path, status=err.status)
                return
        except (TimeoutError, OSError) as err:
            log.warning("test cluster cleanup failed", path=path, error=repr(err))
            return
    log.warning("test cluster cleanup: finalizers kept changing", path=path)


async def _delete_quietly(http: HttpTransport, path: str) -> None:
    try:
        await http.json("DELETE", path)
    except ApiException as err:
        if not is_not_found(err):
            log.warning("test cluster cleanup failed", path=path, status=err.status)
    except (TimeoutError, OSError) as err:
        log.warning("test cluster cleanup failed", path=path, error=repr(err))

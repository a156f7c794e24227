"""A real Kubernetes control plane for tests, started from a directory of binaries — the
counterpart of controller-runtime's envtest.

Given an assets directory in setup-envtest's layout (``etcd``, ``kube-apiserver``, ``kubectl``;
optionally ``kube-controller-manager`` and ``kube-scheduler``), :class:`ControlPlane` starts etcd
and kube-apiserver on free loopback ports in a private temporary directory with freshly
generated certificates, optionally the controller-manager and the scheduler — or, where those
binaries are absent, pyprovlib's own PV binder and pod scheduler in a process of their own —
registers kubelet-less Ready nodes, installs the ``snapshot.storage.k8s.io/v1`` CRDs, and writes
an admin kubeconfig::

    async with ControlPlane.start("/path/to/assets") as cp:
        async with cp.api_client() as client:
            ...
        subprocess.run(["kubectl", "--kubeconfig", str(cp.kubeconfig_path), "get", "nodes"])

Several can run at once on one machine. Nothing outlives it: :meth:`ControlPlane.stop` ends
every process and removes the directory, and a small reaper process (``_reaper``) does the same
when the process that started it dies without stopping it (SIGKILL included).

The components are plain :class:`subprocess.Popen` children, not asyncio subprocesses, on
purpose: a control plane shared by a pytest session outlives each test's event loop, and an
asyncio subprocess belongs to the loop that started it. Waiting is done with ``asyncio.sleep``
polls (or :func:`asyncio.to_thread`), so every coroutine here may run on any loop.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import shutil
import ssl
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from kubernetes_asyncio.client import ApiClient, Configuration
from kubernetes_asyncio.client.exceptions import ApiException

from pyprovlib._logging import get_logger
from pyprovlib.testing._components import (
    ControlPlaneError,
    _Component,
    _free_port,
    _launched,
    _Reaper,
)
from pyprovlib.testing._nodes import _established, _exists, register_ready_node

__all__ = [
    "ENV_KUBEBUILDER_ASSETS",
    "ENV_KUBE_ASSETS",
    "ENV_KUBE_LOG_DIR",
    "ControlPlane",
    "ControlPlaneError",
    "assets_from_environment",
    "register_ready_node",
    "shared_control_plane",
    "stop_shared_control_plane",
]

log = get_logger(__name__)

ENV_KUBE_ASSETS = "PYPROVLIB_KUBE_ASSETS"
"""Names an assets directory: the fixtures then run on a real control plane started from it."""
ENV_KUBEBUILDER_ASSETS = "KUBEBUILDER_ASSETS"
"""setup-envtest's variable, honoured too (after :data:`ENV_KUBE_ASSETS`)."""
ENV_KUBE_LOG_DIR = "PYPROVLIB_KUBE_LOG_DIR"
"""Where the shared control plane keeps its components' logs (default: its temporary
directory, removed with it)."""

CRD_DIR = Path(__file__).with_name("crds")
NODE_NAME_PREFIX = "pyprovlib-node-"


def assets_from_environment() -> Path | None:
    """The assets directory named by ``$PYPROVLIB_KUBE_ASSETS`` or ``$KUBEBUILDER_ASSETS``."""
    for name in (ENV_KUBE_ASSETS, ENV_KUBEBUILDER_ASSETS):
        value = os.environ.get(name)
        if value:
            return Path(value)
    return None


class ControlPlane:
    """etcd + kube-apiserver (+ kube-controller-manager + kube-scheduler) started from
    ``assets``, with Ready kubelet-less nodes and the VolumeSnapshot CRDs.

    Arguments (all keyword-only but ``assets``):

    - ``controller_manager`` / ``scheduler``: run kube-controller-manager / kube-scheduler
      (``None``, the default: when the binary is in ``assets``). Where one is not run,
      pyprovlib's :class:`~pyprovlib.testing.PVBinder` /
      :class:`~pyprovlib.testing.PodScheduler` play its part, in a process of their
      own (``python -m pyprovlib.testing --binder-only``/``--scheduler-only``).
    - ``nodes``: how many Ready nodes to register (``pyprovlib-node-1`` …), default 2.
    - ``snapshot_crds``: install the ``snapshot.storage.k8s.io/v1`` CRDs (default True).
    - ``log_dir``: keep the components' logs there (default: in the temporary directory,
      removed on stop).
    - ``start_timeout``: seconds each component may take to become ready (default 120).
    - ``apiserver_args``: extra kube-apiserver flags (``--feature-gates=…``).
    - ``controller_manager_args``: extra kube-controller-manager flags (``--kube-api-qps=…``).

    After :meth:`launch`: :attr:`kubeconfig_path` (an admin kubeconfig), :attr:`url`,
    :attr:`directory`, :attr:`node_names`. Use :meth:`start` (``async with``) or
    :meth:`launch` / :meth:`stop`; :meth:`stop_sync` stops it without an event loop.
    """

    def __init__(
        self,
        assets: str | os.PathLike[str],
        *,
        controller_manager: bool | None = None,
        scheduler: bool | None = None,
        nodes: int = 2,
        snapshot_crds: bool = True,
        log_dir: str | os.PathLike[str] | None = None,
        start_timeout: float = 120.0,
        apiserver_args: Sequence[str] = (),
        controller_manager_args: Sequence[str] = (),
    ) -> None:
        self.assets = Path(assets)
        for binary in ("etcd", "kube-apiserver"):
            if not os.access(self.assets / binary, os.X_OK):
                raise ControlPlaneError(
                    f"{self.assets / binary} is missing or not executable: an assets directory "
                    "holds etcd and kube-apiserver (setup-envtest's layout; "
                    "see docs/testing.md)"
                )
        self.run_controller_manager = self._wanted(controller_manager, "kube-controller-manager")
        self.run_scheduler = self._wanted(scheduler, "kube-scheduler")
        self.node_count = nodes
        self.snapshot_crds = snapshot_crds
        self.start_timeout = start_timeout
        self.apiserver_args = list(apiserver_args)
        self.controller_manager_args = list(controller_manager_args)
        self._log_dir = Path(log_dir) if log_dir is not None else None
        self.directory: Path | None = None
        self.kubeconfig_path: Path | None = None
        self.url = ""
        self.etcd_url = ""
        self.node_names: list[str] = []
        self._components: dict[str, _Component] = {}
        self._reaper: _Reaper | None = None
        self._ssl: ssl.SSLContext | None = None
        self._ca: Any = None

    def _wanted(self, flag: bool | None, binary: str) -> bool:
        present = os.access(self.assets / binary, os.X_OK)
        if flag and not present:
            raise ControlPlaneError(f"{self.assets / binary} is missing or not executable")
        return present if flag is None else flag

    # -- lifecycle -----------------------------------------------------------------------------

    @classmethod
    @contextlib.asynccontextmanager
    async def start(
        cls, assets: str | os.PathLike[str], **options: Any
    ) -> AsyncIterator[ControlPlane]:
        """``async with ControlPlane.start(assets, **options) as cp:`` — launched on entry,
        stopped on exit."""
        async with _launched(cls(assets, **options)) as plane:
            yield plane

    @property
    def running(self) -> bool:
        """True between :meth:`launch` and :meth:`stop`."""
        return self.directory is not None

    async def launch(self) -> None:
        """Start every component and wait until the control plane is usable."""
        if self.directory is not None:
            raise RuntimeError("this ControlPlane is already running")
        directory = Path(tempfile.mkdtemp(prefix="pyprovlib-controlplane-"))
        self.directory = directory
        self._reaper = _Reaper(directory)
        try:
            await asyncio.to_thread(self._write_certificates, directory)
            await self._start_core(directory)
            await self._start_controllers(directory)
            await self._prepare_cluster()
        except BaseException:
            await asyncio.to_thread(self.stop_sync)
            raise
        log.info(
            "control plane ready",
            url=self.url,
            directory=str(directory),
            controller_manager=self.run_controller_manager,
            scheduler=self.run_scheduler,
        )

    async def stop(self) -> None:
        """End every process and remove the temporary directory (idempotent)."""
        await asyncio.to_thread(self.stop_sync)

    def stop_sync(self) -> None:
        """:meth:`stop` without an event loop (for atexit hooks and sync fixtures)."""
        reaper = self._reaper
        if reaper is None:
            return
        for name in reversed(list(self._components)):
            self._components[name].stop(reaper)
        self._components.clear()
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None
        reaper.close()
        self._reaper = None

    async def restart_apiserver(self) -> None:
        """Stop kube-apiserver (SIGTERM, as a rolling restart would) and start it again on
        the same port and etcd; returns once it is ready. Clients see connection errors and
        ended watches meanwhile; the data in etcd stays."""
        await self.stop_apiserver()
        await self.start_apiserver()

    async def stop_apiserver(self) -> None:
        """Stop kube-apiserver only (see :meth:`start_apiserver`)."""
        component, reaper = self._component("kube-apiserver")
        await asyncio.to_thread(component.stop, reaper)

    async def start_apiserver(self) -> None:
        """Start a stopped kube-apiserver again, with the same flags; waits until ready."""
        component, reaper = self._component("kube-apiserver")
        if component.running():
            raise RuntimeError("kube-apiserver is running; stop_apiserver() first")
        component.start(reaper)
        await self._wait_apiserver(component)

    async def compact_etcd(self) -> int:
        """Compact etcd's history up to its current revision, as kube-apiserver does every five
        minutes, so a watch or list from an older resourceVersion meets 410 Gone at once.
        Returns the revision compacted to. Uses etcd's JSON gateway (``/v3/kv/…``)."""
        if not self.etcd_url:
            raise ControlPlaneError("the control plane is not running")
        timeout = aiohttp.ClientTimeout(total=30)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            # A range over no keys still answers with the store's current revision.
            async with session.post(f"{self.etcd_url}/v3/kv/range", json={"key": "AA=="}) as r:
                r.raise_for_status()
                revision = int((await r.json())["header"]["revision"])
            body = {"revision": str(revision), "physical": True}
            async with session.post(f"{self.etcd_url}/v3/kv/compaction", json=body) as r:
                r.raise_for_status()
        return revision

    def _component(self, name: str) -> tuple[_Component, _Reaper]:
        if self._reaper is None or name not in self._components:
            raise RuntimeError("the control plane is not running")
        return self._components[name], self._reaper

    def pids(self) -> dict[str, int]:
        """The running components' process ids, by name (for fault-injection tests)."""
        return {n: c.pid for n, c in self._components.items() if c.pid is not None}

    # -- clients -------------------------------------------------------------------------------

    def configuration(self) -> Configuration:
        """A kubernetes-asyncio ``Configuration`` with admin credentials."""
        if self.directory is None:
            raise RuntimeError("the control plane is not running")
        configuration = Configuration(host=self.url)
        configuration.ssl_ca_cert = str(self.directory / "ca.crt")
        configuration.cert_file = str(self.directory / "admin.crt")
        configuration.key_file = str(self.directory / "admin.key")
        return configuration

    def issue_client_certificate(
        self, name: str, common_name: str, organization: str | None = None
    ) -> tuple[Path, Path]:
        """A client certificate of the cluster CA for ``common_name`` (in group
        ``organization``), written into the control plane's directory as ``NAME.crt`` and
        ``NAME.key``; returns both paths. A kubelet joins with ``system:node:NODE`` in
        ``system:nodes``."""
        if self.directory is None or self._ca is None:
            raise RuntimeError("the control plane is not running")
        # The file name doubles as the (unused) subject alternative name: a DNS name, which
        # the common name (``system:node:…``) is not.
        leaf = self._ca.issue_cert(name, common_name=common_name, organization_name=organization)
        cert, key = self.directory / f"{name}.crt", self.directory / f"{name}.key"
        _write_leaf(leaf, cert, key)
        return cert, key

    def api_client(self) -> ApiClient:
        """A new kubernetes-asyncio ``ApiClient`` with admin credentials (close it, or use
        ``async with``)."""
        return ApiClient(configuration=self.configuration())

    # -- internals -----------------------------------------------------------------------------

    def _write_certificates(self, directory: Path) -> None:
        import trustme
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa

        ca = trustme.CA(organization_name="pyprovlib test control plane")
        self._ca = ca
        (directory / "ca.crt").write_bytes(ca.cert_pem.bytes())
        (directory / "ca.key").write_bytes(ca.private_key_pem.bytes())
        serving = ca.issue_cert("127.0.0.1", "localhost", common_name="kube-apiserver")
        _write_leaf(serving, directory / "apiserver.crt", directory / "apiserver.key")
        admin = ca.issue_cert(
            "pyprovlib-admin", common_name="pyprovlib-admin", organization_name="system:masters"
        )
        _write_leaf(admin, directory / "admin.crt", directory / "admin.key")
        # What kube-apiserver shows a kubelet for logs, exec and port-forward (a kubelet
        # authenticates it against the cluster CA).
        kubelet_client = ca.issue_cert(
            "kube-apiserver-kubelet-client",
            common_name="kube-apiserver-kubelet-client",
            organization_name="system:masters",
        )
        _write_leaf(
            kubelet_client, directory / "kubelet-client.crt", directory / "kubelet-client.key"
        )
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        (directory / "sa.key").write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.TraditionalOpenSSL,
                serialization.NoEncryption(),
            )
        )
        (directory / "sa.pub").write_bytes(
            key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        context = ssl.create_default_context(cafile=str(directory / "ca.crt"))
        context.load_cert_chain(str(directory / "admin.crt"), str(directory / "admin.key"))
        self._ssl = context

    def _logs(self, directory: Path) -> Path:
        logs = self._log_dir or directory / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        return logs

    def _add(self, name: str, argv: list[str], directory: Path) -> _Component:
        assert self._reaper is not None
        component = _Component(name, argv, self._logs(directory) / f"{name}.log")
        self._components[name] = component
        component.start(self._reaper)
        return component

    async def _start_core(self, directory: Path) -> None:
        # Free ports are picked, then bound by another process: another control plane may take
        # one in between. A component that exits at once is retried on fresh ports.
        for attempt in range(3):
            try:
                await self._start_etcd_and_apiserver(directory)
                return
            except ControlPlaneError:
                if attempt == 2:
                    raise
                reaper = self._reaper
                assert reaper is not None
                for name in ("kube-apiserver", "etcd"):
                    component = self._components.pop(name, None)
                    if component is not None:
                        await asyncio.to_thread(component.stop, reaper)
                shutil.rmtree(directory / "etcd", ignore_errors=True)
                log.warning("control plane start failed; retrying on fresh ports", exc_info=True)

    async def _start_etcd_and_apiserver(self, directory: Path) -> None:
        client_port, peer_port, api_port = _free_port(), _free_port(), _free_port()
        etcd_url = f"http://127.0.0.1:{client_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        etcd = self._add(
            "etcd",
            [
                str(self.assets / "etcd"),
                "--name=default",
                f"--data-dir={directory / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=default={peer_url}",
                "--initial-cluster-state=new",
                "--logger=zap",
                "--log-level=warn",
            ],
            directory,
        )
        await self._wait_http(etcd, f"{etcd_url}/health", ssl_context=None)
        self.etcd_url = etcd_url
        self.url = f"https://127.0.0.1:{api_port}"
        d = directory
        apiserver = self._add(
            "kube-apiserver",
            [
                str(self.assets / "kube-apiserver"),
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={api_port}",
                f"--cert-dir={d}",
                f"--tls-cert-file={d / 'apiserver.crt'}",
                f"--tls-private-key-file={d / 'apiserver.key'}",
                f"--client-ca-file={d / 'ca.crt'}",
                f"--service-account-key-file={d / 'sa.pub'}",
                f"--service-account-signing-key-file={d / 'sa.key'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--authorization-mode=Node,RBAC",
                "--allow-privileged=true",
                "--endpoint-reconciler-type=none",
                # No kubelet runs the pods, and tests create namespaces and pods at once:
                # without this, a pod could race kube-controller-manager's creation of the
                # namespace's default ServiceAccount (as envtest does).
                "--disable-admission-plugins=ServiceAccount",
                # For a kubelet that joins (pyprovlib.testing._node): logs and exec go to it
                # with this client certificate, at its InternalIP (its host name need not
                # resolve).
                f"--kubelet-client-certificate={d / 'kubelet-client.crt'}",
                f"--kubelet-client-key={d / 'kubelet-client.key'}",
                "--kubelet-preferred-address-types=InternalIP,Hostname",
                *self.apiserver_args,
            ],
            directory,
        )
        await self._wait_apiserver(apiserver)
        kubeconfig = directory / "kubeconfig"
        kubeconfig.write_text(yaml.safe_dump(self._kubeconfig(directory)))
        self.kubeconfig_path = kubeconfig

    def _kubeconfig(self, d: Path) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "pyprovlib",
                    "cluster": {"server": self.url, "certificate-authority": str(d / "ca.crt")},
                }
            ],
            "users": [
                {
                    "name": "admin",
                    "user": {
                        "client-certificate": str(d / "admin.crt"),
                        "client-key": str(d / "admin.key"),
                    },
                }
            ],
            "contexts": [
                {"name": "pyprovlib", "context": {"cluster": "pyprovlib", "user": "admin"}}
            ],
            "current-context": "pyprovlib",
        }

    async def _start_controllers(self, directory: Path) -> None:
        assert self.kubeconfig_path is not None
        kubeconfig = str(self.kubeconfig_path)

        def argv(binary: str, cert_dir: str, *flags: str) -> list[str]:
            # What kube-controller-manager and kube-scheduler share: the admin kubeconfig for
            # the API and for delegated authn/authz, no leader election, and a loopback
            # secure port with its own self-signed certificate.
            return [
                str(self.assets / binary),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={_free_port()}",
                f"--cert-dir={directory / cert_dir}",
                *flags,
            ]

        if self.run_controller_manager:
            self._add(
                "kube-controller-manager",
                argv(
                    "kube-controller-manager",
                    "kcm",
                    # Without kubelet heartbeats the node lifecycle controller would mark every
                    # node NotReady and taint it.
                    "--controllers=*,-node-lifecycle-controller",
                    f"--service-account-private-key-file={directory / 'sa.key'}",
                    f"--root-ca-file={directory / 'ca.crt'}",
                    "--use-service-account-credentials=true",
                    *self.controller_manager_args,
                ),
                directory,
            )
        if self.run_scheduler:
            self._add("kube-scheduler", argv("kube-scheduler", "scheduler"), directory)
        stand_ins: list[str] = []
        if not self.run_controller_manager:
            stand_ins.append("--binder-only")
            if not self.run_scheduler:
                stand_ins.append("--scheduler")
        elif not self.run_scheduler:
            stand_ins.append("--scheduler-only")
        if stand_ins:
            component = self._add(
                "pyprovlib-controllers",
                [sys.executable, "-m", "pyprovlib.testing", *stand_ins, "--kubeconfig", kubeconfig],
                directory,
            )
            await self._wait_log_line(component, b"running against")

    async def _prepare_cluster(self) -> None:
        from pyprovlib.testing._binder import HttpTransport

        async with self.api_client() as api:
            http = HttpTransport(api)
            for i in range(1, self.node_count + 1):
                name = f"{NODE_NAME_PREFIX}{i}"
                await register_ready_node(http, name)
                self.node_names.append(name)
            if self.snapshot_crds:
                await self._install_crds(http)
            if self.run_controller_manager:
                # The service-account controller's first write: kube-controller-manager's
                # controllers have started.
                await self._wait_for(
                    lambda: _exists(http, "/api/v1/namespaces/default/serviceaccounts/default"),
                    "kube-controller-manager",
                )

    async def _install_crds(self, http: Any) -> None:
        names: list[str] = []
        for path in sorted(CRD_DIR.glob("*.yaml")):
            crd = yaml.safe_load(path.read_text())
            names.append(crd["metadata"]["name"])
            try:
                await http.json(
                    "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", body=crd
                )
            except ApiException as err:
                if err.status != 409:
                    raise
        for name in names:
            url = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
            await self._wait_for(lambda url=url: _established(http, url), f"CRD {name}")

    async def _wait_for(self, probe: Any, what: str) -> None:
        deadline = time.monotonic() + self.start_timeout
        while not await probe():
            for component in self._components.values():
                if not component.running():
                    raise component.failure(f"exited while waiting for {what}")
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"timed out after {self.start_timeout}s waiting for {what}")
            await asyncio.sleep(0.1)

    async def _wait_apiserver(self, component: _Component) -> None:
        await self._wait_http(component, f"{self.url}/readyz", ssl_context=self._ssl)

    async def _wait_http(
        self, component: _Component, url: str, ssl_context: ssl.SSLContext | None
    ) -> None:
        deadline = time.monotonic() + self.start_timeout
        timeout = aiohttp.ClientTimeout(total=5)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while True:
                if not component.running():
                    raise component.failure("exited before it was ready")
                with contextlib.suppress(aiohttp.ClientError, TimeoutError, OSError):
                    async with session.get(url, ssl=ssl_context or False) as resp:
                        if resp.status == 200:
                            return
                if time.monotonic() > deadline:
                    raise component.failure(f"not ready after {self.start_timeout}s")
                await asyncio.sleep(0.1)

    async def _wait_log_line(self, component: _Component, marker: bytes) -> None:
        deadline = time.monotonic() + self.start_timeout
        while True:
            if not component.running():
                raise component.failure("exited before it was ready")
            with contextlib.suppress(OSError):
                if marker in component.log_path.read_bytes():
                    return
            if time.monotonic() > deadline:
                raise component.failure(f"not ready after {self.start_timeout}s")
            await asyncio.sleep(0.1)


def _write_leaf(leaf: Any, cert: Path, key: Path) -> None:
    cert.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
    key.write_bytes(leaf.private_key_pem.bytes())


# -- one control plane per process (the pytest session's) ----------------------------------------


class _Shared:
    plane: ControlPlane | None = None
    error: BaseException | None = None


async def shared_control_plane(assets: str | os.PathLike[str] | None = None) -> ControlPlane:
    """The process's shared control plane, launched on first use from ``assets`` (default:
    :func:`assets_from_environment`) and stopped by :func:`stop_shared_control_plane` or at
    interpreter exit. The pytest plugin's ``kube_cluster`` fixture uses it. If the launch
    failed, later calls raise the same error at once rather than trying again per test."""
    if _Shared.error is not None:
        raise ControlPlaneError(f"the shared control plane did not start: {_Shared.error}")
    if _Shared.plane is not None and _Shared.plane.running:
        return _Shared.plane
    where = assets if assets is not None else assets_from_environment()
    if where is None:
        raise ControlPlaneError(f"set {ENV_KUBE_ASSETS} to an assets directory")
    plane = ControlPlane(where, log_dir=os.environ.get(ENV_KUBE_LOG_DIR) or None)
    _Shared.plane = plane
    atexit.register(plane.stop_sync)
    try:
        await plane.launch()
    except Exception as err:
        _Shared.error = err
        raise
    return plane


def stop_shared_control_plane() -> None:
    """Stop the shared control plane, if one was launched."""
    plane, _Shared.plane = _Shared.plane, None
    if plane is not None:
        plane.stop_sync()

"""A real node for a test control plane: containerd and a kubelet joined to a
:class:`~pyprovlib.testing.ControlPlane`, so pods really run and mount volumes.

::

    async with ControlPlane.start(assets, nodes=0) as plane:
        async with KubeletNode.start(plane) as node:
            ...  # pods scheduled to node.name run; node.add_process() starts CSI node plugins

Everything is private to the node and cleaned up on stop, and by the reaper when the test
process dies (SIGKILL included): containerd runs with its own config, root, state and socket
(so it can coexist with the host's), pods get a bridge of their own (no masquerading, no
iptables rules), images are built from files on the machine (:mod:`._node_images`) and imported
without a registry. What the node writes outside its directory (the kubelet's root
``/var/lib/kubelet``, which CSI drivers expect, the network namespaces, cgroups) is listed in a
manifest first and removed by :mod:`._node_cleanup`.

It needs root, Linux, the ``kubelet`` binary in the assets directory and Debian's
``containerd runc containernetworking-plugins iptables iproute2 busybox-static``;
:func:`node_unavailable` says in one line what is missing, for a test's skip. Tested facts
about these machines (no systemd, cgroup v1, no CAP_SYS_RESOURCE) are in docs/testing.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio.client.exceptions import ApiException

from pyprovlib._logging import get_logger
from pyprovlib.testing._components import (
    ControlPlaneError,
    _Component,
    _free_port,
    _launched,
    _Reaper,
)
from pyprovlib.testing._controlplane import ControlPlane
from pyprovlib.testing._node_cleanup import NETNS_DIR, NodeManifest, clean, leftovers
from pyprovlib.testing._node_images import node_images, write_images

__all__ = ["KUBELET_ROOT", "KubeletNode", "NodeUnavailableError", "node_unavailable"]

log = get_logger(__name__)

KUBELET_ROOT = Path("/var/lib/kubelet")
"""The kubelet's root: CSI drivers and node-driver-registrar expect the default."""
CNI_BIN_DIR = Path("/usr/lib/cni")  # Debian's containernetworking-plugins
PACKAGES = "containerd runc containernetworking-plugins iptables iproute2 busybox-static"
_TOOLS = ("containerd", "containerd-shim-runc-v2", "runc", "ctr", "ip", "mount", "umount")
_CNI_PLUGINS = ("bridge", "host-local", "loopback")
# System paths the kubelet or containerd create when absent; removed after the node if so.
_SYSTEM_PATHS = (
    str(KUBELET_ROOT),
    "/var/log/containers",
    "/var/log/pods",
    "/var/lib/cni",
    "/run/containerd",
    str(NETNS_DIR),
)


class NodeUnavailableError(ControlPlaneError):
    """A real node cannot run on this machine (the message says why in one line)."""


def _busybox() -> Path | None:
    for candidate in ("/bin/busybox", "/usr/bin/busybox"):
        if os.access(candidate, os.X_OK):
            return Path(candidate)
    return None


def _running_kubelets() -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if Path(f"/proc/{entry}/comm").read_text().strip() == "kubelet":
                    found.append(int(entry))
    return found


def node_unavailable(assets: str | os.PathLike[str]) -> str | None:
    """Why a :class:`KubeletNode` cannot run here, in one line; None when it can."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return "a real node needs Linux on x86-64"
    if os.geteuid() != 0:
        return "a real node needs root (containerd, mounts, network namespaces)"
    if not os.access(Path(assets) / "kubelet", os.X_OK):
        return f"no kubelet in the assets directory {assets}"
    missing = [tool for tool in _TOOLS if shutil.which(tool) is None]
    missing += [f"{CNI_BIN_DIR}/{p}" for p in _CNI_PLUGINS if not (CNI_BIN_DIR / p).exists()]
    if _busybox() is None:
        missing.append("busybox")
    if missing:
        return f"missing {', '.join(missing)} (apt-get install {PACKAGES})"
    if _running_kubelets():
        return "another kubelet runs on this machine (one kubelet per host: /var/lib/kubelet)"
    if KUBELET_ROOT.exists() and any(KUBELET_ROOT.iterdir()):
        return f"{KUBELET_ROOT} is not empty (another kubelet's, or a previous run's: remove it)"
    return None


def _tool(name: str) -> str:
    """The absolute path of a system tool :func:`node_unavailable` found."""
    path = shutil.which(name)
    if path is None:
        raise NodeUnavailableError(f"{name} not found (apt-get install {PACKAGES})")
    return path


def _free_loopback_address() -> str:
    taken = subprocess.run(  # noqa: S603 - argv list
        [_tool("ip"), "-o", "addr", "show"], check=True, capture_output=True, text=True
    ).stdout
    for last in range(1, 255):
        address = f"172.30.255.{last}"
        if f" {address}/" not in taken:
            return address
    raise NodeUnavailableError("no free address in 172.30.255.0/24 for the node IP")


class KubeletNode:
    """containerd + kubelet joined to ``plane`` as node ``name``, Ready and schedulable.

    - ``name``: the node's name (default ``pyprovlib-kubelet``).
    - ``node_ip``: its InternalIP; default: a free address of 172.30.255.0/24 added to
      ``lo`` for the node's life (a kubelet refuses a loopback node IP, and this keeps the
      node off the host's real interfaces).
    - ``log_dir``: keep the logs of containerd, the kubelet and :meth:`add_process`'s
      processes there (default: the node's directory, removed on stop).
    - ``start_timeout``: seconds until the node must be Ready (default 180).
    - ``kubelet_config``: extra KubeletConfiguration fields, merged over the defaults.

    After :meth:`launch`: :attr:`name`, :attr:`node_ip`, :attr:`directory`,
    :attr:`containerd_address`. :meth:`stop` deletes the pods left on the node (so their
    volumes are unmounted by the kubelet and their drivers), stops every process and removes
    everything the node made; :meth:`leftovers` lists what is still there.
    """

    def __init__(
        self,
        plane: ControlPlane,
        *,
        name: str = "pyprovlib-kubelet",
        node_ip: str | None = None,
        log_dir: str | os.PathLike[str] | None = None,
        start_timeout: float = 180.0,
        kubelet_config: dict[str, Any] | None = None,
    ) -> None:
        why = node_unavailable(plane.assets)
        if why is not None:
            raise NodeUnavailableError(why)
        self.plane = plane
        self.name = name
        self.node_ip = node_ip or ""
        self.start_timeout = start_timeout
        self.kubelet_config = dict(kubelet_config or {})
        self._log_dir = Path(log_dir) if log_dir is not None else None
        self.directory: Path | None = None
        self.containerd_address = ""
        self.manifest: NodeManifest | None = None
        self._components: dict[str, _Component] = {}
        self._reaper: _Reaper | None = None

    # -- lifecycle -----------------------------------------------------------------------------

    @classmethod
    @contextlib.asynccontextmanager
    async def start(cls, plane: ControlPlane, **options: Any) -> AsyncIterator[KubeletNode]:
        """``async with KubeletNode.start(plane) as node:`` — launched on entry, stopped on
        exit."""
        async with _launched(cls(plane, **options)) as node:
            yield node

    async def launch(self) -> None:
        """Start containerd and the kubelet; returns once the node is Ready."""
        if self.directory is not None:
            raise RuntimeError("this KubeletNode is already running")
        if self.plane.kubeconfig_path is None:
            raise RuntimeError("the control plane is not running")
        directory = Path(tempfile.mkdtemp(prefix="pyprovlib-node-"))
        self.directory = directory
        try:
            await asyncio.to_thread(self._prepare_host, directory)
            await self._start_containerd(directory)
            await self._import_images(directory)
            self._start_kubelet(directory)
            await self._wait_ready()
        except BaseException:
            await asyncio.to_thread(self.stop_sync)
            raise
        log.info("node ready", node=self.name, ip=self.node_ip, directory=str(directory))

    async def stop(self) -> None:
        """Delete the node's pods, stop every process, undo every change to the host
        (idempotent)."""
        if self.directory is None:
            return
        with contextlib.suppress(Exception):
            await self.drain(timeout=60.0)
        await asyncio.to_thread(self.stop_sync)

    def stop_sync(self) -> None:
        """Stop without draining (for atexit hooks): processes, then the host changes."""
        reaper = self._reaper
        for name in reversed(list(self._components)):
            if reaper is not None:
                self._components[name].stop(reaper)
        self._components.clear()
        if self.manifest is not None:
            left = clean(self.manifest)
            if left:
                log.warning("node left things behind", node=self.name, left=left)
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None
        if reaper is not None:
            reaper.close()
            self._reaper = None

    def leftovers(self) -> list[str]:
        """What of the node is still on the host (processes, mounts, network namespaces,
        links, cgroups, paths); meaningful after :meth:`stop`."""
        return [] if self.manifest is None else leftovers(self.manifest)

    async def drain(self, timeout: float = 60.0) -> None:  # noqa: ASYNC109
        """Delete every pod bound to the node and wait until they are gone (their volumes
        unmounted and detached by the kubelet and the CSI drivers still running)."""
        async with self.plane.api_client() as api:
            from pyprovlib.testing._binder import HttpTransport

            http = HttpTransport(api)
            selector = f"spec.nodeName={self.name}"
            pods = await http.json("GET", "/api/v1/pods", query={"fieldSelector": selector})
            for pod in pods.get("items") or []:
                meta = pod["metadata"]
                with contextlib.suppress(ApiException):
                    await http.json(
                        "DELETE",
                        f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                        body={"gracePeriodSeconds": 0},
                    )
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                pods = await http.json("GET", "/api/v1/pods", query={"fieldSelector": selector})
                if not pods.get("items"):
                    return
                await asyncio.sleep(0.5)

    def add_process(self, name: str, argv: Sequence[str]) -> _Component:
        """Start a process that belongs to the node (a CSI node plugin, its registrar),
        logged beside the node's and stopped before the kubelet."""
        if self._reaper is None or self.directory is None:
            raise RuntimeError("the node is not running")
        if name in self._components:
            raise ValueError(f"a process named {name!r} already runs on the node")
        component = _Component(name, list(argv), self._logs() / f"{name}.log")
        self._components[name] = component
        component.start(self._reaper)
        return component

    def csi_socket(self, driver: str) -> Path:
        """Where a CSI node plugin for ``driver`` listens: the kubelet's plugins
        directory, as node-driver-registrar's deployments put it."""
        return KUBELET_ROOT / "plugins" / driver / "csi.sock"

    async def register_csi_plugin(
        self,
        driver: str,
        argv: Sequence[str],
        *,
        timeout: float = 60.0,  # noqa: ASYNC109
    ) -> Path:
        """Start a CSI node plugin (``argv``, serving :meth:`csi_socket`) and
        node-driver-registrar (``csi-node-driver-registrar`` from the assets directory) for
        it; returns once the kubelet lists ``driver`` in the node's CSINode. Both are named
        ``<driver>`` and ``<driver>-registrar`` for :meth:`stop_process`."""
        socket = self.csi_socket(driver)
        socket.parent.mkdir(parents=True, exist_ok=True)
        plugin = self.add_process(driver, argv)
        deadline = time.monotonic() + timeout
        while not socket.exists():
            if not plugin.running():
                raise plugin.failure("exited before it listened")
            if time.monotonic() > deadline:
                raise plugin.failure(f"did not listen on {socket} in {timeout}s")
            await asyncio.sleep(0.1)
        registrar = self.add_process(
            f"{driver}-registrar",
            [
                str(self.plane.assets / "csi-node-driver-registrar"),
                f"--csi-address={socket}",
                f"--kubelet-registration-path={socket}",
                f"--plugin-registration-path={KUBELET_ROOT / 'plugins_registry'}",
            ],
        )
        await self.wait_csi_driver(driver, present=True, timeout=timeout, process=registrar)
        return socket

    async def wait_csi_driver(
        self,
        driver: str,
        *,
        present: bool,
        timeout: float = 60.0,  # noqa: ASYNC109
        process: _Component | None = None,
    ) -> None:
        """Wait until the node's CSINode lists ``driver`` (``present``) or no longer does."""
        from pyprovlib.testing._binder import HttpTransport

        deadline = time.monotonic() + timeout
        async with self.plane.api_client() as api:
            http = HttpTransport(api)
            while True:
                drivers: list[str] = []
                with contextlib.suppress(ApiException):
                    csinode = await http.json(
                        "GET", f"/apis/storage.k8s.io/v1/csinodes/{self.name}"
                    )
                    drivers = [d["name"] for d in (csinode.get("spec") or {}).get("drivers") or []]
                if (driver in drivers) == present:
                    return
                if process is not None and not process.running():
                    raise process.failure("exited before the kubelet registered the driver")
                if time.monotonic() > deadline:
                    state = "registered" if present else "unregistered"
                    raise ControlPlaneError(
                        f"CSI driver {driver} not {state} on {self.name} in {timeout}s"
                    )
                await asyncio.sleep(0.2)

    def pids(self) -> dict[str, int]:
        """The running processes of the node (containerd, kubelet, :meth:`add_process`'s)
        by name, for fault injection and CPU accounting."""
        return {n: c.pid for n, c in self._components.items() if c.pid is not None}

    def kill_process(self, name: str) -> None:
        """SIGKILL a process started by :meth:`add_process` (and its group), as a crash
        would end it."""
        component = self._components.pop(name)
        assert self._reaper is not None
        component.kill(self._reaper)

    def stop_process(self, name: str) -> None:
        """Stop (SIGTERM, then SIGKILL) a process started by :meth:`add_process`."""
        component = self._components.pop(name)
        assert self._reaper is not None
        component.stop(self._reaper)

    # -- internals -----------------------------------------------------------------------------

    def _logs(self) -> Path:
        assert self.directory is not None
        logs = self._log_dir or self.directory / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        return logs

    def _prepare_host(self, directory: Path) -> None:
        """Write the manifest (before anything is changed), then the host changes."""
        # Containers running as other users read image layers and volumes under it.
        os.chmod(directory, 0o755)  # noqa: S103
        suffix = secrets.token_hex(3)
        added_ip = ""
        if not self.node_ip:
            self.node_ip = added_ip = _free_loopback_address()
        self.containerd_address = str(directory / "containerd.sock")
        manifest = NodeManifest(
            directory=str(directory),
            cgroup_root=f"/pyprovlib-node-{suffix}",
            containerd_address=self.containerd_address,
            bridge=f"pyprov{suffix}",
            loopback_address=added_ip,
            kubelet_root=str(KUBELET_ROOT),
            netns_before=sorted(os.listdir(NETNS_DIR)) if NETNS_DIR.is_dir() else [],
            created_paths=[p for p in _SYSTEM_PATHS if not os.path.lexists(p)],
        )
        manifest.save()
        self.manifest = manifest
        self._reaper = _Reaper(directory)
        self._reaper.node()
        if added_ip:
            subprocess.run(  # noqa: S603 - argv list
                [_tool("ip"), "addr", "add", f"{added_ip}/32", "dev", "lo"], check=True
            )
        # The kubelet requires its cgroup root to exist in every hierarchy.
        for hierarchy in Path("/sys/fs/cgroup").iterdir():
            if hierarchy.is_dir() and not hierarchy.is_symlink():
                with contextlib.suppress(OSError):
                    (hierarchy / manifest.cgroup_root.strip("/")).mkdir(exist_ok=True)

    async def _start_containerd(self, directory: Path) -> None:
        assert self.manifest is not None
        cni_conf = directory / "cni"
        cni_conf.mkdir()
        (cni_conf / "10-pyprovlib.conflist").write_text(
            json.dumps(
                {
                    "cniVersion": "1.0.0",
                    "name": "pyprovlib",
                    "plugins": [
                        {
                            "type": "bridge",
                            "bridge": self.manifest.bridge,
                            # No gateway, no masquerading: pods need no traffic off the node,
                            # and the host's routes and iptables stay untouched.
                            "isGateway": False,
                            "ipMasq": False,
                            "ipam": {
                                "type": "host-local",
                                "ranges": [[{"subnet": "10.254.0.0/16"}]],
                                "dataDir": str(directory / "ipam"),
                            },
                        }
                    ],
                },
                indent=1,
            )
        )
        from pyprovlib.testing._node_images import PAUSE_IMAGE

        cri = 'plugins."io.containerd.grpc.v1.cri"'
        config = f"""version = 2
root = "{directory / "containerd" / "root"}"
state = "{directory / "containerd" / "state"}"
oom_score = 0
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{self.containerd_address}"

[ttrpc]
  address = "{directory / "containerd-ttrpc.sock"}"

[debug]
  address = ""

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "{directory / "containerd" / "opt"}"

[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  # Pods' network namespaces under the state directory, not the host's /run/netns.
  netns_mounts_under_state_dir = true
  enable_selinux = false
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{directory / "runc"}"
  [{cri}.cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{cni_conf}"
"""
        config_path = directory / "containerd.toml"
        config_path.write_text(config)
        component = _Component(
            "containerd",
            [_tool("containerd"), "--config", str(config_path)],
            self._logs() / "containerd.log",
        )
        self._components["containerd"] = component
        assert self._reaper is not None
        component.start(self._reaper)
        deadline = time.monotonic() + self.start_timeout
        while not await self._ctr_ok():
            if not component.running():
                raise component.failure("exited before it was ready")
            if time.monotonic() > deadline:
                raise component.failure(f"not ready after {self.start_timeout}s")
            await asyncio.sleep(0.2)

    async def _ctr(self, *args: str) -> tuple[int, str]:
        process = await asyncio.create_subprocess_exec(
            _tool("ctr"),
            "--address",
            self.containerd_address,
            "--namespace",
            "k8s.io",
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await process.communicate()
        return process.returncode or 0, out.decode(errors="replace")

    async def _ctr_ok(self) -> bool:
        code, _ = await self._ctr("version")
        return code == 0

    async def _import_images(self, directory: Path) -> None:
        busybox = _busybox()
        assert busybox is not None
        agnhost = self.plane.assets / "agnhost"
        specs = node_images(busybox, agnhost if os.access(agnhost, os.X_OK) else None)
        tarballs = await asyncio.to_thread(write_images, specs, directory / "images")
        for tarball in tarballs:
            code, out = await self._ctr("images", "import", str(tarball))
            if code != 0:
                raise ControlPlaneError(f"ctr images import {tarball.name} failed: {out.strip()}")
            tarball.unlink()

    def _start_kubelet(self, directory: Path) -> None:
        assert self.manifest is not None
        assert self.plane.directory is not None
        plane_dir = self.plane.directory
        cert, key = self.plane.issue_client_certificate(
            f"kubelet-{self.name}", f"system:node:{self.name}", "system:nodes"
        )
        kubeconfig = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "local",
                    "cluster": {
                        "server": self.plane.url,
                        "certificate-authority": str(plane_dir / "ca.crt"),
                    },
                }
            ],
            "users": [
                {
                    "name": "kubelet",
                    "user": {"client-certificate": str(cert), "client-key": str(key)},
                }
            ],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": "kubelet"}}],
            "current-context": "local",
        }
        kubeconfig_path = directory / "kubelet.kubeconfig"
        kubeconfig_path.write_text(yaml.safe_dump(kubeconfig))
        config: dict[str, Any] = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "cgroupsPerQOS": True,
            "cgroupRoot": self.manifest.cgroup_root,
            "enforceNodeAllocatable": ["pods"],
            "failSwapOn": False,
            # No CAP_SYS_RESOURCE on these machines: nothing may lower oom_score_adj.
            "oomScoreAdj": 0,
            "authentication": {
                "x509": {"clientCAFile": str(plane_dir / "ca.crt")},
                "anonymous": {"enabled": False},
                "webhook": {"enabled": False},
            },
            "authorization": {"mode": "AlwaysAllow"},
            "port": _free_port(),
            "readOnlyPort": 0,
            "healthzPort": 0,
            "resolvConf": "/etc/resolv.conf",
            "containerRuntimeEndpoint": f"unix://{self.containerd_address}",
            "rotateCertificates": False,
            "registerNode": True,
            # Images cannot be pulled again: never collect them; never evict for disk.
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {
                "memory.available": "1Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            "podLogsDir": str(directory / "pod-logs"),
            "volumePluginDir": str(directory / "volume-plugins"),
            "serializeImagePulls": False,
            # No KUBE-FIREWALL chain in the host's iptables (nothing here needs it).
            "makeIPTablesUtilChains": False,
            "syncFrequency": "10s",
            "fileCheckFrequency": "10s",
            "nodeStatusUpdateFrequency": "10s",
        }
        config.update(self.kubelet_config)
        config_path = directory / "kubelet.yaml"
        config_path.write_text(yaml.safe_dump(config))
        argv = [
            str(self.plane.assets / "kubelet"),
            f"--config={config_path}",
            f"--kubeconfig={kubeconfig_path}",
            f"--hostname-override={self.name}",
            f"--node-ip={self.node_ip}",
            f"--root-dir={KUBELET_ROOT}",
            f"--cert-dir={directory / 'kubelet-pki'}",
            "--v=2",
        ]
        component = _Component("kubelet", argv, self._logs() / "kubelet.log")
        self._components["kubelet"] = component
        assert self._reaper is not None
        component.start(self._reaper)

    async def _wait_ready(self) -> None:
        from pyprovlib.testing._binder import HttpTransport

        kubelet = self._components["kubelet"]
        deadline = time.monotonic() + self.start_timeout
        async with self.plane.api_client() as api:
            http = HttpTransport(api)
            path = f"/api/v1/nodes/{self.name}"
            while True:
                if not kubelet.running():
                    raise kubelet.failure("exited before the node was Ready")
                node = None
                with contextlib.suppress(ApiException):
                    node = await http.json("GET", path)
                if node is not None and _ready(node):
                    break
                if time.monotonic() > deadline:
                    raise kubelet.failure(f"node {self.name} not Ready after {self.start_timeout}s")
                await asyncio.sleep(0.5)
            # kube-controller-manager's node lifecycle controller (off in a test control
            # plane) would lift the taint the apiserver puts on a new node once it is Ready.
            taints = [
                t
                for t in (node.get("spec") or {}).get("taints") or []
                if not t.get("key", "").startswith("node.kubernetes.io/not-ready")
            ]
            await http.json(
                "PATCH",
                path,
                body={"spec": {"taints": taints or None}},
                content_type="application/merge-patch+json",
            )


def _ready(node: dict[str, Any]) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

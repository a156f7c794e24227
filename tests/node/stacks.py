"""CSI stacks on a real node: a driver's node plugin registered with the kubelet, and a
controller side — the Go sidecars (external-provisioner, -attacher, -resizer, -snapshotter) or
``python -m pyprovlib.csi`` — all processes of the :class:`~pyprovlib.testing._node.KubeletNode`,
so they are stopped with it and reaped if the test process dies.

Three stacks, as issue 27 compares them; each has a driver name of its own, so they can run
side by side on one node without acting on each other's claims and VolumeAttachments:

- ``go``: the Go hostpath driver with the Go sidecars;
- ``pyprovlib``: the same Go driver with ``python -m pyprovlib.csi`` in place of the
  provisioner, attacher and resizer sidecars;
- ``example``: pyprovlib's example driver (``python -m pyprovlib.examples.csi_hostpath``)
  with ``python -m pyprovlib.csi``.

pyprovlib has no snapshotter: every stack runs the Go csi-snapshotter beside its controllers
(the cluster's one snapshot-controller is :func:`start_snapshot_controller`), so the snapshot
tests exercise pyprovlib's restore-from-snapshot provisioning.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from pyprovlib.testing._binder import HttpTransport
from pyprovlib.testing._node import KubeletNode

GO_TOPOLOGY_KEY = "topology.hostpath.csi/node"
MAX_VOLUMES_PER_NODE = 24
"""The node plugins' attach limit (NodeGetInfo) in the conformance runs: the e2e suite's
volume-limit tests need one, and it is above what one stack's tests use at once."""
EXAMPLE_TOPOLOGY_KEY = "topology.hostpath.csi/node"
MUTABLE_PARAMETER = "e2eVacTest"
"""The one mutable parameter (VolumeAttributesClass key) the node plugins accept, as Kubernetes'
own e2e deployment of the Go hostpath driver configures it: the driver definitions'
VolumeAttributesClasses (``conformance/vac-*.yaml``) set it, and the suite's "invalid" class
(``xxInvalidParameterKey``) must be refused, so every other key is."""


@dataclass(frozen=True)
class Stack:
    """One CSI stack: ``key`` names it, ``driver`` is its CSI driver name, ``plugin`` which
    node plugin serves it (``go`` or ``example``), ``controllers`` which controller side
    (``go`` sidecars or ``pyprovlib``)."""

    key: str
    driver: str
    plugin: str
    controllers: str
    title: str

    @property
    def topology_key(self) -> str:
        return GO_TOPOLOGY_KEY if self.plugin == "go" else EXAMPLE_TOPOLOGY_KEY


GO = Stack("go", "hostpath.csi.k8s.io", "go", "go", "Go sidecars + Go hostpath driver")
PYPROVLIB = Stack(
    "pyprovlib",
    "hostpath-py.csi.k8s.io",
    "go",
    "pyprovlib",
    "python -m pyprovlib.csi + Go hostpath driver",
)
EXAMPLE = Stack(
    "example",
    "hostpath.pyprovlib.io",
    "example",
    "pyprovlib",
    "python -m pyprovlib.csi + pyprovlib's example driver",
)
STACKS = {stack.key: stack for stack in (GO, PYPROVLIB, EXAMPLE)}


def _assets(node: KubeletNode, binary: str) -> str:
    return str(node.plane.assets / binary)


def plugin_argv(
    node: KubeletNode, stack: Stack, state_dir: Path, *, max_volumes: int = 0
) -> list[str]:
    """The node plugin's command line: serving the kubelet's socket for the stack's driver,
    with attach required (ControllerPublish/Unpublish) and ControllerModifyVolume for
    :data:`MUTABLE_PARAMETER`, keeping its state in ``state_dir``, reporting ``max_volumes``
    as its attach limit (0: none)."""
    # The same flags for both plugins: the Python driver takes the Go driver's names.
    flags = [
        f"--endpoint=unix://{node.csi_socket(stack.driver)}",
        f"--nodeid={node.name}",
        f"--drivername={stack.driver}",
        f"--statedir={state_dir}",
        "--enable-attach=true",
        f"--maxvolumespernode={max_volumes}",
        # ControllerModifyVolume (VolumeAttributesClass), off by default in the Go driver.
        "--enable-controller-modify-volume=true",
        f"--accepted-mutable-parameter-names={MUTABLE_PARAMETER}",
    ]
    if stack.plugin == "go":
        return [_assets(node, "hostpathplugin"), *flags, "--v=3"]
    return [
        sys.executable,
        "-m",
        "pyprovlib.examples.csi_hostpath",
        *flags,
        "--mount=bind",
        "--log-format=console",
    ]


def controller_argvs(
    node: KubeletNode, stack: Stack, *, snapshotter: bool = True
) -> dict[str, list[str]]:
    """The controller side's processes, by name (the Go csi-snapshotter too, unless
    ``snapshotter`` is false)."""
    assert node.plane.kubeconfig_path is not None
    kubeconfig = str(node.plane.kubeconfig_path)
    socket = str(node.csi_socket(stack.driver))
    common = [f"--csi-address={socket}", f"--kubeconfig={kubeconfig}", "--v=3"]
    processes: dict[str, list[str]] = {}
    if snapshotter:
        processes[f"{stack.key}-snapshotter"] = [
            _assets(node, "csi-snapshotter"),
            *common,
            "--feature-gates=CSIVolumeGroupSnapshot=false",
        ]
    if stack.controllers == "go":
        # csi-resizer runs its modify controller (VolumeAttributesClass, GA) whenever the
        # driver has MODIFY_VOLUME; python -m pyprovlib.csi likewise, with no flag either.
        for sidecar in ("csi-provisioner", "csi-attacher", "csi-resizer"):
            processes[f"{stack.key}-{sidecar}"] = [_assets(node, sidecar), *common]
    else:
        processes[f"{stack.key}-pyprovlib-csi"] = [
            sys.executable,
            "-m",
            "pyprovlib.csi",
            f"--csi-address={socket}",
            f"--kubeconfig={kubeconfig}",
            "--log-format=console",
        ]
    return processes


def csidriver(stack: Stack) -> dict[str, Any]:
    """The CSIDriver object, as csi-driver-host-path deploys it (attach required, pod info
    on mount, persistent and ephemeral volumes, fsGroup applied by the kubelet)."""
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "CSIDriver",
        "metadata": {"name": stack.driver},
        "spec": {
            "attachRequired": True,
            "podInfoOnMount": True,
            "volumeLifecycleModes": ["Persistent", "Ephemeral"],
            "fsGroupPolicy": "File",
        },
    }


async def ensure_object(http: HttpTransport, path: str, body: dict[str, Any]) -> None:
    """Create ``body`` at collection ``path`` unless it exists."""
    try:
        await http.json("POST", path, body=body)
    except ApiException as err:
        if err.status != 409:
            raise


async def start_stack(
    node: KubeletNode, stack: Stack, *, snapshotter: bool = True, max_volumes: int = 0
) -> None:
    """Register the stack's node plugin (``max_volumes``: its attach limit), create its
    CSIDriver, start its controllers."""
    assert node.directory is not None
    state_dir = node.directory / "csi-state" / stack.driver
    state_dir.mkdir(parents=True, exist_ok=True)
    await node.register_csi_plugin(
        stack.driver, plugin_argv(node, stack, state_dir, max_volumes=max_volumes)
    )
    async with node.plane.api_client() as api:
        await ensure_object(
            HttpTransport(api), "/apis/storage.k8s.io/v1/csidrivers", csidriver(stack)
        )
    for name, argv in controller_argvs(node, stack, snapshotter=snapshotter).items():
        node.add_process(name, argv)


async def stop_stack(node: KubeletNode, stack: Stack, *, snapshotter: bool = True) -> None:
    """Stop the stack's controllers and node plugin (the plugin's volumes must be gone)."""
    for name in controller_argvs(node, stack, snapshotter=snapshotter):
        node.stop_process(name)
    node.stop_process(f"{stack.driver}-registrar")
    node.stop_process(stack.driver)
    async with node.plane.api_client() as api:
        try:
            await HttpTransport(api).json(
                "DELETE", f"/apis/storage.k8s.io/v1/csidrivers/{stack.driver}"
            )
        except ApiException as err:
            if err.status != 404:
                raise


def start_snapshot_controller(node: KubeletNode) -> None:
    """The cluster's common snapshot controller (Go external-snapshotter), as a node
    process. Group snapshots are off: their CRDs are not installed."""
    assert node.plane.kubeconfig_path is not None
    node.add_process(
        "snapshot-controller",
        [
            _assets(node, "snapshot-controller"),
            f"--kubeconfig={node.plane.kubeconfig_path}",
            "--leader-election=false",
            "--feature-gates=CSIVolumeGroupSnapshot=false",
            "--v=3",
        ],
    )

"""The hostpath provisioner: local PersistentVolumes backed by a directory on the selected node
(OpenEBS local-hostpath style).

Each volume is the directory ``<basePath>/<pv name>`` on the node the scheduler picked for the
claim (WaitForFirstConsumer), exposed as a ``local`` PV pinned to that node. How the directory
is made is pluggable (:class:`VolumeDirectories`): :class:`LocalDirectories` when the
provisioner runs on the node itself (DaemonSet, ``--mode=node``), or
:class:`~pyprovlib.examples.hostpath._helper_pod.HelperPodDirectories` when one provisioner
launches a short-lived pod on the node (``--mode=helper-pod``).
"""

from __future__ import annotations

import asyncio
import posixpath
from dataclasses import dataclass, field
from typing import Protocol

from kubernetes_asyncio.client import (
    ApiClient,
    CoreV1Api,
    StorageV1Api,
    V1LocalVolumeSource,
    V1NodeSelector,
    V1NodeSelectorRequirement,
    V1NodeSelectorTerm,
    V1ObjectMeta,
    V1PersistentVolume,
    V1PersistentVolumeClaim,
    V1PersistentVolumeSpec,
    V1StorageClass,
    V1Taint,
    V1VolumeNodeAffinity,
)
from kubernetes_asyncio.client.exceptions import ApiException

from pyprovlib._logging import get_logger
from pyprovlib._provisioner import (
    IgnoredError,
    Provisioner,
    ProvisioningError,
    ProvisioningState,
    ProvisionOptions,
    Qualifier,
)
from pyprovlib.examples._paths import (
    UnsafePathError,
    archive_beneath,
    make_directory_beneath,
    remove_beneath,
    validate_base_path,
    validate_component,
)
from pyprovlib.examples._storage_class import class_parameters, read_class_of_volume
from pyprovlib.kube._errors import is_not_found

__all__ = [
    "ANNOTATION_NODE",
    "ANNOTATION_ON_DELETE",
    "ANNOTATION_SELECTED_NODE",
    "DEFAULT_BASE_PATH",
    "DEFAULT_DIR_MODE",
    "DEFAULT_PROVISIONER_NAME",
    "HOSTNAME_LABEL",
    "HostPathParameters",
    "HostPathProvisioner",
    "LocalDirectories",
    "NodeHostPathProvisioner",
    "NodeInfo",
    "VolumeDirectories",
    "archived_name",
    "parse_parameters",
]

DEFAULT_PROVISIONER_NAME = "pyprovlib.io/hostpath"
"""The provisioner name StorageClasses name in ``provisioner:`` unless ``--provisioner-name``
says otherwise."""

DEFAULT_BASE_PATH = "/var/pyprovlib/local"
"""The ``basePath`` used when a StorageClass does not set one."""

DEFAULT_DIR_MODE = 0o777
"""Permissions of a new volume directory (pods run as arbitrary users must be able to write)."""

HOSTNAME_LABEL = "kubernetes.io/hostname"
"""The node label a local PV's node affinity matches on."""

ANNOTATION_SELECTED_NODE = "volume.kubernetes.io/selected-node"
"""Set on a claim by the scheduler for WaitForFirstConsumer classes."""

ANNOTATION_NODE = "pyprovlib.io/hostpath-node"
"""Records on the PV the name of the node holding its directory (the hostname label in the
node affinity may differ from the node name)."""

ANNOTATION_ON_DELETE = "pyprovlib.io/hostpath-on-delete"
"""Records on the PV the class's ``onDelete`` policy at provisioning time, so deleting does not
depend on the StorageClass still existing."""

PARAM_BASE_PATH = "basePath"
PARAM_ON_DELETE = "onDelete"
_KNOWN_PARAMETERS = frozenset({PARAM_BASE_PATH, PARAM_ON_DELETE})
_ON_DELETE_VALUES = ("delete", "retain")

log = get_logger("pyprovlib.examples.hostpath")


@dataclass(frozen=True)
class HostPathParameters:
    """A StorageClass's parameters, validated."""

    base_path: str = DEFAULT_BASE_PATH
    """Absolute, normalized directory on the node under which volume directories are made."""

    on_delete: str = "delete"
    """``delete`` removes the directory with the volume; ``retain`` renames it to
    ``archived-<pv name>``."""


def parse_parameters(storage_class: V1StorageClass) -> HostPathParameters:
    """Validate a StorageClass's parameters; :class:`ProvisioningError` says what to fix."""
    name, params = class_parameters(storage_class, _KNOWN_PARAMETERS, "hostpath")
    base_path = params.get(PARAM_BASE_PATH, DEFAULT_BASE_PATH)
    try:
        validate_base_path(base_path, f"parameter {PARAM_BASE_PATH}")
    except UnsafePathError as err:
        raise ProvisioningError(
            f"StorageClass {name!r}: {err}; set {PARAM_BASE_PATH} to an absolute, normalized "
            "directory other than '/', e.g. /var/pyprovlib/local"
        ) from err
    on_delete = params.get(PARAM_ON_DELETE, "delete")
    if on_delete not in _ON_DELETE_VALUES:
        raise ProvisioningError(
            f"StorageClass {name!r}: parameter {PARAM_ON_DELETE}={on_delete!r} is invalid; "
            f"use one of {', '.join(_ON_DELETE_VALUES)}"
        )
    return HostPathParameters(base_path=base_path, on_delete=on_delete)


def archived_name(volume_name: str) -> str:
    """The name a retained volume directory is renamed to."""
    return f"archived-{volume_name}"


@dataclass(frozen=True)
class NodeInfo:
    """What the provisioner needs to know about the node holding a volume."""

    name: str
    """The Node object's name."""

    hostname: str
    """Its ``kubernetes.io/hostname`` label (the node name when the label is missing)."""

    taints: tuple[V1Taint, ...] = field(default=())
    """Its taints, so helper pods can tolerate them."""


class VolumeDirectories(Protocol):
    """Creates and removes volume directories on a node.

    Implementations raise :class:`ProvisioningError` (create) or any exception (remove,
    archive) on failure; a directory already gone is success.
    """

    async def create(self, node: NodeInfo, base_path: str, name: str) -> None:
        """Make ``base_path/name`` on ``node`` (idempotent)."""

    async def remove(self, node: NodeInfo, base_path: str, name: str) -> None:
        """Remove ``base_path/name`` and its contents on ``node``."""

    async def archive(self, node: NodeInfo, base_path: str, name: str) -> None:
        """Rename ``base_path/name`` to ``base_path/archived-<name>`` on ``node``."""


class LocalDirectories:
    """:class:`VolumeDirectories` for a provisioner running on the node itself: the host's
    basePath must be mounted at the same path in the provisioner's container."""

    def __init__(self, dir_mode: int = DEFAULT_DIR_MODE) -> None:
        self.dir_mode = dir_mode

    async def _require_base(self, base_path: str) -> None:
        # Without the hostPath mount, creating the directory would silently put the volume in
        # the container's own filesystem, and "missing" on delete would leak the host's data.
        if not await asyncio.to_thread(posixpath.isdir, base_path):
            raise FileNotFoundError(
                f"basePath {base_path} does not exist in the provisioner's container; mount "
                "the host directory at the same path (hostPath volume, type DirectoryOrCreate)"
            )

    async def create(self, node: NodeInfo, base_path: str, name: str) -> None:
        """Make ``base_path/name`` with the configured mode."""
        try:
            await self._require_base(base_path)
            await asyncio.to_thread(make_directory_beneath, base_path, [name], self.dir_mode)
        except (OSError, UnsafePathError) as err:
            raise ProvisioningError(
                f"cannot create volume directory {posixpath.join(base_path, name)} on node "
                f"{node.name}: {err}"
            ) from err

    async def remove(self, node: NodeInfo, base_path: str, name: str) -> None:
        """Remove ``base_path/name``; a missing directory is success."""
        await self._require_base(base_path)
        removed = await asyncio.to_thread(remove_beneath, base_path, [name])
        log.info("volume directory removed", path=posixpath.join(base_path, name), found=removed)

    async def archive(self, node: NodeInfo, base_path: str, name: str) -> None:
        """Rename ``base_path/name`` to ``archived-<name>``; a missing directory is success."""
        await self._require_base(base_path)
        dest = await asyncio.to_thread(archive_beneath, base_path, [name], archived_name(name))
        log.info("volume directory archived", path=posixpath.join(base_path, name), to=dest)


def _selected_node(claim: V1PersistentVolumeClaim) -> str | None:
    annotations = (claim.metadata.annotations if claim.metadata else None) or {}
    value = annotations.get(ANNOTATION_SELECTED_NODE)
    return value if isinstance(value, str) and value else None


def _claim_key(claim: V1PersistentVolumeClaim) -> str:
    meta = claim.metadata
    return f"{meta.namespace}/{meta.name}" if meta else "?"


class HostPathProvisioner(Provisioner):
    """Provisions ``local`` PVs backed by ``<basePath>/<pv name>`` on the selected node.

    ``api_client`` reads Node objects (hostname label, taints) and, on delete, the
    StorageClass when the PV does not record its ``onDelete`` policy. ``directories`` does the
    filesystem work on the node.
    """

    def __init__(self, api_client: ApiClient, directories: VolumeDirectories) -> None:
        self.api_client = api_client
        self.directories = directories
        self._core = CoreV1Api(api_client)
        self._storage = StorageV1Api(api_client)

    async def node_info(self, node_name: str) -> NodeInfo:
        """Read the Node ``node_name`` (raises ``ApiException`` 404 when it does not exist)."""
        node = await self._core.read_node(node_name)
        labels = (node.metadata.labels if node.metadata else None) or {}
        hostname = labels.get(HOSTNAME_LABEL) or node_name
        taints = tuple((node.spec.taints if node.spec else None) or ())
        return NodeInfo(name=node_name, hostname=hostname, taints=taints)

    async def provision(self, options: ProvisionOptions) -> V1PersistentVolume:
        """Create the directory on the selected node and return a ``local`` PV pinned there."""
        sc = options.storage_class
        sc_name = sc.metadata.name if sc.metadata else "?"
        claim = _claim_key(options.pvc)
        node_name = options.selected_node_name
        if sc.volume_binding_mode != "WaitForFirstConsumer" and not node_name:
            # A node deployment's instance selects its own node for an Immediate claim first.
            raise ProvisioningError(
                f"StorageClass {sc_name!r} uses volumeBindingMode "
                f"{sc.volume_binding_mode or 'Immediate'}; the hostpath provisioner requires "
                "volumeBindingMode: WaitForFirstConsumer so the volume is made on the node "
                f"that runs the pod (claim {claim}), unless it runs in node mode with "
                "--node-deployment-immediate-binding"
            )
        params = parse_parameters(sc)
        if not node_name:
            raise ProvisioningError(
                f"claim {claim} has no selected node yet; it is provisioned once a pod using "
                f"it is scheduled ({ANNOTATION_SELECTED_NODE})"
            )
        try:
            name = validate_component(options.pv_name, "PersistentVolume name")
        except UnsafePathError as err:
            raise ProvisioningError(f"claim {claim}: {err}") from err
        try:
            node = await self.node_info(node_name)
        except ApiException as err:
            if is_not_found(err):
                raise ProvisioningError(
                    f"selected node {node_name!r} of claim {claim} does not exist; "
                    "asking the scheduler to pick another node",
                    ProvisioningState.RESCHEDULE,
                ) from err
            raise ProvisioningError(
                f"cannot read node {node_name!r} for claim {claim}: {err.reason}",
                ProvisioningState.NO_CHANGE,
            ) from err

        await self.directories.create(node, params.base_path, name)
        path = posixpath.join(params.base_path, name)
        log.info("volume directory ready", claim=claim, pv=name, node=node.name, path=path)
        return self._volume(options, node, path, params)

    def _volume(
        self,
        options: ProvisionOptions,
        node: NodeInfo,
        path: str,
        params: HostPathParameters,
    ) -> V1PersistentVolume:
        spec = options.pvc.spec
        requests = (spec.resources.requests if spec and spec.resources else None) or {}
        capacity = {"storage": requests["storage"]} if "storage" in requests else None
        return V1PersistentVolume(
            api_version="v1",
            kind="PersistentVolume",
            metadata=V1ObjectMeta(
                name=options.pv_name,
                annotations={ANNOTATION_NODE: node.name, ANNOTATION_ON_DELETE: params.on_delete},
            ),
            spec=V1PersistentVolumeSpec(
                capacity=capacity,
                access_modes=list(spec.access_modes or []) if spec else [],
                volume_mode=(spec.volume_mode if spec else None) or "Filesystem",
                local=V1LocalVolumeSource(path=path),
                node_affinity=V1VolumeNodeAffinity(
                    required=V1NodeSelector(
                        node_selector_terms=[
                            V1NodeSelectorTerm(
                                match_expressions=[
                                    V1NodeSelectorRequirement(
                                        key=HOSTNAME_LABEL, operator="In", values=[node.hostname]
                                    )
                                ]
                            )
                        ]
                    )
                ),
            ),
        )

    def volume_node_name(self, volume: V1PersistentVolume) -> str | None:
        """The node holding ``volume``: the recorded node name, else the hostname in its node
        affinity (nodes usually carry their name as hostname label)."""
        annotations = (volume.metadata.annotations if volume.metadata else None) or {}
        recorded = annotations.get(ANNOTATION_NODE)
        if recorded:
            return str(recorded)
        affinity = volume.spec.node_affinity if volume.spec else None
        terms = affinity.required.node_selector_terms if affinity and affinity.required else []
        for term in terms or []:
            for req in term.match_expressions or []:
                if req.key == HOSTNAME_LABEL and req.operator == "In" and req.values:
                    return str(req.values[0])
        return None

    async def _on_delete_policy(self, volume: V1PersistentVolume) -> str:
        annotations = (volume.metadata.annotations if volume.metadata else None) or {}
        recorded = annotations.get(ANNOTATION_ON_DELETE)
        if recorded in _ON_DELETE_VALUES:
            return str(recorded)
        class_name = volume.spec.storage_class_name if volume.spec else None
        if not class_name:
            return "delete"
        sc = await read_class_of_volume(
            self._storage,
            volume.metadata.name,
            class_name,
            fix=f"the PV has no {ANNOTATION_ON_DELETE} annotation either, so it is not known "
            "whether to delete or retain the data; recreate the class or annotate the PV",
        )
        return parse_parameters(sc).on_delete

    async def delete(self, volume: V1PersistentVolume) -> None:
        """Remove the volume's directory, or archive it when the class says
        ``onDelete: retain``. A directory already gone is success."""
        pv_name = volume.metadata.name if volume.metadata else ""
        local = volume.spec.local if volume.spec else None
        if local is None or not local.path:
            raise IgnoredError(f"PersistentVolume {pv_name} is not a local volume")
        path = str(local.path)
        # Only ever touch <basePath>/<pv name>: a PV edited to point elsewhere is refused.
        base_path, name = posixpath.split(path)
        if name != pv_name:
            raise RuntimeError(
                f"PersistentVolume {pv_name}: local path {path!r} is not <basePath>/{pv_name}; "
                "refusing to delete it"
            )
        validate_base_path(base_path, f"PersistentVolume {pv_name} base path")
        validate_component(name, "PersistentVolume name")
        node = await self._node_for_delete(volume)
        policy = await self._on_delete_policy(volume)
        log.info("deleting volume directory", pv=pv_name, node=node.name, path=path, policy=policy)
        if policy == "retain":
            await self.directories.archive(node, base_path, name)
        else:
            await self.directories.remove(node, base_path, name)

    async def _node_for_delete(self, volume: V1PersistentVolume) -> NodeInfo:
        node_name = self.volume_node_name(volume)
        if node_name is None:
            raise RuntimeError(
                f"PersistentVolume {volume.metadata.name} records no node ({ANNOTATION_NODE} "
                "or node affinity); cannot tell where its directory is"
            )
        try:
            return await self.node_info(node_name)
        except ApiException as err:
            if is_not_found(err):
                raise IgnoredError(
                    f"node {node_name} of PersistentVolume {volume.metadata.name} no longer "
                    "exists; its directory cannot be reached, leaving the PV in place"
                ) from err
            raise


class NodeHostPathProvisioner(HostPathProvisioner, Qualifier):
    """The per-node (DaemonSet) flavour: takes only claims whose selected node is
    ``node_name`` and deletes only volumes on that node, working on the local filesystem."""

    def __init__(
        self,
        api_client: ApiClient,
        node_name: str,
        directories: VolumeDirectories | None = None,
        *,
        dir_mode: int = DEFAULT_DIR_MODE,
    ) -> None:
        super().__init__(api_client, directories or LocalDirectories(dir_mode))
        self.node_name = node_name

    async def should_provision(self, claim: V1PersistentVolumeClaim) -> bool:
        """True when the scheduler picked this provisioner's node for ``claim``."""
        return _selected_node(claim) == self.node_name

    async def provision(self, options: ProvisionOptions) -> V1PersistentVolume:
        """As :meth:`HostPathProvisioner.provision`, for claims on this node only."""
        if options.selected_node_name and options.selected_node_name != self.node_name:
            raise IgnoredError(
                f"claim {_claim_key(options.pvc)} is for node {options.selected_node_name}, "
                f"this provisioner serves {self.node_name}"
            )
        return await super().provision(options)

    async def _node_for_delete(self, volume: V1PersistentVolume) -> NodeInfo:
        # Every node's provisioner sees every PV; only the one on the volume's node may act,
        # since elsewhere the directory is "missing" and deleting would report false success.
        node_name = self.volume_node_name(volume)
        own = await self.node_info(self.node_name)
        if node_name not in (own.name, own.hostname):
            raise IgnoredError(
                f"PersistentVolume {volume.metadata.name} lives on node {node_name}, "
                f"this provisioner serves {self.node_name}"
            )
        return own

"""CSIProvisioner: a :class:`~pyprovlib.provisioner.Provisioner` that creates and deletes
volumes through a CSI driver's Controller service, and the sidecar running it
(``python -m pyprovlib.csi.provisioner``).

A port of kubernetes-csi/external-provisioner's ``pkg/controller`` (Provision, Delete,
checkError, getVolumeCapabilities, makeVolumeName, getSecretReference / resolveTemplate,
GenerateAccessibilityRequirements, cloning protection). Differences, each on purpose:

- A claim deleted while its volume was still being created in the background (a CreateVolume
  that timed out or lost its connection) does not leak the volume (upstream issues #486 and
  #1469): the provisioner remembers in-flight volume names and, when the controller retries
  such a claim and finds it gone, finishes the CreateVolume and deletes the volume.
- A volume the driver created smaller than requested is deleted and the attempt FINISHED once
  the delete succeeded (upstream reports IN_BACKGROUND either way).
- Cloning protection is held while a clone is provisioned by this process and released when
  no clone of that source is in flight any more, without a separate controller. The same goes
  for the snapshot-source protection of a VolumeSnapshot a volume is restored from.
- A data source of any other kind than PersistentVolumeClaim and VolumeSnapshot is left to a
  volume populator, as upstream does: a Normal ``Provisioning`` event, then IgnoredError.
- A cross-namespace data source (``dataSourceRef.namespace``, the alpha
  CrossNamespaceVolumeDataSource feature with ReferenceGrants) is refused with a final error,
  as upstream does while that feature gate is off (its default).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import itertools
import random
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, NoReturn

from grpclib.const import Status
from kubernetes_asyncio.client import ApiClient, V1PersistentVolume

from pyprovlib._logging import get_logger
from pyprovlib.csi._proto.csi import v1
from pyprovlib.csi.connection import CSICallError, CSIConnection
from pyprovlib.errors import PyprovlibError
from pyprovlib.kube.convert import from_model, to_model
from pyprovlib.kube.errors import ApiException, is_conflict, is_not_found
from pyprovlib.kube.events import EventRecorder
from pyprovlib.kube.informer import SharedInformerFactory
from pyprovlib.kube.objects import Obj
from pyprovlib.kube.quantity import Format, Quantity, parse_storage_size
from pyprovlib.kube.resources import (
    CSINODES,
    NODES,
    PERSISTENT_VOLUME_CLAIMS,
    PERSISTENT_VOLUMES,
    SECRETS,
    STORAGE_CLASSES,
    VOLUME_ATTACHMENTS,
    VOLUME_SNAPSHOT_CONTENTS,
    VOLUME_SNAPSHOTS,
    Resource,
)
from pyprovlib.kube.rest import ResourceClient
from pyprovlib.provisioner import (
    BlockProvisioner,
    IgnoredError,
    InfeasibleError,
    Provisioner,
    ProvisioningError,
    ProvisioningState,
    ProvisionOptions,
)

__all__ = [
    "ANN_ALLOW_VOLUME_MODE_CHANGE",
    "ANN_DELETION_SECRET_NAME",
    "ANN_DELETION_SECRET_NAMESPACE",
    "CLONE_FINALIZER",
    "CONTROLLER_EXPAND_SECRET",
    "CONTROLLER_PUBLISH_SECRET",
    "CSI_PARAMETER_PREFIX",
    "NODE_EXPAND_SECRET",
    "NODE_PUBLISH_SECRET",
    "NODE_STAGE_SECRET",
    "PROVISIONER_ID_KEY",
    "PROVISIONER_SECRET",
    "SNAPSHOT_API_GROUP",
    "SNAPSHOT_FINALIZER",
    "SNAPSHOT_KIND",
    "CSIProvisioner",
    "CSIProvisionerOptions",
    "SecretParams",
    "SecretRef",
    "TopologyError",
    "check_error",
    "generate_accessibility_requirements",
    "main",
    "make_volume_name",
    "resolve_template",
    "secret_reference",
    "volume_capabilities",
]

log = get_logger(__name__)

CSI_PARAMETER_PREFIX: Final = "csi.storage.k8s.io/"
"""StorageClass parameters under this prefix are for the provisioner, not the driver."""
PROVISIONER_ID_KEY: Final = "storage.kubernetes.io/csiProvisionerIdentity"
"""Volume attribute recording which provisioner instance created the volume."""
ANN_DELETION_SECRET_NAME: Final = "volume.kubernetes.io/provisioner-deletion-secret-name"  # noqa: S105 - a key, not a secret
"""PV annotation recording the provisioner secret's name, so Delete finds it without the class."""
ANN_DELETION_SECRET_NAMESPACE: Final = "volume.kubernetes.io/provisioner-deletion-secret-namespace"  # noqa: S105 - a key, not a secret
"""PV annotation recording the provisioner secret's namespace (see ANN_DELETION_SECRET_NAME)."""
CLONE_FINALIZER: Final = "provisioner.storage.kubernetes.io/cloning-protection"
"""Finalizer on a clone's source claim while the clone is being provisioned."""
SNAPSHOT_FINALIZER: Final = "provisioner.storage.kubernetes.io/volumesnapshot-as-source-protection"
"""Finalizer on a VolumeSnapshot while a volume is being restored from it."""
SNAPSHOT_API_GROUP: Final = "snapshot.storage.k8s.io"
"""The API group of VolumeSnapshots, as a claim's ``dataSource.apiGroup`` names it."""
SNAPSHOT_KIND: Final = "VolumeSnapshot"
"""The kind of a claim's data source that restores a snapshot."""
ANN_ALLOW_VOLUME_MODE_CHANGE: Final = "snapshot.storage.kubernetes.io/allow-volume-mode-change"
"""VolumeSnapshotContent annotation that, set to true, lets a claim restore the snapshot with a
volumeMode other than its source volume's (see ``prevent_volume_mode_conversion``)."""

FSTYPE_KEY: Final = CSI_PARAMETER_PREFIX + "fstype"
PVC_NAME_KEY: Final = CSI_PARAMETER_PREFIX + "pvc/name"
PVC_NAMESPACE_KEY: Final = CSI_PARAMETER_PREFIX + "pvc/namespace"
PV_NAME_KEY: Final = CSI_PARAMETER_PREFIX + "pv/name"
"""The reserved parameter keys: the class's fsType, and the claim and PV names passed to
CreateVolume with ``extra_create_metadata``."""

_TOKEN_PV_NAME: Final = "pv.name"  # noqa: S105 - a key, not a secret
_TOKEN_PVC_NAME: Final = "pvc.name"  # noqa: S105 - a key, not a secret
_TOKEN_PVC_NAMESPACE: Final = "pvc.namespace"  # noqa: S105 - a key, not a secret


@dataclass(frozen=True)
class SecretParams:
    """The StorageClass parameter keys naming one kind of secret (name and namespace)."""

    kind: str
    name_key: str
    namespace_key: str


PROVISIONER_SECRET = SecretParams(
    "provisioner",
    CSI_PARAMETER_PREFIX + "provisioner-secret-name",
    CSI_PARAMETER_PREFIX + "provisioner-secret-namespace",
)
"""Class parameters naming the secret for CreateVolume and DeleteVolume."""
CONTROLLER_PUBLISH_SECRET = SecretParams(
    "controller publish",
    CSI_PARAMETER_PREFIX + "controller-publish-secret-name",
    CSI_PARAMETER_PREFIX + "controller-publish-secret-namespace",
)
"""Class parameters naming the secret for ControllerPublishVolume (recorded on the PV)."""
NODE_STAGE_SECRET = SecretParams(
    "node stage",
    CSI_PARAMETER_PREFIX + "node-stage-secret-name",
    CSI_PARAMETER_PREFIX + "node-stage-secret-namespace",
)
"""Class parameters naming the secret for NodeStageVolume (recorded on the PV)."""
NODE_PUBLISH_SECRET = SecretParams(
    "node publish",
    CSI_PARAMETER_PREFIX + "node-publish-secret-name",
    CSI_PARAMETER_PREFIX + "node-publish-secret-namespace",
)
"""Class parameters naming the secret for NodePublishVolume (recorded on the PV)."""
CONTROLLER_EXPAND_SECRET = SecretParams(
    "controller expand",
    CSI_PARAMETER_PREFIX + "controller-expand-secret-name",
    CSI_PARAMETER_PREFIX + "controller-expand-secret-namespace",
)
"""Class parameters naming the secret for ControllerExpandVolume (recorded on the PV)."""
NODE_EXPAND_SECRET = SecretParams(
    "node expand",
    CSI_PARAMETER_PREFIX + "node-expand-secret-name",
    CSI_PARAMETER_PREFIX + "node-expand-secret-namespace",
)
"""Each ``*_SECRET`` names the class parameters of one secret: the provisioner's (read and sent
with CreateVolume/DeleteVolume) and the ones only referenced from the PV."""
_PV_SECRETS: Final = (
    ("controllerPublishSecretRef", CONTROLLER_PUBLISH_SECRET),
    ("nodeStageSecretRef", NODE_STAGE_SECRET),
    ("nodePublishSecretRef", NODE_PUBLISH_SECRET),
    ("controllerExpandSecretRef", CONTROLLER_EXPAND_SECRET),
    ("nodeExpandSecretRef", NODE_EXPAND_SECRET),
)
_KNOWN_KEYS: Final = frozenset(
    {FSTYPE_KEY, PVC_NAME_KEY, PVC_NAMESPACE_KEY, PV_NAME_KEY}
    | {
        key
        for params in (
            PROVISIONER_SECRET,
            CONTROLLER_PUBLISH_SECRET,
            NODE_STAGE_SECRET,
            NODE_PUBLISH_SECRET,
            CONTROLLER_EXPAND_SECRET,
            NODE_EXPAND_SECRET,
        )
        for key in (params.name_key, params.namespace_key)
    }
)

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
_TEMPLATE_TOKEN = re.compile(r"\$(?:\{(?P<braced>[^}]*)\}|(?P<bare>[A-Za-z0-9_]+)|(?P<bad>\{|$))")

AccessMode = v1.VolumeCapabilityAccessModeMode
ControllerCap = v1.ControllerServiceCapabilityRpcType


@dataclass(frozen=True)
class CSIProvisionerOptions:
    """external-provisioner's flags that shape Provision and Delete, with their defaults."""

    volume_name_prefix: str = "pvc"
    """``--volume-name-prefix``: prefix of the name passed to CreateVolume."""
    volume_name_uuid_length: int = -1
    """``--volume-name-uuid-length``: claim-UID characters kept in the name (-1: all)."""
    default_fstype: str = ""
    """``--default-fstype``: fsType when the class names none ('' leaves it to the driver)."""
    extra_create_metadata: bool = False
    """``--extra-create-metadata``: pass the claim and PV names as CreateVolume parameters."""
    strict_topology: bool = False
    """``--strict-topology``: with a selected node, require exactly its topology."""
    immediate_topology: bool = True
    """``--immediate-topology``: for Immediate binding without allowedTopologies, request the
    topology of all nodes with the driver."""
    clean_up_deleted_claims: bool = True
    """Delete volumes whose claim was deleted while they were created in the background
    (instead of saving a PV for a claim that no longer exists)."""
    prevent_volume_mode_conversion: bool = True
    """``--prevent-volume-mode-conversion``: refuse to restore a snapshot into a claim whose
    volumeMode differs from the snapshot's source volume unless the VolumeSnapshotContent is
    annotated ``snapshot.storage.kubernetes.io/allow-volume-mode-change: "true"`` (upstream's
    default since v4.0.0)."""


@dataclass(frozen=True)
class SecretRef:
    """A resolved Secret reference."""

    name: str
    namespace: str

    def as_dict(self) -> dict[str, str]:
        """The ``{"name", "namespace"}`` form of a PV's SecretReference."""
        return {"name": self.name, "namespace": self.namespace}


# -- pure helpers (upstream's free functions) ------------------------------------------------


def make_volume_name(prefix: str, claim_uid: str, uuid_length: int) -> str:
    """The CreateVolume name: ``<prefix>-<claim uid>``, the uid cut to ``uuid_length``
    characters (dashes removed) unless that is -1 (upstream's ``makeVolumeName``)."""
    if not prefix:
        raise ValueError("volume name prefix cannot be empty")
    if not claim_uid:
        raise ValueError("claim has no UID")
    if uuid_length == -1:
        return f"{prefix}-{claim_uid}"
    if uuid_length < 0:
        raise ValueError(f"volume name UUID length {uuid_length} must be -1 or positive")
    return f"{prefix}-{claim_uid.replace('-', '')[:uuid_length]}"


def resolve_template(template: str, params: Mapping[str, str]) -> str:
    """Expand ``${token}`` (and ``$token``) in ``template`` from ``params``.

    Unknown tokens and a malformed ``${`` are errors naming them (upstream: ``invalid tokens``).
    """
    missing: list[str] = []
    malformed = False

    def expand(match: re.Match[str]) -> str:
        nonlocal malformed
        if match.group("bad") is not None:
            malformed = True
            return ""
        token = match.group("braced")
        if token is None:
            token = match.group("bare")
        if token in params:
            return params[token]
        missing.append(token)
        return ""

    resolved = _TEMPLATE_TOKEN.sub(expand, template)
    if malformed:
        raise ValueError(f"malformed template {template!r}: a '$' must start ${{token}}")
    if missing:
        raise ValueError(f"invalid tokens: {sorted(set(missing))!r}")
    return resolved


def secret_reference(
    params: SecretParams,
    class_parameters: Mapping[str, str],
    pv_name: str,
    claim: Obj | None,
) -> SecretRef | None:
    """Resolve a class's secret name/namespace templates (upstream's ``getSecretReference``).

    Namespace templates may use ``${pv.name}`` and ``${pvc.namespace}``; name templates also
    ``${pvc.name}`` and ``${pvc.annotations['KEY']}``. Claim tokens are unavailable when
    ``claim`` is None (deletion). Returns None when the class configures no such secret.
    Raises ValueError with a message for the user otherwise.
    """
    name_template = class_parameters.get(params.name_key, "")
    namespace_template = class_parameters.get(params.namespace_key, "")
    if not name_template and not namespace_template:
        return None
    if not name_template or not namespace_template:
        raise ValueError(
            f"either name and namespace for {params.kind} secrets specified, both must be "
            f"specified ({params.name_key}, {params.namespace_key})"
        )
    namespace_params = {_TOKEN_PV_NAME: pv_name}
    name_params = {_TOKEN_PV_NAME: pv_name}
    if claim is not None:
        metadata = claim.get("metadata") or {}
        namespace_params[_TOKEN_PVC_NAMESPACE] = metadata.get("namespace", "")
        name_params[_TOKEN_PVC_NAMESPACE] = metadata.get("namespace", "")
        name_params[_TOKEN_PVC_NAME] = metadata.get("name", "")
        for key, value in (metadata.get("annotations") or {}).items():
            name_params[f"pvc.annotations['{key}']"] = value
    try:
        namespace = resolve_template(namespace_template, namespace_params)
    except ValueError as err:
        raise ValueError(
            f"error resolving value {namespace_template!r} of {params.namespace_key}: {err}"
        ) from None
    if not _DNS1123_LABEL.match(namespace) or len(namespace) > 63:
        if namespace_template != namespace:
            raise ValueError(
                f"{params.namespace_key} {namespace_template!r} resolved to {namespace!r} "
                "which is not a valid namespace name (a DNS-1123 label)"
            )
        raise ValueError(
            f"{params.namespace_key} {namespace_template!r} is not a valid namespace name"
            " (a DNS-1123 label)"
        )
    try:
        name = resolve_template(name_template, name_params)
    except ValueError as err:
        raise ValueError(
            f"error resolving value {name_template!r} of {params.name_key}: {err}"
        ) from None
    if not _DNS1123_SUBDOMAIN.match(name) or len(name) > 253:
        if name_template != name:
            raise ValueError(
                f"{params.name_key} {name_template!r} resolved to {name!r} which is not a "
                "valid secret name (a DNS-1123 subdomain)"
            )
        raise ValueError(
            f"{params.name_key} {name_template!r} is not a valid secret name (a DNS-1123 subdomain)"
        )
    return SecretRef(name, namespace)


def volume_capabilities(
    access_modes: Sequence[str],
    *,
    block: bool,
    fs_type: str,
    mount_flags: Sequence[str],
    single_node_multi_writer: bool = False,
) -> list[v1.VolumeCapability]:
    """One VolumeCapability per access mode, mount (fsType, flags) or block
    (upstream's ``getVolumeCapabilities``)."""
    if not access_modes:
        raise ValueError("claim has no access modes")
    caps: list[v1.VolumeCapability] = []
    for mode in access_modes:
        if mode == "ReadWriteOnce":
            csi_mode = (
                AccessMode.SINGLE_NODE_MULTI_WRITER
                if single_node_multi_writer
                else AccessMode.SINGLE_NODE_WRITER
            )
        elif mode == "ReadWriteOncePod":
            csi_mode = (
                AccessMode.SINGLE_NODE_SINGLE_WRITER
                if single_node_multi_writer
                else AccessMode.SINGLE_NODE_WRITER
            )
        elif mode == "ReadOnlyMany":
            csi_mode = AccessMode.MULTI_NODE_READER_ONLY
        elif mode == "ReadWriteMany":
            csi_mode = AccessMode.MULTI_NODE_MULTI_WRITER
        else:
            raise ValueError(f"unknown access mode {mode!r}")
        cap = v1.VolumeCapability(access_mode=v1.VolumeCapabilityAccessMode(mode=csi_mode))
        if block:
            cap.block = v1.VolumeCapabilityBlockVolume()
        else:
            cap.mount = v1.VolumeCapabilityMountVolume(
                fs_type=fs_type, mount_flags=list(mount_flags)
            )
        caps.append(cap)
    return caps


def check_error(err: BaseException, may_reschedule: bool) -> ProvisioningState:
    """The state a failed CreateVolume left the driver in (upstream's ``checkError``)."""
    if not isinstance(err, CSICallError):
        # Not a gRPC status: we cannot know what the driver did.
        return ProvisioningState.IN_BACKGROUND
    if err.status is Status.RESOURCE_EXHAUSTED:
        return ProvisioningState.RESCHEDULE if may_reschedule else ProvisioningState.FINISHED
    if err.status in (
        Status.CANCELLED,
        Status.DEADLINE_EXCEEDED,
        Status.UNAVAILABLE,
        Status.ABORTED,
    ):
        return ProvisioningState.IN_BACKGROUND
    return ProvisioningState.FINISHED


class TopologyError(PyprovlibError):
    """The selected node's Node or CSINode is missing or inconsistent: reschedule."""


def _flatten_allowed_topologies(terms: Iterable[Mapping[str, Any]]) -> list[dict[str, str]]:
    """Each term's label expressions, as the cartesian product of their values."""
    segments: list[dict[str, str]] = []
    for term in terms:
        expressions = term.get("matchLabelExpressions") or []
        keys = [e["key"] for e in expressions]
        for values in itertools.product(*[e.get("values") or [] for e in expressions]):
            segment = dict(zip(keys, values, strict=True))
            if segment and segment not in segments:
                segments.append(segment)
    return segments


def _topology_keys(csinode: Mapping[str, Any], driver: str) -> list[str] | None:
    for entry in (csinode.get("spec") or {}).get("drivers") or []:
        if entry.get("name") == driver:
            return list(entry.get("topologyKeys") or [])
    return None


def _sorted_segments(segments: Iterable[dict[str, str]]) -> list[dict[str, str]]:
    unique: dict[tuple[tuple[str, str], ...], dict[str, str]] = {}
    for segment in segments:
        unique.setdefault(tuple(sorted(segment.items())), segment)
    return [unique[k] for k in sorted(unique)]


def _rotate(segments: list[dict[str, str]], start: int) -> list[dict[str, str]]:
    if not segments:
        return segments
    start %= len(segments)
    return segments[start:] + segments[:start]


def _stable_offset(name: str) -> int:
    # Spreads claims across segments deterministically (upstream hashes the claim name).
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "big")


def generate_accessibility_requirements(
    driver: str,
    claim_name: str,
    allowed_topologies: Sequence[Mapping[str, Any]],
    *,
    selected_node: Obj | None,
    selected_csinode: Obj | None,
    all_nodes: Sequence[Obj],
    all_csinodes: Sequence[Obj],
    strict_topology: bool = False,
    immediate_topology: bool = True,
) -> v1.TopologyRequirement | None:
    """Requisite and preferred topologies for CreateVolume (upstream's
    ``GenerateAccessibilityRequirements``).

    With a selected node: its CSINode's topology keys and its labels give the selected segment,
    preferred first. Without: the class's allowedTopologies, else (``immediate_topology``) the
    segments of every node running the driver, else no requirement.
    """
    selected_segment: dict[str, str] | None = None
    if selected_node is not None:
        node_name = (selected_node.get("metadata") or {}).get("name", "")
        if selected_csinode is None:
            raise TopologyError(f"CSINode {node_name!r} of the selected node not found")
        keys = _topology_keys(selected_csinode, driver)
        if keys is None:
            raise TopologyError(f"driver {driver} is not registered on node {node_name!r}")
        labels = (selected_node.get("metadata") or {}).get("labels") or {}
        missing = [k for k in keys if k not in labels]
        if missing:
            raise TopologyError(
                f"topology labels of the selected node {node_name!r} do not match the "
                f"topology keys of its CSINode: missing {missing}"
            )
        selected_segment = {k: labels[k] for k in keys}

    if allowed_topologies:
        requisite = _sorted_segments(_flatten_allowed_topologies(allowed_topologies))
        if selected_segment is not None and strict_topology:
            requisite = [
                s for s in requisite if all(selected_segment.get(k) == v for k, v in s.items())
            ] or [selected_segment]
    elif selected_segment is not None and strict_topology:
        requisite = [selected_segment]
    elif selected_segment is not None or immediate_topology:
        requisite = _aggregate_segments(
            driver,
            all_nodes,
            all_csinodes,
            keys=list(selected_segment) if selected_segment is not None else None,
        )
        if selected_segment is not None and selected_segment not in requisite:
            requisite = _sorted_segments([*requisite, selected_segment])
    else:
        requisite = []
    if not requisite:
        return None

    if selected_segment is not None:
        matching = [
            i
            for i, s in enumerate(requisite)
            if all(selected_segment.get(k) == v for k, v in s.items())
        ]
        preferred = _rotate(requisite, matching[0] if matching else 0)
        if not matching:
            preferred = [selected_segment, *preferred]
    else:
        preferred = _rotate(requisite, _stable_offset(claim_name))
    return v1.TopologyRequirement(
        requisite=[v1.Topology(segments=s) for s in requisite],
        preferred=[v1.Topology(segments=s) for s in preferred],
    )


def _aggregate_segments(
    driver: str,
    nodes: Sequence[Obj],
    csinodes: Sequence[Obj],
    *,
    keys: list[str] | None,
) -> list[dict[str, str]]:
    """Segments of all nodes running ``driver`` (with the same topology keys when given)."""
    labels_by_node = {
        (n.get("metadata") or {}).get("name"): (n.get("metadata") or {}).get("labels") or {}
        for n in nodes
    }
    segments: list[dict[str, str]] = []
    for csinode in csinodes:
        node_keys = _topology_keys(csinode, driver)
        if not node_keys:
            continue
        if keys is not None and sorted(node_keys) != sorted(keys):
            continue
        labels = labels_by_node.get((csinode.get("metadata") or {}).get("name"))
        if labels is None or any(k not in labels for k in node_keys):
            continue
        segments.append({k: labels[k] for k in node_keys})
    return _sorted_segments(segments)


def _node_affinity(topologies: Iterable[v1.Topology]) -> Obj | None:
    terms = [
        {
            "matchExpressions": [
                {"key": key, "operator": "In", "values": [value]}
                for key, value in sorted(t.segments.items())
            ]
        }
        for t in topologies
        if t.segments
    ]
    if not terms:
        return None
    return {"required": {"nodeSelectorTerms": terms}}


def _parse_go_bool(text: str) -> bool | None:
    """Go's strconv.ParseBool: 1/t/T/TRUE/true/True or 0/f/F/FALSE/false/False, else None."""
    if text in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if text in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    return None


# -- the provisioner -------------------------------------------------------------------------


@dataclass(frozen=True)
class _SourceRef:
    """A claim's data source, from ``dataSource`` or else ``dataSourceRef`` (upstream's
    ``dataSource``): kind, API group ('' for the core group), name and namespace."""

    kind: str
    api_group: str
    name: str
    namespace: str

    @property
    def key(self) -> tuple[str, str]:
        """(namespace, name)."""
        return (self.namespace, self.name)

    def describe(self) -> str:
        """``Kind namespace/name`` for messages."""
        return f"{self.kind} {self.namespace}/{self.name}"


def _claim_data_source(claim: Mapping[str, Any]) -> _SourceRef | None:
    metadata = claim.get("metadata") or {}
    spec = claim.get("spec") or {}
    own_namespace = metadata.get("namespace", "")
    source = spec.get("dataSource")
    if isinstance(source, Mapping):
        namespace = own_namespace
    else:
        source = spec.get("dataSourceRef")
        if not isinstance(source, Mapping):
            return None
        namespace = source.get("namespace") or own_namespace
    return _SourceRef(
        kind=str(source.get("kind") or ""),
        api_group=str(source.get("apiGroup") or ""),
        name=str(source.get("name") or ""),
        namespace=str(namespace),
    )


@dataclass
class _InFlight:
    """A CreateVolume that may still be running in the driver."""

    volume_name: str
    claim_namespace: str
    claim_name: str
    request: v1.CreateVolumeRequest
    protected: tuple[_SourceGuard, tuple[str, str]] | None


class _PreparationError(ProvisioningError):
    """The request could not be built: nothing was sent to the driver (NO_CHANGE)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, ProvisioningState.NO_CHANGE)


def _pending_sources(claims: Iterable[Obj], kind: str) -> set[tuple[str, str]]:
    """(namespace, name) of the data sources of ``kind`` that a not yet Bound claim names."""
    sources: set[tuple[str, str]] = set()
    for claim in claims:
        metadata = claim.get("metadata") or {}
        source = _claim_data_source(claim)
        if source is None or source.kind != kind:
            continue
        if kind == "PersistentVolumeClaim" and source.api_group:
            continue
        if kind == SNAPSHOT_KIND and source.api_group not in ("", SNAPSHOT_API_GROUP):
            continue
        if (claim.get("status") or {}).get("phase") == "Bound" or metadata.get("deletionTimestamp"):
            continue
        sources.add(source.key)
    return sources


def _pending_clone_sources(claims: Iterable[Obj]) -> set[tuple[str, str]]:
    """(namespace, name) of the claims that a not yet Bound claim wants to clone."""
    return _pending_sources(claims, "PersistentVolumeClaim")


class _SourceGuard:
    """A finalizer held on data sources (clone source claims, VolumeSnapshots) while volumes
    are being created from them: added before the first CreateVolume from a source, removed
    when no CreateVolume from it is in flight in this process any more."""

    def __init__(self, rest: ResourceClient, finalizer: str, what: str, logger: Any) -> None:
        self.rest = rest
        self.finalizer = finalizer
        self.what = what
        self.holders: dict[tuple[str, str], set[str]] = {}
        self.lock = asyncio.Lock()
        self._log = logger

    async def acquire(self, source: tuple[str, str], uid: str) -> None:
        """Hold ``source`` for the claim ``uid`` (raises _PreparationError when the finalizer
        cannot be added)."""
        async with self.lock:
            holders = self.holders.setdefault(source, set())
            first = not holders
            holders.add(uid)
            if first:
                try:
                    await self.set_finalizer(source, present=True)
                except ApiException as err:
                    holders.discard(uid)
                    if not holders:
                        del self.holders[source]
                    raise _PreparationError(
                        f"cannot protect {self.what} {source[0]}/{source[1]} with the "
                        f"{self.finalizer} finalizer: {err.status} {err.reason}"
                    ) from None

    async def release(self, source: tuple[str, str], uid: str) -> None:
        """Let go of ``source`` for ``uid``; the last holder removes the finalizer."""
        async with self.lock:
            holders = self.holders.get(source)
            if holders is None:
                return
            holders.discard(uid)
            if holders:
                return
            del self.holders[source]
            try:
                await self.set_finalizer(source, present=False)
            except ApiException as err:
                # Left in place, the finalizer only delays the source's deletion (until the
                # sweep removes it); say so.
                self._log.warning(
                    "cannot remove a data source protection finalizer",
                    finalizer=self.finalizer,
                    source=f"{self.what} {source[0]}/{source[1]}",
                    error=f"{err.status} {err.reason}",
                )

    async def set_finalizer(self, source: tuple[str, str], *, present: bool) -> None:
        """Add or remove the finalizer (read-modify-write, retried on conflicts)."""
        namespace, name = source
        for _attempt in range(5):
            try:
                obj = await self.rest.get(name, namespace)
            except ApiException as err:
                if not present and is_not_found(err):
                    return
                raise
            metadata = obj.setdefault("metadata", {})
            finalizers = list(metadata.get("finalizers") or [])
            if (self.finalizer in finalizers) == present:
                return
            if present:
                finalizers.append(self.finalizer)
            else:
                finalizers = [f for f in finalizers if f != self.finalizer]
            metadata["finalizers"] = finalizers
            try:
                await self.rest.replace(obj)
                return
            except ApiException as err:
                if present and is_not_found(err):
                    raise
                if not present and is_not_found(err):
                    return
                if not is_conflict(err):
                    raise
        raise ApiException(status=409, reason=f"Conflict: the {self.what} kept changing")

    async def sweep(
        self,
        objects: Iterable[Obj],
        still_needed: Callable[[tuple[str, str]], Awaitable[bool]],
    ) -> int:
        """Remove the finalizer from ``objects`` that no volume being created needs any more:
        neither held here nor named by a pending claim. ``still_needed(key)`` re-checks a
        candidate against the API server (a cache may not show a claim created a moment ago).
        Returns how many finalizers were removed."""
        removed = 0
        for obj in objects:
            metadata = obj.get("metadata") or {}
            if self.finalizer not in (metadata.get("finalizers") or []):
                continue
            key = (metadata.get("namespace", ""), metadata.get("name", ""))
            if key in self.holders or await still_needed(key):
                continue
            async with self.lock:
                if key in self.holders:
                    continue  # a restore or clone started meanwhile
                try:
                    await self.set_finalizer(key, present=False)
                except ApiException as err:
                    self._log.warning(
                        "cannot remove a stale data source protection finalizer",
                        finalizer=self.finalizer,
                        source=f"{self.what} {key[0]}/{key[1]}",
                        error=f"{err.status} {err.reason}",
                    )
                    continue
            removed += 1
            self._log.info(
                "removed a stale data source protection finalizer",
                finalizer=self.finalizer,
                source=f"{self.what} {key[0]}/{key[1]}",
            )
        return removed


class _Reader:
    """Reads one cluster-scoped resource from an informer's cache once it has synced (like
    upstream's listers), else from the API server."""

    def __init__(
        self, client: ApiClient, resource: Resource, factory: SharedInformerFactory | None
    ) -> None:
        self.rest = ResourceClient(client, resource)
        self.informer = factory.informer_for(resource) if factory is not None else None

    async def get(self, name: str) -> Obj:
        """The object (ApiException 404 when it does not exist)."""
        if self.informer is not None and self.informer.has_synced():
            cached = self.informer.store.get_by_key(name)
            if cached is not None:
                return cached
            # A miss may be a cache behind the API server (a Node that just registered):
            # ask the server before acting on it, e.g. rescheduling the claim.
        return await self.rest.get(name)

    async def list(self) -> list[Obj]:
        """Every object."""
        if self.informer is not None and self.informer.has_synced():
            return self.informer.store.list()
        items: list[Obj] = (await self.rest.list()).get("items") or []
        return items


class CSIProvisioner(Provisioner, BlockProvisioner):
    """Provisions and deletes volumes through a CSI driver (external-provisioner's core).

    ``client`` is a kubernetes-asyncio ApiClient used for Secrets, Nodes, CSINodes, claims,
    PVs, StorageClasses, VolumeAttachments, VolumeSnapshots and VolumeSnapshotContents;
    ``connection`` an opened
    :class:`~pyprovlib.csi.connection.CSIConnection` (its driver name is the provisioner name).
    With ``informer_factory`` (the one the ProvisionController shares, started by the caller)
    StorageClasses, VolumeAttachments, Nodes and CSINodes are read from its caches.
    ``recorder`` (usually the ProvisionController's, which :attr:`recorder` can also be set to
    after construction) receives the events upstream records from the provisioner itself; without
    one they are only logged.
    """

    def __init__(
        self,
        client: ApiClient,
        connection: CSIConnection,
        options: CSIProvisionerOptions | None = None,
        *,
        identity: str | None = None,
        informer_factory: SharedInformerFactory | None = None,
        recorder: EventRecorder | None = None,
    ) -> None:
        if not connection.driver_name:
            raise ValueError("the CSI connection is not identified yet: use CSIConnection.open")
        self.client = client
        self.connection = connection
        self.options = options or CSIProvisionerOptions()
        self.driver_name = connection.driver_name
        self.recorder = recorder
        # Upstream's identity: start time in ms, a random number, the driver name.
        self.identity = identity or (
            f"{int(time.time() * 1000)}-{random.randint(0, 9999)}-{self.driver_name}"  # noqa: S311
        )
        self._secrets = ResourceClient(client, SECRETS)
        self._claims = ResourceClient(client, PERSISTENT_VOLUME_CLAIMS)
        self._volumes = ResourceClient(client, PERSISTENT_VOLUMES)
        self._claim_cache = _Reader(client, PERSISTENT_VOLUME_CLAIMS, informer_factory)
        self._classes = _Reader(client, STORAGE_CLASSES, informer_factory)
        self._attachments = _Reader(client, VOLUME_ATTACHMENTS, informer_factory)
        # Topology needs Nodes and CSINodes: watch them only for drivers that have it.
        topology_factory = informer_factory if self.supports_topology else None
        self._nodes = _Reader(client, NODES, topology_factory)
        self._csinodes = _Reader(client, CSINODES, topology_factory)
        self._snapshots = ResourceClient(client, VOLUME_SNAPSHOTS)
        self._snapshot_contents = ResourceClient(client, VOLUME_SNAPSHOT_CONTENTS)
        self._in_flight: dict[str, _InFlight] = {}
        self._log = log.bind(driver=self.driver_name)
        self._clone_guard = _SourceGuard(
            self._claims, CLONE_FINALIZER, "clone source claim", self._log
        )
        self._snapshot_guard = _SourceGuard(
            self._snapshots, SNAPSHOT_FINALIZER, "VolumeSnapshot", self._log
        )

    # -- capabilities ---------------------------------------------------------------------

    def supports_block(self) -> bool:
        """CSI drivers declare block support per request; the driver refuses what it cannot."""
        return True

    @property
    def supports_topology(self) -> bool:
        """The driver has VOLUME_ACCESSIBILITY_CONSTRAINTS."""
        return self.connection.plugin_capabilities.accessibility_constraints

    @property
    def supports_clone(self) -> bool:
        """The driver has CLONE_VOLUME."""
        return ControllerCap.CLONE_VOLUME in self.connection.controller_capabilities

    @property
    def supports_snapshot(self) -> bool:
        """The driver has CREATE_DELETE_SNAPSHOT (needed to restore a VolumeSnapshot)."""
        return ControllerCap.CREATE_DELETE_SNAPSHOT in self.connection.controller_capabilities

    @property
    def in_flight(self) -> frozenset[str]:
        """UIDs of claims whose CreateVolume may still be running in the driver."""
        return frozenset(self._in_flight)

    # -- provision ------------------------------------------------------------------------

    async def provision(self, options: ProvisionOptions) -> V1PersistentVolume:
        """Create the volume with CreateVolume and return its CSI PersistentVolume."""
        claim = from_model(options.pvc)
        storage_class = from_model(options.storage_class)
        metadata = claim.get("metadata") or {}
        uid = metadata.get("uid", "")
        claim_key = f"{metadata.get('namespace')}/{metadata.get('name')}"
        logger = self._log.bind(claim=claim_key, pv=options.pv_name)

        previous = self._in_flight.get(uid)
        if previous is not None and self.options.clean_up_deleted_claims:
            await self._clean_up_if_claim_deleted(previous, uid, storage_class, logger)

        request, provisioner_secret, protected = await self._prepare(options, claim, storage_class)
        may_reschedule = self.supports_topology and options.selected_node_name is not None
        self._in_flight[uid] = _InFlight(
            request.name,
            metadata.get("namespace", ""),
            metadata.get("name", ""),
            request,
            protected,
        )
        logger.debug("calling CreateVolume", volume_name=request.name)
        try:
            response = await self.connection.create_volume(request)
        except Exception as err:
            state = check_error(err, may_reschedule)
            if state is not ProvisioningState.IN_BACKGROUND:
                await self._finish(uid)
            # A CSICallError reads as grpc-go's status error, as upstream's events do.
            text = str(err) if isinstance(err, CSICallError) else f"{type(err).__name__}: {err}"
            if isinstance(err, CSICallError) and err.status is Status.INVALID_ARGUMENT:
                # The driver refuses the request as it stands: the controller retries it only
                # after retry_interval_max, or at once when the class is replaced.
                raise InfeasibleError(text) from None
            raise ProvisioningError(text, state) from None
        volume = response.volume
        if volume is None or not volume.volume_id:
            await self._finish(uid)
            raise ProvisioningError(
                f"CSI driver {self.driver_name} returned no volume for CreateVolume",
                ProvisioningState.FINISHED,
            )
        # `is not None`, never a message's truthiness: betterproto2's Message.__bool__ builds
        # every field's default under warnings.catch_warnings(), a few µs per field per call.
        capacity_range = request.capacity_range
        requested = capacity_range.required_bytes if capacity_range is not None else 0
        capacity = volume.capacity_bytes or requested
        if capacity < requested:
            await self._delete_rejected(
                volume.volume_id,
                request,
                f"created volume capacity {capacity} less than requested capacity {requested}",
                uid,
            )
        if _claim_data_source(claim) is not None and volume.content_source is None:
            # Upstream's check: a driver that ignored the data source made an empty volume,
            # which must not be handed out as a copy of the source.
            await self._delete_rejected(
                volume.volume_id,
                request,
                f"CSI driver {self.driver_name} created volume {volume.volume_id} without the "
                "requested content source (volume content source missing)",
                uid,
            )
        await self._finish(uid)
        pv = self._build_volume(
            options,
            claim,
            storage_class,
            request=request,
            volume=volume,
            capacity=capacity,
            provisioner_secret=provisioner_secret,
        )
        logger.info("volume created", volume_id=volume.volume_id, capacity=capacity)
        return pv

    async def _finish(self, uid: str) -> None:
        entry = self._in_flight.pop(uid, None)
        if entry is not None and entry.protected is not None:
            guard, source = entry.protected
            await guard.release(source, uid)

    async def _delete_rejected(
        self,
        volume_id: str,
        request: v1.CreateVolumeRequest,
        message: str,
        uid: str,
    ) -> NoReturn:
        """Delete a volume the driver created but that cannot be used; always raises."""
        try:
            await self.connection.delete_volume(
                v1.DeleteVolumeRequest(volume_id=volume_id, secrets=dict(request.secrets))
            )
        except Exception as err:
            # The volume still exists: retry, so the next attempt cleans up again.
            raise ProvisioningError(
                f"{message}. Cleanup of volume {volume_id} failed, volume is orphaned: {err}",
                ProvisioningState.IN_BACKGROUND,
            ) from None
        await self._finish(uid)
        raise ProvisioningError(f"{message}; the volume was deleted", ProvisioningState.FINISHED)

    async def _clean_up_if_claim_deleted(
        self,
        entry: _InFlight,
        uid: str,
        storage_class: Obj,
        logger: Any,
    ) -> None:
        """A retry of a claim whose volume may be being created: if the claim is gone, finish
        the CreateVolume (idempotent by name) and delete the volume instead of saving a PV."""
        if storage_class.get("reclaimPolicy", "Delete") != "Delete":
            # Retain: a PV is what lets an administrator find the volume; keep creating it.
            return
        try:
            current = await self._claims.get(entry.claim_name, entry.claim_namespace)
        except ApiException as err:
            if not is_not_found(err):
                raise ProvisioningError(
                    f"cannot check whether claim {entry.claim_namespace}/{entry.claim_name} "
                    f"still exists: {err.status} {err.reason}",
                    ProvisioningState.IN_BACKGROUND,
                ) from None
            current = None
        current_meta = (current or {}).get("metadata") or {}
        if current_meta.get("uid") == uid and not current_meta.get("deletionTimestamp"):
            return
        logger.info(
            "claim was deleted while its volume was being created; cleaning up",
            volume_name=entry.volume_name,
        )
        try:
            response = await self.connection.create_volume(entry.request)
        except CSICallError as err:
            state = check_error(err, False)
            if state is ProvisioningState.IN_BACKGROUND:
                raise ProvisioningError(
                    f"claim deleted; waiting for volume {entry.volume_name} to finish creating "
                    f"so it can be deleted: {err}",
                    state,
                ) from None
            # A final error: the driver created nothing under this name.
            await self._finish(uid)
            raise IgnoredError(
                f"claim deleted while provisioning; the driver reports no volume: {err}"
            ) from None
        volume_id = response.volume.volume_id if response.volume is not None else ""
        if volume_id:
            try:
                await self.connection.delete_volume(
                    v1.DeleteVolumeRequest(volume_id=volume_id, secrets=dict(entry.request.secrets))
                )
            except CSICallError as err:
                raise ProvisioningError(
                    f"claim deleted; deleting its volume {volume_id} failed: {err}",
                    ProvisioningState.IN_BACKGROUND,
                ) from None
        await self._finish(uid)
        logger.info("volume of deleted claim deleted", volume_id=volume_id)
        raise IgnoredError(
            f"claim was deleted while provisioning; volume {volume_id or entry.volume_name} "
            "was deleted"
        )

    async def _prepare(
        self, options: ProvisionOptions, claim: Obj, storage_class: Obj
    ) -> tuple[
        v1.CreateVolumeRequest, SecretRef | None, tuple[_SourceGuard, tuple[str, str]] | None
    ]:
        metadata = claim.get("metadata") or {}
        spec = claim.get("spec") or {}
        data_source = _claim_data_source(claim)
        if data_source is not None:
            self._check_data_source(claim, data_source)
        class_name = (storage_class.get("metadata") or {}).get("name", "")
        parameters: dict[str, str] = dict(storage_class.get("parameters") or {})
        try:
            volume_name = make_volume_name(
                self.options.volume_name_prefix,
                metadata.get("uid", ""),
                self.options.volume_name_uuid_length,
            )
        except ValueError as err:
            raise _PreparationError(str(err)) from None

        fs_type = ""
        create_parameters: dict[str, str] = {}
        for key, value in parameters.items():
            if key.startswith(CSI_PARAMETER_PREFIX):
                if key not in _KNOWN_KEYS:
                    raise ProvisioningError(
                        f"StorageClass {class_name!r} has the unknown parameter key {key!r} "
                        f"with reserved namespace {CSI_PARAMETER_PREFIX}"
                    )
                if key == FSTYPE_KEY:
                    fs_type = value
                continue
            if key.lower() == "fstype":
                raise ProvisioningError(
                    f"StorageClass {class_name!r}: parameter {key!r} is deprecated and no longer "
                    f"supported; use {FSTYPE_KEY}"
                )
            create_parameters[key] = value
        if self.options.extra_create_metadata:
            create_parameters[PVC_NAME_KEY] = metadata.get("name", "")
            create_parameters[PVC_NAMESPACE_KEY] = metadata.get("namespace", "")
            create_parameters[PV_NAME_KEY] = options.pv_name

        block = spec.get("volumeMode") == "Block"
        if not fs_type and not block:
            fs_type = self.options.default_fstype
        try:
            requested = parse_storage_size(
                ((spec.get("resources") or {}).get("requests") or {}).get("storage"),
                what="storage request",
            )
            caps = volume_capabilities(
                spec.get("accessModes") or [],
                block=block,
                fs_type=fs_type,
                mount_flags=storage_class.get("mountOptions") or [],
                single_node_multi_writer=(
                    ControllerCap.SINGLE_NODE_MULTI_WRITER
                    in self.connection.controller_capabilities
                ),
            )
        except ValueError as err:
            raise ProvisioningError(f"claim {metadata.get('name')!r}: {err}") from None

        # Secret templates and the PV's secret references are validated before any call.
        try:
            provisioner_secret = secret_reference(
                PROVISIONER_SECRET, parameters, options.pv_name, claim
            )
            for _field, params in _PV_SECRETS:
                secret_reference(params, parameters, options.pv_name, claim)
        except ValueError as err:
            raise _PreparationError(f"StorageClass {class_name!r}: {err}") from None
        secrets = await self._read_secret(provisioner_secret) if provisioner_secret else {}

        request = v1.CreateVolumeRequest(
            name=volume_name,
            capacity_range=v1.CapacityRange(required_bytes=requested),
            volume_capabilities=caps,
            parameters=create_parameters,
            secrets=secrets,
        )

        protected: tuple[_SourceGuard, tuple[str, str]] | None = None
        if data_source is not None:
            request.volume_content_source, guard = await self._content_source(
                claim, data_source, requested, block
            )
            protected = (guard, data_source.key)

        if self.supports_topology:
            request.accessibility_requirements = await self._accessibility(
                options, claim, storage_class
            )
        if protected is not None:
            await protected[0].acquire(protected[1], metadata.get("uid", ""))
        return request, provisioner_secret, protected

    async def _read_secret(self, ref: SecretRef) -> dict[str, str]:
        try:
            secret = await self._secrets.get(ref.name, ref.namespace)
        except ApiException as err:
            raise _PreparationError(
                f"error getting secret {ref.name} in namespace {ref.namespace}: "
                f"{err.status} {err.reason}"
            ) from None
        data: dict[str, str] = {}
        for key, value in (secret.get("data") or {}).items():
            try:
                data[key] = base64.b64decode(value).decode("utf-8")
            except (ValueError, UnicodeDecodeError):
                # The message names the key only: the value is the secret.
                raise _PreparationError(
                    f"secret {ref.namespace}/{ref.name}: value of key {key!r} is not UTF-8 text"
                ) from None
        return data

    def _check_data_source(self, claim: Obj, source: _SourceRef) -> None:
        """What upstream checks before anything else (final errors): a name, the claim's own
        namespace, the right API group, and the driver capability the source needs."""
        metadata = claim.get("metadata") or {}
        claim_key = f"{metadata.get('namespace')}/{metadata.get('name')}"
        if not source.name:
            raise ProvisioningError(
                f"claim {claim_key}: its data source {source.kind or '(no kind)'} has no name; "
                "set spec.dataSource.name"
            )
        if source.namespace != metadata.get("namespace"):
            raise ProvisioningError(
                f"claim {claim_key} names {source.describe()} as its data source "
                "(dataSourceRef.namespace): cross-namespace data sources (the "
                "CrossNamespaceVolumeDataSource feature with ReferenceGrants) are not "
                f"supported by this provisioner; use a source in namespace "
                f"{metadata.get('namespace')}"
            )
        if source.kind == SNAPSHOT_KIND:
            if source.api_group != SNAPSHOT_API_GROUP:
                raise ProvisioningError(
                    f"claim {claim_key}: data source VolumeSnapshot {source.name!r} must have "
                    f"apiGroup {SNAPSHOT_API_GROUP}, not {source.api_group or 'the core group'}"
                )
            if not self.supports_snapshot:
                raise ProvisioningError(
                    f"CSI driver {self.driver_name} does not support snapshot restore: "
                    "controller CREATE_DELETE_SNAPSHOT capability is not reported, so claim "
                    f"{claim_key} cannot be restored from {source.describe()}; use a "
                    "StorageClass whose driver supports snapshots, or remove the data source"
                )
        elif source.kind == "PersistentVolumeClaim" and not source.api_group:
            if not self.supports_clone:
                raise ProvisioningError(
                    f"CSI driver {self.driver_name} does not support clone operations: "
                    "controller CLONE_VOLUME capability is not reported, so claim "
                    f"{claim_key} cannot be cloned from {source.describe()}"
                )
        else:
            # Upstream: any other kind is a volume populator's (AnyVolumeDataSource); the
            # populator creates the volume and binds it, so there is nothing to do here.
            if self.recorder is not None:
                self.recorder.event(
                    {**claim, "kind": "PersistentVolumeClaim", "apiVersion": "v1"},
                    "Normal",
                    "Provisioning",
                    "Assuming an external populator will provision the volume",
                )
            raise IgnoredError(
                f"data source {source.api_group or 'core'}/{source.kind} {source.name!r} is not "
                "handled by the provisioner, assuming an external populator will provision it"
            )

    async def _content_source(
        self, claim: Obj, data_source: _SourceRef, requested: int, block: bool
    ) -> tuple[v1.VolumeContentSource, _SourceGuard]:
        if data_source.kind == SNAPSHOT_KIND:
            content = await self._snapshot_source(claim, data_source, requested)
            return content, self._snapshot_guard
        return await self._clone_source(claim, data_source, requested, block), self._clone_guard

    async def _clone_source(
        self, claim: Obj, data_source: _SourceRef, requested: int, block: bool
    ) -> v1.VolumeContentSource:
        namespace, name = data_source.key
        try:
            source = await self._claims.get(name, namespace)
        except ApiException as err:
            raise _PreparationError(
                f"error getting clone source claim {namespace}/{name}: {err.status} {err.reason}"
            ) from None
        source_meta = source.get("metadata") or {}
        source_spec = source.get("spec") or {}
        if source_meta.get("deletionTimestamp"):
            raise _PreparationError(f"clone source claim {namespace}/{name} is being deleted")
        if (source.get("status") or {}).get("phase") != "Bound":
            raise _PreparationError(f"clone source claim {namespace}/{name} is not bound")
        claim_class = (claim.get("spec") or {}).get("storageClassName")
        if source_spec.get("storageClassName") != claim_class:
            raise _PreparationError(
                "the source claim and the clone must be in the same storage class: source is "
                f"in {source_spec.get('storageClassName')!r}, clone in {claim_class!r}"
            )
        source_block = source_spec.get("volumeMode") == "Block"
        if source_block != block:
            raise _PreparationError(
                f"clone source claim {namespace}/{name} has a different volumeMode"
            )
        source_size = ((source.get("status") or {}).get("capacity") or {}).get("storage") or (
            (source_spec.get("resources") or {}).get("requests") or {}
        ).get("storage")
        try:
            source_bytes = parse_storage_size(source_size, what="source claim size")
        except ValueError as err:
            raise _PreparationError(str(err)) from None
        if requested < source_bytes:
            raise _PreparationError(
                "the clone's request must be greater than or equal in size to the source "
                f"claim: requested {requested} but source is {source_bytes}"
            )
        volume_name = source_spec.get("volumeName", "")
        try:
            source_pv = await self._volumes.get(volume_name)
        except ApiException as err:
            raise _PreparationError(
                f"error getting the PV {volume_name!r} of clone source claim "
                f"{namespace}/{name}: {err.status} {err.reason}"
            ) from None
        claim_ref = (source_pv.get("spec") or {}).get("claimRef") or {}
        if claim_ref.get("uid") != source_meta.get("uid"):
            raise _PreparationError(
                f"the PV {volume_name!r} is not bound to clone source claim {namespace}/{name}"
            )
        csi = (source_pv.get("spec") or {}).get("csi") or {}
        if csi.get("driver") != self.driver_name:
            raise _PreparationError(
                f"the clone source's PV {volume_name!r} belongs to another CSI driver"
                f" ({csi.get('driver')!r})"
            )
        return v1.VolumeContentSource(
            volume=v1.VolumeContentSourceVolumeSource(volume_id=csi.get("volumeHandle", ""))
        )

    async def _snapshot_source(
        self, claim: Obj, data_source: _SourceRef, requested: int
    ) -> v1.VolumeContentSource:
        """Upstream's ``getSnapshotSource``: the VolumeSnapshot and its VolumeSnapshotContent
        must point at each other, belong to this driver, be ready, have a snapshot handle, fit
        in the claim and (with ``prevent_volume_mode_conversion``) keep the volume mode."""
        namespace, name = data_source.key
        what = f"VolumeSnapshot {namespace}/{name}"
        claim_meta = claim.get("metadata") or {}
        claim_key = f"{claim_meta.get('namespace')}/{claim_meta.get('name')}"
        try:
            snapshot = await self._snapshots.get(name, namespace)
        except ApiException as err:
            if is_not_found(err):
                raise _PreparationError(
                    f"{what} not found: create it, or fix the data source of claim "
                    f"{claim_key}; provisioning is retried until it exists"
                ) from None
            raise _PreparationError(f"error getting {what}: {err.status} {err.reason}") from None
        snap_meta = snapshot.get("metadata") or {}
        if snap_meta.get("deletionTimestamp") and SNAPSHOT_FINALIZER not in (
            snap_meta.get("finalizers") or []
        ):
            # With our finalizer on it, a restore from it started before the deletion: finish
            # it. Without, this is a new restore from a snapshot that is going away.
            raise _PreparationError(
                f"{what} is being deleted: restore claim {claim_key} from another snapshot"
            )
        status = snapshot.get("status") or {}
        content_name = status.get("boundVolumeSnapshotContentName")
        if not content_name:
            raise _PreparationError(
                f"{what} is not bound to a VolumeSnapshotContent yet; provisioning is retried "
                "until the snapshot controller binds it"
            )
        try:
            content = await self._snapshot_contents.get(content_name)
        except ApiException as err:
            raise _PreparationError(
                f"{what} is not bound: error getting its VolumeSnapshotContent {content_name}: "
                f"{err.status} {err.reason}"
            ) from None
        content_spec = content.get("spec") or {}
        ref = content_spec.get("volumeSnapshotRef") or {}
        if (ref.get("uid"), ref.get("namespace"), ref.get("name")) != (
            snap_meta.get("uid"),
            namespace,
            name,
        ):
            raise _PreparationError(
                f"{what} is not bound: its VolumeSnapshotContent {content_name} points at "
                f"another snapshot ({ref.get('namespace')}/{ref.get('name')}, uid "
                f"{ref.get('uid')}); a snapshot is usable once it and its content point at "
                "each other"
            )
        driver = content_spec.get("driver")
        if driver != self.driver_name:
            raise _PreparationError(
                f"{what} was taken by CSI driver {driver!r} (VolumeSnapshotContent "
                f"{content_name}), not {self.driver_name}: restore it with a StorageClass of "
                "that driver"
            )
        if status.get("readyToUse") is not True:
            raise _PreparationError(
                f"{what} is not ready to use yet; provisioning is retried until it is"
            )
        handle = (content.get("status") or {}).get("snapshotHandle")
        if not handle:
            raise _PreparationError(
                f"the snapshot handle of {what} is not available yet (VolumeSnapshotContent "
                f"{content_name} has no status.snapshotHandle)"
            )
        restore_size = status.get("restoreSize")
        if restore_size is not None:
            try:
                restore_bytes = parse_storage_size(
                    str(restore_size) if isinstance(restore_size, int) else restore_size,
                    what=f"restoreSize of {what}",
                )
            except ValueError as err:
                raise _PreparationError(str(err)) from None
            if requested < restore_bytes:
                raise _PreparationError(
                    f"requested volume size {requested} is less than the size {restore_bytes} "
                    f"of the source {what}: claim {claim_key} must request at least "
                    f"{restore_size}"
                )
            # A larger volume is fine: the driver expands what it restores.
        if self.options.prevent_volume_mode_conversion:
            self._check_volume_mode(claim, claim_key, what, content)
        return v1.VolumeContentSource(
            snapshot=v1.VolumeContentSourceSnapshotSource(snapshot_id=handle)
        )

    @staticmethod
    def _check_volume_mode(claim: Obj, claim_key: str, what: str, content: Obj) -> None:
        """A restore may change the volume mode only when the content allows it."""
        source_mode = (content.get("spec") or {}).get("sourceVolumeMode")
        claim_mode = (claim.get("spec") or {}).get("volumeMode")
        if not source_mode or not claim_mode or source_mode == claim_mode:
            return
        content_name = (content.get("metadata") or {}).get("name", "")
        refusal = (
            f"claim {claim_key} (volumeMode {claim_mode}) would change the volume mode of the "
            f"source volume ({source_mode}) of {what} but does not have permission to do so: "
        )
        fix = (
            f"; annotate VolumeSnapshotContent {content_name} with "
            f'{ANN_ALLOW_VOLUME_MODE_CHANGE}="true" to allow it, or request volumeMode '
            f"{source_mode}"
        )
        annotations = (content.get("metadata") or {}).get("annotations") or {}
        value = annotations.get(ANN_ALLOW_VOLUME_MODE_CHANGE)
        if value is None:
            raise _PreparationError(
                f"{refusal}annotation {ANN_ALLOW_VOLUME_MODE_CHANGE} is not present on "
                f"VolumeSnapshotContent {content_name}{fix}"
            )
        allowed = _parse_go_bool(value)
        if allowed is None:
            raise _PreparationError(
                f"{refusal}annotation {ANN_ALLOW_VOLUME_MODE_CHANGE} on VolumeSnapshotContent "
                f"{content_name} is {value!r}, not a boolean{fix}"
            )
        if not allowed:
            raise _PreparationError(
                f"{refusal}{ANN_ALLOW_VOLUME_MODE_CHANGE} is set to false on "
                f"VolumeSnapshotContent {content_name}{fix}"
            )

    async def _accessibility(
        self, options: ProvisionOptions, claim: Obj, storage_class: Obj
    ) -> v1.TopologyRequirement | None:
        selected_name = options.selected_node_name
        selected_node: Obj | None = None
        selected_csinode: Obj | None = None
        try:
            if selected_name:
                try:
                    selected_node = await self._nodes.get(selected_name)
                except ApiException as err:
                    if is_not_found(err):
                        raise TopologyError(f"selected node {selected_name!r} not found") from None
                    raise
                try:
                    selected_csinode = await self._csinodes.get(selected_name)
                except ApiException as err:
                    if not is_not_found(err):
                        raise
            allowed = storage_class.get("allowedTopologies") or []
            nodes: list[Obj] = []
            csinodes: list[Obj] = []
            needs_all = not allowed and (
                (selected_name and not self.options.strict_topology)
                or (not selected_name and self.options.immediate_topology)
            )
            if needs_all:
                nodes = await self._nodes.list()
                csinodes = await self._csinodes.list()
            return generate_accessibility_requirements(
                self.driver_name,
                (claim.get("metadata") or {}).get("name", ""),
                allowed,
                selected_node=selected_node,
                selected_csinode=selected_csinode,
                all_nodes=nodes,
                all_csinodes=csinodes,
                strict_topology=self.options.strict_topology,
                immediate_topology=self.options.immediate_topology,
            )
        except TopologyError as err:
            raise ProvisioningError(
                f"error generating accessibility requirements: {err}",
                ProvisioningState.RESCHEDULE,
            ) from None
        except ApiException as err:
            raise _PreparationError(
                f"error generating accessibility requirements: {err.status} {err.reason}"
            ) from None

    def _build_volume(
        self,
        options: ProvisionOptions,
        claim: Obj,
        storage_class: Obj,
        *,
        request: v1.CreateVolumeRequest,
        volume: v1.Volume,
        capacity: int,
        provisioner_secret: SecretRef | None,
    ) -> V1PersistentVolume:
        spec = claim.get("spec") or {}
        parameters = storage_class.get("parameters") or {}
        attributes = dict(volume.volume_context)
        attributes[PROVISIONER_ID_KEY] = self.identity
        csi: Obj = {
            "driver": self.driver_name,
            "volumeHandle": volume.volume_id,
            "volumeAttributes": attributes,
        }
        block = spec.get("volumeMode") == "Block"
        if not block:
            mount = request.volume_capabilities[0].mount
            fs_type = mount.fs_type if mount is not None else ""
            if fs_type:
                csi["fsType"] = fs_type
        for field, params in _PV_SECRETS:
            ref = secret_reference(params, parameters, options.pv_name, claim)
            if ref is not None:
                csi[field] = ref.as_dict()
        annotations: dict[str, str] = {}
        if provisioner_secret is not None:
            annotations[ANN_DELETION_SECRET_NAME] = provisioner_secret.name
            annotations[ANN_DELETION_SECRET_NAMESPACE] = provisioner_secret.namespace
        pv: Obj = {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": options.pv_name, "annotations": annotations},
            "spec": {
                "accessModes": list(spec.get("accessModes") or []),
                "capacity": {"storage": str(Quantity.from_int(capacity, Format.BINARY_SI))},
                "volumeMode": "Block" if block else "Filesystem",
                "csi": csi,
            },
        }
        if storage_class.get("mountOptions"):
            pv["spec"]["mountOptions"] = list(storage_class["mountOptions"])
        affinity = _node_affinity(volume.accessible_topology)
        if affinity is not None:
            pv["spec"]["nodeAffinity"] = affinity
        return to_model(pv, V1PersistentVolume)

    # -- data source protection -----------------------------------------------------------

    async def sweep_clone_protection(self) -> int:
        """Remove the cloning-protection finalizer from claims that no clone needs any more
        (upstream's CloningProtectionController): a finalizer left by a process that stopped
        mid-clone would otherwise block the source's deletion forever. A source is still
        needed while a clone of it is in flight here, or any claim naming it as dataSource is
        not yet Bound. Returns how many finalizers were removed."""
        claims = await self._claim_cache.list()
        pending = _pending_clone_sources(claims)

        async def still_needed(key: tuple[str, str]) -> bool:
            if key in pending:
                return True
            # The cache may not show a clone created a moment ago: confirm with the server.
            fresh = (await self._claims.list(key[0])).get("items") or []
            return key in _pending_clone_sources(fresh)

        return await self._clone_guard.sweep(claims, still_needed)

    async def sweep_snapshot_protection(self) -> int:
        """Remove the snapshot-source protection finalizer from VolumeSnapshots that no
        restore needs any more (upstream's SnapshotFinalizerController): none is in flight here
        and no claim naming the snapshot as its data source is still pending. Does nothing for
        a driver without CREATE_DELETE_SNAPSHOT, or when VolumeSnapshots cannot be listed (the
        snapshot CRDs are not installed, or RBAC does not allow it). Returns how many
        finalizers were removed."""
        if not self.supports_snapshot:
            return 0
        try:
            snapshots = (await self._snapshots.list()).get("items") or []
        except ApiException as err:
            if err.status in (403, 404):
                self._log.debug(
                    "cannot list VolumeSnapshots; snapshot-source protection sweep skipped",
                    error=f"{err.status} {err.reason}",
                )
                return 0
            raise
        if not any(
            SNAPSHOT_FINALIZER in ((o.get("metadata") or {}).get("finalizers") or [])
            for o in snapshots
        ):
            return 0
        pending = _pending_sources(await self._claim_cache.list(), SNAPSHOT_KIND)

        async def still_needed(key: tuple[str, str]) -> bool:
            if key in pending:
                return True
            fresh = (await self._claims.list(key[0])).get("items") or []
            return key in _pending_sources(fresh, SNAPSHOT_KIND)

        return await self._snapshot_guard.sweep(snapshots, still_needed)

    async def run_clone_protection(self, interval: float = 60.0) -> None:
        """Sweep stale cloning-protection and snapshot-source protection finalizers every
        ``interval`` seconds until cancelled (run it next to the controller)."""
        while True:
            for sweep in (self.sweep_clone_protection, self.sweep_snapshot_protection):
                try:
                    await sweep()
                except ApiException as err:
                    self._log.warning(
                        "data source protection sweep failed",
                        sweep=sweep.__name__,
                        error=f"{err.status} {err.reason}",
                    )
            await self.connection.clock.sleep(interval)

    # -- delete ---------------------------------------------------------------------------

    async def delete(self, volume: V1PersistentVolume) -> None:
        """DeleteVolume with the PV's volume handle and the provisioner secret."""
        pv = from_model(volume)
        metadata = pv.get("metadata") or {}
        pv_name = metadata.get("name", "")
        csi = (pv.get("spec") or {}).get("csi") or {}
        if not csi.get("volumeHandle"):
            raise ValueError(f"PV {pv_name} is not a CSI volume (no spec.csi.volumeHandle)")
        if csi.get("driver") != self.driver_name:
            raise IgnoredError(
                f"PV {pv_name} belongs to CSI driver {csi.get('driver')!r}, not {self.driver_name}"
            )
        attachments = await self._attachments.list()
        for attachment in attachments:
            source = (attachment.get("spec") or {}).get("source") or {}
            if source.get("persistentVolumeName") == pv_name:
                node = (attachment.get("spec") or {}).get("nodeName", "")
                raise RuntimeError(
                    f"persistentvolume {pv_name} is still attached to node {node}: "
                    "delete the VolumeAttachment (detach the volume) first"
                )
        ref = await self._deletion_secret(pv)
        secrets = await self._read_secret(ref) if ref else {}
        logger = self._log.bind(pv=pv_name, volume_id=csi["volumeHandle"])
        logger.info("calling DeleteVolume")
        await self.connection.delete_volume(
            v1.DeleteVolumeRequest(volume_id=csi["volumeHandle"], secrets=secrets)
        )
        logger.info("volume deleted")

    async def _deletion_secret(self, pv: Obj) -> SecretRef | None:
        annotations = (pv.get("metadata") or {}).get("annotations") or {}
        name = annotations.get(ANN_DELETION_SECRET_NAME)
        namespace = annotations.get(ANN_DELETION_SECRET_NAMESPACE)
        if name and namespace:
            return SecretRef(name, namespace)
        # Volumes provisioned before the annotations existed: resolve from the class, where
        # only ${pv.name} is available.
        class_name = (pv.get("spec") or {}).get("storageClassName")
        if not class_name:
            return None
        try:
            storage_class = await self._classes.get(class_name)
        except ApiException as err:
            if is_not_found(err):
                self._log.info(
                    "StorageClass of the PV is gone; deleting without secrets",
                    **{"class": class_name},
                )
                return None
            raise
        return secret_reference(
            PROVISIONER_SECRET,
            storage_class.get("parameters") or {},
            (pv.get("metadata") or {}).get("name", ""),
            None,
        )


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pyprovlib.csi.provisioner``: the external-provisioner sidecar."""
    from pyprovlib.csi._sidecar import main as sidecar_main

    return sidecar_main(argv)


if __name__ == "__main__":
    raise SystemExit(main())

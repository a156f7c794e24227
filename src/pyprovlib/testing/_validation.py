"""Defaulting, validation and immutability rules of kube-apiserver for the resources it serves.

Only what storage controllers and kubectl observe: the defaults they read back, the required
fields whose absence a real cluster answers with 422 Invalid, and the fields a real cluster
refuses to change.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Collection
from typing import Any

from pyprovlib.kube import resources as R
from pyprovlib.kube.quantity import parse_quantity
from pyprovlib.kube.resources import Resource
from pyprovlib.testing._status import ApiError, bad_request

__all__ = [
    "Cause",
    "default_on_create",
    "default_on_update",
    "type_check",
    "validate_create",
    "validate_name",
    "validate_status_update",
    "validate_update",
]

Cause = tuple[str, str, str]  # reason, message, field

_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used "
    "for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
_LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and "
    "must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex "
    "used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)

_BETA_CLASS_ANNOTATION = "volume.beta.kubernetes.io/storage-class"
_PV_SOURCES = (
    "gcePersistentDisk",
    "awsElasticBlockStore",
    "hostPath",
    "glusterfs",
    "nfs",
    "rbd",
    "iscsi",
    "cinder",
    "cephfs",
    "fc",
    "flocker",
    "flexVolume",
    "azureFile",
    "vsphereVolume",
    "quobyte",
    "azureDisk",
    "photonPersistentDisk",
    "portworxVolume",
    "scaleIO",
    "local",
    "storageos",
    "csi",
)


def _required(field: str, detail: str = "") -> Cause:
    return ("FieldValueRequired", "Required value" + (f": {detail}" if detail else ""), field)


def _invalid_value(field: str, value: Any, detail: str) -> Cause:
    shown = f'"{value}"' if isinstance(value, str) else str(value)
    return ("FieldValueInvalid", f"Invalid value: {shown}: {detail}", field)


def _forbidden(field: str, detail: str) -> Cause:
    return ("FieldValueForbidden", f"Forbidden: {detail}", field)


def _unsupported(field: str, value: Any, allowed: list[str]) -> Cause:
    options = ", ".join(f'"{a}"' for a in allowed)
    return (
        "FieldValueNotSupported",
        f'Unsupported value: "{value}": supported values: {options}',
        field,
    )


def validate_name(resource: Resource, name: str) -> list[Cause]:
    """DNS-1123 label for namespaces, DNS-1123 subdomain for everything else."""
    if resource is R.NAMESPACES:
        if len(name) > 63 or not _LABEL.match(name):
            return [_invalid_value("metadata.name", name, _LABEL_MSG)]
        return []
    if len(name) > 253 or not _SUBDOMAIN.match(name):
        return [_invalid_value("metadata.name", name, _SUBDOMAIN_MSG)]
    return []


def _meta_causes(resource: Resource, obj: dict[str, Any]) -> list[Cause]:
    meta = obj.get("metadata") or {}
    causes: list[Cause] = []
    name = meta.get("name") or ""
    if not name:
        causes.append(_required("metadata.name", "name or generateName is required"))
    else:
        causes.extend(validate_name(resource, name))
    return causes


# JSON types of the fields the server reads, as the Go structs declare them: a value of another
# type fails decoding with 400 BadRequest before validation runs.
_META_TYPES: dict[str, str] = {
    "name": "string",
    "generateName": "string",
    "namespace": "string",
    "uid": "string",
    "resourceVersion": "string",
    "labels": "map[string]string",
    "annotations": "map[string]string",
    "finalizers": "[]string",
    "ownerReferences": "[]object",
    "generation": "int64",
    "creationTimestamp": "string",
    "deletionTimestamp": "string",
}
_FIELD_TYPES: dict[Resource, dict[str, str]] = {
    R.PERSISTENT_VOLUME_CLAIMS: {
        "spec": "object",
        "spec.accessModes": "[]string",
        "spec.resources": "object",
        "spec.resources.requests": "map[string]quantity",
        "spec.storageClassName": "string",
        "spec.volumeName": "string",
        "spec.volumeMode": "string",
        "spec.selector": "object",
        "spec.dataSource": "object",
        "spec.dataSourceRef": "object",
        "status": "object",
        "status.phase": "string",
    },
    R.PERSISTENT_VOLUMES: {
        "spec": "object",
        "spec.capacity": "map[string]quantity",
        "spec.accessModes": "[]string",
        "spec.claimRef": "object",
        "spec.persistentVolumeReclaimPolicy": "string",
        "spec.storageClassName": "string",
        "spec.volumeMode": "string",
        "spec.mountOptions": "[]string",
        "spec.nodeAffinity": "object",
        "status": "object",
        "status.phase": "string",
        **{f"spec.{src}": "object" for src in _PV_SOURCES},
    },
    R.STORAGE_CLASSES: {
        "provisioner": "string",
        "parameters": "map[string]string",
        "reclaimPolicy": "string",
        "volumeBindingMode": "string",
        "allowVolumeExpansion": "bool",
        "mountOptions": "[]string",
        "allowedTopologies": "[]object",
    },
    R.VOLUME_ATTACHMENTS: {
        "spec": "object",
        "spec.attacher": "string",
        "spec.nodeName": "string",
        "spec.source": "object",
        "spec.source.persistentVolumeName": "string",
        "status": "object",
        "status.attached": "bool",
        "status.attachmentMetadata": "map[string]string",
    },
    R.LEASES: {
        "spec": "object",
        "spec.holderIdentity": "string",
        "spec.leaseDurationSeconds": "int32",
        "spec.acquireTime": "string",
        "spec.renewTime": "string",
        "spec.leaseTransitions": "int32",
    },
    R.CONFIGMAPS: {"data": "map[string]string", "binaryData": "map[string]string"},
    R.SECRETS: {"data": "map[string]string", "stringData": "map[string]string", "type": "string"},
    R.NAMESPACES: {"spec": "object", "status": "object"},
    R.NODES: {"spec": "object", "status": "object", "spec.unschedulable": "bool"},
    R.PODS: {
        "spec": "object",
        "status": "object",
        "spec.nodeName": "string",
        "spec.containers": "[]object",
        "spec.volumes": "[]object",
    },
    R.CSINODES: {"spec": "object", "spec.drivers": "[]object"},
    R.CSIDRIVERS: {"spec": "object"},
    R.EVENTS: {
        "involvedObject": "object",
        "reason": "string",
        "message": "string",
        "type": "string",
        "count": "int32",
    },
    R.EVENTS_V1: {"regarding": "object", "reason": "string", "note": "string", "type": "string"},
}


# The same tables as trees (key -> (type or None, children)), for the quick walk.
_Tree = dict[str, tuple[str | None, "dict[str, Any]"]]


def _build_tree(fields: dict[str, str]) -> _Tree:
    root: dict[str, list[Any]] = {}
    for path, want in fields.items():
        node = root
        *parents, leaf = path.split(".")
        for part in parents:
            node = node.setdefault(part, [None, {}])[1]
        node.setdefault(leaf, [None, {}])[0] = want

    def freeze(node: dict[str, list[Any]]) -> _Tree:
        return {k: (want, freeze(children)) for k, (want, children) in node.items()}

    return freeze(root)


_META_TREE = _build_tree({f"metadata.{k}": v for k, v in _META_TYPES.items()})
_FIELD_TREES: dict[Resource, _Tree] = {
    resource: _build_tree({**{f"metadata.{k}": v for k, v in _META_TYPES.items()}, **fields})
    for resource, fields in _FIELD_TYPES.items()
}


def _tree_ok(obj: dict[str, Any], tree: _Tree) -> bool:
    """Whether every field of ``tree`` present in ``obj`` has its type (and quantities parse)."""
    # Over the object's keys, not the tree's: a PV spec has a few of its thirty sources.
    for key, value in obj.items():
        node = tree.get(key)
        if node is None or value is None:
            continue
        want, children = node
        if want is not None:
            if not _type_ok(value, want):
                return False
            if want == "map[string]quantity" and not all(
                _quantity_ok(v) for v in value.values() if isinstance(v, str)
            ):
                return False
        if children and isinstance(value, dict) and not _tree_ok(value, children):
            return False
    return True


def _json_type(v: Any) -> str:
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    return "object"


def _type_ok(value: Any, want: str) -> bool:
    if want == "string":
        return isinstance(value, str)
    if want in ("int32", "int64"):
        return isinstance(value, int) and not isinstance(value, bool)
    if want == "bool":
        return isinstance(value, bool)
    if want == "object":
        return isinstance(value, dict)
    if want == "map[string]string":
        return isinstance(value, dict) and all(isinstance(v, str) for v in value.values())
    if want == "map[string]quantity":
        # resource.Quantity decodes from a JSON string or number
        return isinstance(value, dict) and all(
            isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in value.values()
        )
    if want == "[]string":
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    if want == "[]object":
        return isinstance(value, list) and all(isinstance(v, dict) for v in value)
    return True


def type_check(resource: Resource, obj: dict[str, Any]) -> None:
    """Reject JSON of the wrong type the way the server's decoder does (400 BadRequest)."""

    def fail(path: str, value: Any, want: str) -> ApiError:
        return bad_request(
            f'{resource.kind} in version "{resource.version}" cannot be handled as a '
            f"{resource.kind}: json: cannot unmarshal {_json_type(value)} into Go struct field "
            f"{resource.kind}.{path} of type {want}"
        )

    meta = obj.get("metadata")
    if meta is not None and not isinstance(meta, dict):
        raise fail("metadata", meta, "v1.ObjectMeta")
    # This runs on every write: first a quick walk of the fields present; only a body that
    # fails it gets the ordered scan below, which names the same first failure as always.
    if _tree_ok(obj, _FIELD_TREES.get(resource, _META_TREE)):
        return
    for key, want in _META_TYPES.items():
        value = (meta or {}).get(key)
        if value is not None and not _type_ok(value, want):
            raise fail(f"metadata.{key}", value, want)
    for path, want in _FIELD_TYPES.get(resource, {}).items():
        cur: Any = obj
        for part in path.split("."):
            cur = cur.get(part) if isinstance(cur, dict) else None
        if cur is not None and not _type_ok(cur, want):
            raise fail(path, cur, want)
        if cur is not None and want == "map[string]quantity":
            # resource.Quantity's decoder refuses a malformed string ("1Zi", "1gi", " 1Gi"):
            # the whole object is rejected before validation, as a 400.
            for value in cur.values():
                if isinstance(value, str) and not _quantity_ok(value):
                    raise bad_request(
                        f'{resource.kind} in version "{resource.version}" cannot be handled as '
                        f"a {resource.kind}: quantities must match the regular expression "
                        f"'{_QUANTITY_REGEXP}'"
                    )


_QUANTITY_REGEXP = "^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"


@functools.lru_cache(maxsize=1024)
def _quantity_ok(text: str) -> bool:
    # Cached: every write of a claim or volume checks the same few quantities.
    try:
        parse_quantity(text)
    except ValueError:
        return False
    return True


def _positive_quantity(value: Any) -> bool:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value > 0
    try:
        return isinstance(value, str) and parse_quantity(value).sign() > 0
    except ValueError:
        return False


CROSS_NAMESPACE_VOLUME_DATA_SOURCE = "CrossNamespaceVolumeDataSource"
"""The alpha feature gate letting a claim's dataSourceRef name another namespace (off by
default in kube-apiserver, and in :class:`~pyprovlib.testing.server.ApiServer`)."""


def default_on_create(
    resource: Resource, obj: dict[str, Any], gates: Collection[str] = frozenset()
) -> None:
    """Defaults and status resets the real registries apply when an object is created;
    ``gates``: the enabled alpha feature gates."""
    spec = obj.get("spec")
    if resource is R.PERSISTENT_VOLUME_CLAIMS:
        if isinstance(spec, dict):
            spec.setdefault("volumeMode", "Filesystem")
            _prepare_data_sources(spec, None, gates)
        obj["status"] = {"phase": "Pending"}
    elif resource is R.PERSISTENT_VOLUMES:
        if isinstance(spec, dict):
            spec.setdefault("persistentVolumeReclaimPolicy", "Retain")
            spec.setdefault("volumeMode", "Filesystem")
        obj["status"] = {"phase": "Pending"}
    elif resource is R.STORAGE_CLASSES:
        obj.setdefault("reclaimPolicy", "Delete")
        obj.setdefault("volumeBindingMode", "Immediate")
    elif resource is R.NAMESPACES:
        meta = obj.setdefault("metadata", {})
        labels = meta.get("labels") or {}
        labels["kubernetes.io/metadata.name"] = meta.get("name", "")
        meta["labels"] = labels
        obj["spec"] = {"finalizers": ["kubernetes"]}
        obj["status"] = {"phase": "Active"}
    elif resource is R.PODS:
        if isinstance(spec, dict):
            spec.setdefault("restartPolicy", "Always")
            spec.setdefault("dnsPolicy", "ClusterFirst")
            spec.setdefault("schedulerName", "default-scheduler")
            spec.setdefault("terminationGracePeriodSeconds", 30)
            spec.setdefault("securityContext", {})
        obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
    elif resource is R.SECRETS:
        obj.setdefault("type", "Opaque")
    elif resource is R.VOLUME_ATTACHMENTS:
        obj["status"] = {"attached": False}
    elif resource is R.CSIDRIVERS and isinstance(spec, dict):
        spec.setdefault("attachRequired", True)
        spec.setdefault("podInfoOnMount", False)
        spec.setdefault("requiresRepublish", False)
        spec.setdefault("storageCapacity", False)
        spec.setdefault("seLinuxMount", False)
        spec.setdefault("fsGroupPolicy", "ReadWriteOnceWithFSType")
        spec.setdefault("volumeLifecycleModes", ["Persistent"])
    elif resource is R.NODES:
        obj.setdefault("spec", {})
        obj.setdefault("status", {})
    elif resource in (R.VOLUME_SNAPSHOTS, R.VOLUME_SNAPSHOT_CONTENTS):
        # A CRD with the status subresource ignores the status of a create.
        obj.pop("status", None)


def default_on_update(
    resource: Resource,
    obj: dict[str, Any],
    old: dict[str, Any] | None = None,
    gates: Collection[str] = frozenset(),
) -> None:
    """What the registries' PrepareForUpdate fills in before an update is validated."""
    spec = obj.get("spec")
    if resource is R.PERSISTENT_VOLUME_CLAIMS and isinstance(spec, dict):
        old_spec = (old or {}).get("spec")
        _prepare_data_sources(spec, old_spec if isinstance(old_spec, dict) else {}, gates)


def _prepare_data_sources(
    spec: dict[str, Any], old_spec: dict[str, Any] | None, gates: Collection[str]
) -> None:
    """The claim strategy's PrepareForCreate/PrepareForUpdate for data sources, in upstream's
    order (pkg/api/persistentvolumeclaim): DropDisabledFields, then
    EnforceDataSourceBackwardsCompatibility, then NormalizeDataSources."""
    ref = spec.get("dataSourceRef")
    if (
        CROSS_NAMESPACE_VOLUME_DATA_SOURCE not in gates
        and isinstance(ref, dict)
        and ref.get("namespace")
    ):
        old_ref = (old_spec or {}).get("dataSourceRef")
        if not (isinstance(old_ref, dict) and old_ref.get("namespace")):
            del spec["dataSourceRef"]
    _enforce_data_source_backwards_compatibility(spec, old_spec)
    _normalize_data_sources(spec)
    # apiGroup has no omitempty in TypedLocalObjectReference / TypedObjectReference: a core
    # group reference comes back with "apiGroup": null.
    for key in ("dataSource", "dataSourceRef"):
        value = spec.get(key)
        if isinstance(value, dict):
            value.setdefault("apiGroup", None)


def _enforce_data_source_backwards_compatibility(
    spec: dict[str, Any], old_spec: dict[str, Any] | None
) -> None:
    """EnforceDataSourceBackwardsCompatibility (KEP 1495): on a create, or an update of a claim
    that had no data source, a ``dataSource`` given without ``dataSourceRef`` that is neither a
    claim (core group) nor a snapshot.storage.k8s.io VolumeSnapshot is dropped, as before
    dataSourceRef existed — any other source must come through dataSourceRef."""
    if old_spec is not None and (
        old_spec.get("dataSource") is not None or old_spec.get("dataSourceRef") is not None
    ):
        return
    if spec.get("dataSourceRef") is not None:
        return
    source = spec.get("dataSource")
    if not isinstance(source, dict):
        return  # absent, or for validation to refuse
    group = source.get("apiGroup") or ""
    if (source.get("kind"), group) in (
        ("PersistentVolumeClaim", ""),
        ("VolumeSnapshot", "snapshot.storage.k8s.io"),
    ):
        return
    del spec["dataSource"]


def _normalize_data_sources(spec: dict[str, Any]) -> None:
    """The claim's dataSource and dataSourceRef mirror each other (NormalizeDataSources):
    either one given alone fills the other, except a cross-namespace dataSourceRef."""
    source = spec.get("dataSource")
    ref = spec.get("dataSourceRef")
    if isinstance(source, dict) and ref is None:
        spec["dataSourceRef"] = {k: source.get(k) for k in ("apiGroup", "kind", "name")}
    elif isinstance(ref, dict) and source is None and not ref.get("namespace"):
        spec["dataSource"] = {k: ref.get(k) for k in ("apiGroup", "kind", "name")}


def _data_source_causes(spec: dict[str, Any]) -> list[Cause]:
    """validateDataSource / validateDataSourceRef of a claim's spec."""
    causes: list[Cause] = []
    for key in ("dataSource", "dataSourceRef"):
        ref = spec.get(key)
        if not isinstance(ref, dict):
            continue
        if not ref.get("name"):
            causes.append(_required(f"spec.{key}.name"))
        if not ref.get("kind"):
            causes.append(_required(f"spec.{key}.kind"))
        elif not ref.get("apiGroup") and ref["kind"] != "PersistentVolumeClaim":
            causes.append(
                _invalid_value(
                    f"spec.{key}",
                    ref["kind"],
                    "must be 'PersistentVolumeClaim' when referencing the default apiGroup",
                )
            )
        group = ref.get("apiGroup")
        if group and (len(group) > 253 or not _SUBDOMAIN.match(group)):
            causes.append(_invalid_value(f"spec.{key}.apiGroup", group, _SUBDOMAIN_MSG))
        if key == "dataSourceRef" and ref.get("namespace"):
            for msg in validate_name(R.NAMESPACES, ref["namespace"]):
                causes.append((msg[0], msg[1], "spec.dataSourceRef.namespace"))
    source = spec.get("dataSource")
    ref = spec.get("dataSourceRef")
    if isinstance(source, dict) and isinstance(ref, dict) and not ref.get("namespace"):
        same = all(source.get(k) == ref.get(k) for k in ("apiGroup", "kind", "name"))
        if not same:
            # field.Invalid(fldPath, fldPath.Child("dataSource"), ...): upstream passes the
            # path as the value, which prints as {}
            causes.append(
                ("FieldValueInvalid", "Invalid value: {}: must match dataSourceRef", "spec")
            )
    return causes


# --- the snapshot CRDs (kubernetes-csi/external-snapshotter, snapshot.storage.k8s.io/v1) ---
#
# A custom resource is decoded without a Go struct: a field of the wrong JSON type is not a 400
# but a schema violation (422), as are the required fields, the enums and the CEL rules
# (x-kubernetes-validations) of the CRDs' openAPIV3Schema, reduced here to what they check.

_CRD_TYPES: dict[Resource, dict[str, str]] = {
    R.VOLUME_SNAPSHOTS: {
        "spec": "object",
        "spec.source": "object",
        "spec.source.persistentVolumeClaimName": "string",
        "spec.source.volumeSnapshotContentName": "string",
        "spec.volumeSnapshotClassName": "string",
        "status": "object",
        "status.boundVolumeSnapshotContentName": "string",
        "status.creationTime": "string",
        "status.readyToUse": "boolean",
        "status.restoreSize": "quantity",
        "status.error": "object",
        "status.error.message": "string",
        "status.error.time": "string",
        "status.volumeGroupSnapshotName": "string",
    },
    R.VOLUME_SNAPSHOT_CONTENTS: {
        "spec": "object",
        "spec.deletionPolicy": "string",
        "spec.driver": "string",
        "spec.source": "object",
        "spec.source.snapshotHandle": "string",
        "spec.source.volumeHandle": "string",
        "spec.sourceVolumeMode": "string",
        "spec.volumeSnapshotClassName": "string",
        "spec.volumeSnapshotRef": "object",
        "spec.volumeSnapshotRef.apiVersion": "string",
        "spec.volumeSnapshotRef.kind": "string",
        "spec.volumeSnapshotRef.name": "string",
        "spec.volumeSnapshotRef.namespace": "string",
        "spec.volumeSnapshotRef.resourceVersion": "string",
        "spec.volumeSnapshotRef.uid": "string",
        "status": "object",
        "status.creationTime": "integer",
        "status.readyToUse": "boolean",
        "status.restoreSize": "size",
        "status.snapshotHandle": "string",
        "status.error": "object",
        "status.error.message": "string",
        "status.error.time": "string",
        "status.volumeGroupSnapshotHandle": "string",
    },
    R.VOLUME_SNAPSHOT_CLASSES: {
        "driver": "string",
        "deletionPolicy": "string",
        "parameters": "map",
    },
}
_CRD_REQUIRED: dict[Resource, tuple[str, ...]] = {
    R.VOLUME_SNAPSHOTS: ("spec", "spec.source"),
    R.VOLUME_SNAPSHOT_CONTENTS: (
        "spec",
        "spec.deletionPolicy",
        "spec.driver",
        "spec.source",
        "spec.volumeSnapshotRef",
    ),
    R.VOLUME_SNAPSHOT_CLASSES: ("deletionPolicy", "driver"),
}
_DELETION_POLICIES = ["Delete", "Retain"]
_RESTORE_SIZE_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
    r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
_RESTORE_SIZE = re.compile(_RESTORE_SIZE_PATTERN)
_MISSING = object()


def _lookup(obj: Any, path: str) -> Any:
    cur = obj
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return _MISSING
        cur = cur[part]
    return cur


def _schema_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _type_cause(path: str, value: Any, want: str) -> Cause:
    got = _schema_type(value)
    return (
        "FieldValueTypeInvalid",
        f'Invalid value: "{got}": {path} in body must be of type {want}: "{got}"',
        path,
    )


def _crd_value_causes(path: str, value: Any, want: str) -> list[Cause]:
    if want == "quantity":
        # x-kubernetes-int-or-string with the Quantity pattern
        if isinstance(value, int) and not isinstance(value, bool):
            return []
        if not isinstance(value, str):
            return [_type_cause(path, value, "integer-or-string")]
        if not _RESTORE_SIZE.match(value):
            return [
                _invalid_value(
                    path, value, f"{path} in body should match '{_RESTORE_SIZE_PATTERN}'"
                )
            ]
        return []
    if want in ("integer", "size"):
        if not isinstance(value, int) or isinstance(value, bool):
            return [_type_cause(path, value, "integer")]
        if want == "size" and value < 0:
            return [
                _invalid_value(path, value, f"{path} in body should be greater than or equal to 0")
            ]
        return []
    if want == "map":
        if not isinstance(value, dict):
            return [_type_cause(path, value, "object")]
        return [
            _type_cause(f"{path}.{k}", v, "string")
            for k, v in value.items()
            if not isinstance(v, str)
        ]
    if _schema_type(value) != want:
        return [_type_cause(path, value, want)]
    return []


def _crd_schema_causes(resource: Resource, obj: dict[str, Any], *, status: bool) -> list[Cause]:
    """Schema causes of a custom resource: of everything but ``status`` (``status=False``) or
    of ``status`` only."""
    causes: list[Cause] = []
    for path, want in _CRD_TYPES.get(resource, {}).items():
        if path.startswith("status") != status:
            continue
        value = _lookup(obj, path)
        if value is _MISSING:
            continue
        if value is None:
            # null for a field that is not nullable
            causes.append(_type_cause(path, value, "object" if want == "map" else want))
            continue
        causes.extend(_crd_value_causes(path, value, want))
    if status:
        return causes
    for path in _CRD_REQUIRED.get(resource, ()):
        parent, _, _leaf = path.rpartition(".")
        if parent and not isinstance(_lookup(obj, parent), dict):
            continue  # the parent is missing or reported already
        if _lookup(obj, path) is _MISSING:
            causes.append(_required(path))
    spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
    assert isinstance(spec, dict)
    if resource is R.VOLUME_SNAPSHOTS:
        source = spec.get("source")
        if isinstance(source, dict):
            given = [
                k for k in ("volumeSnapshotContentName", "persistentVolumeClaimName") if k in source
            ]
            if len(given) != 1:
                causes.append(
                    _invalid_value(
                        "spec.source",
                        "object",
                        "exactly one of volumeSnapshotContentName and persistentVolumeClaimName "
                        "must be set",
                    )
                )
        if spec.get("volumeSnapshotClassName") == "":
            causes.append(
                _invalid_value(
                    "spec.volumeSnapshotClassName",
                    "",
                    "volumeSnapshotClassName must not be the empty string when set",
                )
            )
    elif resource is R.VOLUME_SNAPSHOT_CONTENTS:
        policy = spec.get("deletionPolicy")
        if isinstance(policy, str) and policy not in _DELETION_POLICIES:
            causes.append(_unsupported("spec.deletionPolicy", policy, _DELETION_POLICIES))
        source = spec.get("source")
        if isinstance(source, dict):
            given = [k for k in ("volumeHandle", "snapshotHandle") if k in source]
            if len(given) != 1:
                causes.append(
                    _invalid_value(
                        "spec.source",
                        "object",
                        "exactly one of volumeHandle and snapshotHandle must be set",
                    )
                )
        ref = spec.get("volumeSnapshotRef")
        if isinstance(ref, dict) and not ("name" in ref and "namespace" in ref):
            causes.append(
                _invalid_value(
                    "spec.volumeSnapshotRef",
                    "object",
                    "both spec.volumeSnapshotRef.name and spec.volumeSnapshotRef.namespace "
                    "must be set",
                )
            )
        if spec.get("volumeSnapshotClassName") == "":
            causes.append(
                _invalid_value(
                    "spec.volumeSnapshotClassName",
                    "",
                    "volumeSnapshotClassName must not be the empty string when set",
                )
            )
    elif resource is R.VOLUME_SNAPSHOT_CLASSES:
        policy = obj.get("deletionPolicy")
        if isinstance(policy, str) and policy not in _DELETION_POLICIES:
            causes.append(_unsupported("deletionPolicy", policy, _DELETION_POLICIES))
    return causes


def _crd_immutable_causes(
    resource: Resource, old: dict[str, Any], new: dict[str, Any]
) -> list[Cause]:
    """The CRDs' transition rules: the snapshot's source, the content's source and
    sourceVolumeMode may not change."""
    if resource is R.VOLUME_SNAPSHOTS:
        fields = [
            ("spec.source.persistentVolumeClaimName", "persistentVolumeClaimName is immutable"),
            ("spec.source.volumeSnapshotContentName", "volumeSnapshotContentName is immutable"),
        ]
    elif resource is R.VOLUME_SNAPSHOT_CONTENTS:
        fields = [
            ("spec.source.volumeHandle", "Spec.Source.VolumeHandle is immutable"),
            ("spec.source.snapshotHandle", "Spec.Source.SnapshotHandle is immutable"),
            ("spec.sourceVolumeMode", "Spec.sourceVolumeMode is immutable"),
        ]
    else:
        return []
    causes: list[Cause] = []
    for path, message in fields:
        before, after = _lookup(old, path), _lookup(new, path)
        if before is not _MISSING and before != after:
            shown = "string" if isinstance(after, str) else _schema_type(after)
            causes.append(_invalid_value(path, shown, message))
    return causes


def validate_status_update(
    resource: Resource, old: dict[str, Any], new: dict[str, Any]
) -> list[Cause]:
    """A write to the status subresource: a custom resource's status is checked against the
    CRD's schema (the built-in registries' status rules are not modelled)."""
    if not resource.custom:
        return []
    return _crd_schema_causes(resource, new, status=True)


def _has_storage_request(spec: dict[str, Any]) -> bool:
    requests = (spec.get("resources") or {}).get("requests") or {}
    return isinstance(requests, dict) and bool(requests.get("storage"))


_ACCESS_MODES = ("ReadOnlyMany", "ReadWriteMany", "ReadWriteOnce", "ReadWriteOncePod")


def _access_mode_causes(spec: dict[str, Any]) -> list[Cause]:
    """ValidatePersistentVolume(Claim)Spec: known modes, ReadWriteOncePod alone."""
    causes: list[Cause] = []
    modes = spec.get("accessModes") or []
    if not isinstance(modes, list):
        return causes
    for mode in modes:
        if mode not in _ACCESS_MODES:
            causes.append(_unsupported("spec.accessModes", str(mode), list(_ACCESS_MODES)))
    if "ReadWriteOncePod" in modes and any(
        m in _ACCESS_MODES and m != "ReadWriteOncePod" for m in modes
    ):
        causes.append(
            _forbidden("spec.accessModes", "may not use ReadWriteOncePod with other access modes")
        )
    return causes


def _spec_causes(resource: Resource, obj: dict[str, Any]) -> list[Cause]:
    causes: list[Cause] = []
    spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
    assert isinstance(spec, dict)
    if resource is R.PERSISTENT_VOLUME_CLAIMS:
        if not spec.get("accessModes"):
            causes.append(_required("spec.accessModes", "at least 1 access mode is required"))
        causes.extend(_access_mode_causes(spec))
        if not _has_storage_request(spec):
            causes.append(_required("spec.resources[storage]"))
        else:
            storage = spec["resources"]["requests"]["storage"]
            if not _positive_quantity(storage):
                # ValidatePersistentVolumeClaimSpec: ValidatePositiveQuantityValue
                causes.append(
                    _invalid_value("spec.resources[storage]", storage, "must be greater than zero")
                )
        mode = spec.get("volumeMode")
        if mode not in (None, "Filesystem", "Block"):
            causes.append(_unsupported("spec.volumeMode", mode, ["Block", "Filesystem"]))
        causes.extend(_data_source_causes(spec))
    elif resource.custom:
        causes.extend(_crd_schema_causes(resource, obj, status=False))
    elif resource is R.PERSISTENT_VOLUMES:
        capacity = spec.get("capacity") or {}
        if not capacity:
            causes.append(_required("spec.capacity"))
        if "storage" not in capacity or len(capacity) > 1:
            causes.append(_unsupported("spec.capacity", ",".join(capacity), ["storage"]))
        if not spec.get("accessModes"):
            causes.append(_required("spec.accessModes"))
        causes.extend(_access_mode_causes(spec))
        sources = [s for s in _PV_SOURCES if spec.get(s) is not None]
        if not sources:
            causes.append(_required("spec", "must specify a volume type"))
        elif len(sources) > 1:
            causes.append(
                _forbidden("spec." + sources[1], "may not specify more than 1 volume type")
            )
        policy = spec.get("persistentVolumeReclaimPolicy")
        if policy not in (None, "Retain", "Delete", "Recycle"):
            causes.append(
                _unsupported(
                    "spec.persistentVolumeReclaimPolicy", policy, ["Delete", "Recycle", "Retain"]
                )
            )
    elif resource is R.STORAGE_CLASSES:
        if not obj.get("provisioner"):
            causes.append(_required("provisioner"))
        policy = obj.get("reclaimPolicy")
        if policy not in (None, "Retain", "Delete"):
            causes.append(_unsupported("reclaimPolicy", policy, ["Delete", "Retain"]))
        mode = obj.get("volumeBindingMode")
        if mode not in (None, "Immediate", "WaitForFirstConsumer"):
            causes.append(
                _unsupported("volumeBindingMode", mode, ["Immediate", "WaitForFirstConsumer"])
            )
    elif resource is R.VOLUME_ATTACHMENTS:
        if not spec.get("attacher"):
            causes.append(_required("spec.attacher"))
        if not spec.get("nodeName"):
            causes.append(_required("spec.nodeName"))
        source = spec.get("source") or {}
        count = sum(1 for k in ("persistentVolumeName", "inlineVolumeSpec") if source.get(k))
        if count != 1:
            causes.append(
                _required(
                    "spec.source",
                    "must specify exactly one of inlineVolumeSpec and persistentVolumeName",
                )
            )
    elif resource is R.LEASES:
        duration = spec.get("leaseDurationSeconds")
        if duration is not None and duration <= 0:
            causes.append(
                _invalid_value("spec.leaseDurationSeconds", duration, "must be greater than 0")
            )
        transitions = spec.get("leaseTransitions")
        if transitions is not None and transitions < 0:
            causes.append(
                _invalid_value(
                    "spec.leaseTransitions", transitions, "must be greater than or equal to 0"
                )
            )
    elif resource is R.PODS and not spec.get("containers"):
        causes.append(_required("spec.containers"))
    elif resource is R.CSINODES and not isinstance(spec.get("drivers"), list):
        causes.append(_required("spec.drivers"))
    return causes


def validate_create(resource: Resource, obj: dict[str, Any]) -> list[Cause]:
    """What a real cluster's create validation would reject, as Status causes."""
    return _meta_causes(resource, obj) + _spec_causes(resource, obj)


def validate_update(resource: Resource, old: dict[str, Any], new: dict[str, Any]) -> list[Cause]:
    """Create-time rules plus the immutability rules of update."""
    causes = _meta_causes(resource, new) + _spec_causes(resource, new)
    old_spec = old.get("spec") or {}
    new_spec = new.get("spec") or {}
    if resource.custom:
        causes += _crd_immutable_causes(resource, old, new)
    if resource is R.PERSISTENT_VOLUME_CLAIMS:
        a = _pvc_comparable(old_spec, old, new_spec)
        b = _pvc_comparable(new_spec, old, old_spec)
        if a != b:
            causes.append(
                _forbidden(
                    "spec",
                    "spec is immutable after creation except resources.requests and "
                    "volumeAttributesClassName for bound claims",
                )
            )
    elif resource is R.PERSISTENT_VOLUMES:
        for s in _PV_SOURCES:
            if old_spec.get(s) != new_spec.get(s):
                causes.append(
                    _forbidden(
                        "spec.persistentvolumesource",
                        "spec.persistentvolumesource is immutable after creation",
                    )
                )
                break
    elif resource is R.STORAGE_CLASSES:
        for field in ("parameters", "provisioner", "reclaimPolicy"):
            if old.get(field) != new.get(field):
                causes.append(_forbidden(field, f"updates to {field} are forbidden."))
        if old.get("volumeBindingMode") != new.get("volumeBindingMode"):
            causes.append(
                _invalid_value(
                    "volumeBindingMode", new.get("volumeBindingMode"), "field is immutable"
                )
            )
    elif resource is R.VOLUME_ATTACHMENTS and old_spec != new_spec:
        causes.append(_invalid_value("spec", "...", "field is immutable"))
    return causes


def _pvc_comparable(
    spec: dict[str, Any], old: dict[str, Any], other: dict[str, Any]
) -> dict[str, Any]:
    """The part of a claim's spec that may not change on update."""
    out = {k: v for k, v in spec.items() if k not in ("volumeAttributesClassName", "resources")}
    resources = dict(spec.get("resources") or {})
    if (old.get("status") or {}).get("phase") == "Bound":
        # a bound claim may be resized
        resources.pop("requests", None)
    out["resources"] = resources
    if not other.get("volumeName") or not spec.get("volumeName"):
        # binding sets volumeName once
        out.pop("volumeName", None)
    old_spec = old.get("spec") or {}
    beta = ((old.get("metadata") or {}).get("annotations") or {}).get(_BETA_CLASS_ANNOTATION)
    if old_spec.get("storageClassName") is None:
        new_class = spec.get("storageClassName") or other.get("storageClassName")
        if new_class and (beta is None or beta == new_class):
            # a retroactive default StorageClass may be set on a claim that had none
            out.pop("storageClassName", None)
    return out

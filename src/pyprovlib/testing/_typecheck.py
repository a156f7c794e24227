"""The JSON type check of request bodies: a field of the wrong JSON type fails the server's
decoding with 400 BadRequest before validation runs, as the Go structs declare the types."""

from __future__ import annotations

import functools
from typing import Any

from pyprovlib.kube import _resources as R
from pyprovlib.kube._quantity import parse_quantity
from pyprovlib.kube._resources import Resource
from pyprovlib.testing._status import ApiError, bad_request

__all__ = ["PV_SOURCES", "type_check"]

PV_SOURCES = (
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
"""The volume sources of a PersistentVolume spec (exactly one must be set)."""

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
        "spec.volumeAttributesClassName": "string",
        "status": "object",
        "status.phase": "string",
        "status.currentVolumeAttributesClassName": "string",
        "status.modifyVolumeStatus": "object",
        "status.modifyVolumeStatus.status": "string",
        "status.modifyVolumeStatus.targetVolumeAttributesClassName": "string",
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
        "spec.volumeAttributesClassName": "string",
        "status": "object",
        "status.phase": "string",
        **{f"spec.{src}": "object" for src in PV_SOURCES},
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
    R.VOLUME_ATTRIBUTES_CLASSES: {"driverName": "string", "parameters": "map[string]string"},
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
    R.CSI_STORAGE_CAPACITIES: {
        "storageClassName": "string",
        "nodeTopology": "object",
        "nodeTopology.matchLabels": "map[string]string",
        "nodeTopology.matchExpressions": "[]object",
        "capacity": "quantity",
        "maximumVolumeSize": "quantity",
    },
    R.DEPLOYMENTS: {
        "spec": "object",
        "spec.replicas": "int32",
        "spec.selector": "object",
        "spec.template": "object",
        "status": "object",
    },
    R.REPLICA_SETS: {
        "spec": "object",
        "spec.replicas": "int32",
        "spec.selector": "object",
        "spec.template": "object",
        "status": "object",
    },
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
            if want == "quantity" and isinstance(value, str) and not _quantity_ok(value):
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
    if want == "quantity":
        # resource.Quantity decodes from a JSON string or number
        return isinstance(value, (str, int, float)) and not isinstance(value, bool)
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
        if cur is None:
            continue
        if want == "quantity":
            # One quantity: a JSON value of another type fails as a malformed one does.
            if not _type_ok(cur, want) or (isinstance(cur, str) and not _quantity_ok(cur)):
                raise _malformed_quantity(resource)
            continue
        if not _type_ok(cur, want):
            raise fail(path, cur, want)
        if want == "map[string]quantity":
            # resource.Quantity's decoder refuses a malformed string ("1Zi", "1gi", " 1Gi"):
            # the whole object is rejected before validation, as a 400.
            for value in cur.values():
                if isinstance(value, str) and not _quantity_ok(value):
                    raise _malformed_quantity(resource)


def _malformed_quantity(resource: Resource) -> ApiError:
    return bad_request(
        f'{resource.kind} in version "{resource.version}" cannot be handled as a '
        f"{resource.kind}: quantities must match the regular expression '{_QUANTITY_REGEXP}'"
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

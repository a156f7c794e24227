"""Validation of the snapshot CRDs (kubernetes-csi/external-snapshotter,
snapshot.storage.k8s.io/v1) as kube-apiserver applies their openAPIV3Schema and CEL rules."""

from __future__ import annotations

import re
from typing import Any

from pyprovlib.kube import _resources as R
from pyprovlib.kube._resources import Resource
from pyprovlib.testing._causes import Cause, invalid_value, required, unsupported

__all__ = ["crd_immutable_causes", "crd_schema_causes"]

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
                invalid_value(path, value, f"{path} in body should match '{_RESTORE_SIZE_PATTERN}'")
            ]
        return []
    if want in ("integer", "size"):
        if not isinstance(value, int) or isinstance(value, bool):
            return [_type_cause(path, value, "integer")]
        if want == "size" and value < 0:
            return [
                invalid_value(path, value, f"{path} in body should be greater than or equal to 0")
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


def crd_schema_causes(resource: Resource, obj: dict[str, Any], *, status: bool) -> list[Cause]:
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
            causes.append(required(path))
    spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
    assert isinstance(spec, dict)
    if resource is R.VOLUME_SNAPSHOTS:
        causes += _one_source(spec, "volumeSnapshotContentName", "persistentVolumeClaimName")
        causes += _class_name_set(spec)
    elif resource is R.VOLUME_SNAPSHOT_CONTENTS:
        policy = spec.get("deletionPolicy")
        if isinstance(policy, str) and policy not in _DELETION_POLICIES:
            causes.append(unsupported("spec.deletionPolicy", policy, _DELETION_POLICIES))
        causes += _one_source(spec, "volumeHandle", "snapshotHandle")
        ref = spec.get("volumeSnapshotRef")
        if isinstance(ref, dict) and not ("name" in ref and "namespace" in ref):
            causes.append(
                invalid_value(
                    "spec.volumeSnapshotRef",
                    "object",
                    "both spec.volumeSnapshotRef.name and spec.volumeSnapshotRef.namespace "
                    "must be set",
                )
            )
        causes += _class_name_set(spec)
    elif resource is R.VOLUME_SNAPSHOT_CLASSES:
        policy = obj.get("deletionPolicy")
        if isinstance(policy, str) and policy not in _DELETION_POLICIES:
            causes.append(unsupported("deletionPolicy", policy, _DELETION_POLICIES))
    return causes


def _one_source(spec: dict[str, Any], first: str, second: str) -> list[Cause]:
    """The CRD's rule that ``spec.source`` names exactly one of two sources."""
    source = spec.get("source")
    if not isinstance(source, dict) or (first in source) != (second in source):
        return []
    return [
        invalid_value("spec.source", "object", f"exactly one of {first} and {second} must be set")
    ]


def _class_name_set(spec: dict[str, Any]) -> list[Cause]:
    """The CRD's rule that ``spec.volumeSnapshotClassName``, when set, is not empty."""
    if spec.get("volumeSnapshotClassName") != "":
        return []
    return [
        invalid_value(
            "spec.volumeSnapshotClassName",
            "",
            "volumeSnapshotClassName must not be the empty string when set",
        )
    ]


def crd_immutable_causes(
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
            causes.append(invalid_value(path, shown, message))
    return causes

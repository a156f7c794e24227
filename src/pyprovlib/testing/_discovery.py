"""What clients discover before they talk to resources: /version, /api, /apis, the
APIResourceLists, a minimal OpenAPI v3 (enough for kubectl's server-side field validation
check), and the meta.k8s.io/v1 Table rendering that ``kubectl get`` asks for.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

from pyprovlib.kube import _resources as R
from pyprovlib.kube._objects import Obj
from pyprovlib.kube._resources import RESOURCES, Resource

__all__ = [
    "api_group",
    "api_group_list",
    "api_versions",
    "openapi_v3_document",
    "openapi_v3_root",
    "resource_list",
    "to_table",
    "version_info",
]


KUBE_VERSION = ("1", "34")
_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]


def version_info() -> Obj:
    """The /version body."""
    major, minor = KUBE_VERSION
    return {
        "major": major,
        "minor": minor,
        "gitVersion": f"v{major}.{minor}.0",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.24.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    }


def api_versions(server_address: str) -> Obj:
    """The /api body."""
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [
            {"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}
        ],
    }


def _groups() -> list[str]:
    out: list[str] = []
    for r in RESOURCES:
        if r.group and r.group not in out:
            out.append(r.group)
    return out


def api_group(group: str) -> Obj | None:
    """The /apis/<group> body, or None for an unknown group."""
    if group not in _groups():
        return None
    gv = {"groupVersion": f"{group}/v1", "version": "v1"}
    return {
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": group,
        "versions": [gv],
        "preferredVersion": gv,
    }


def api_group_list() -> Obj:
    """The /apis body."""
    groups = [api_group(g) for g in _groups()]
    for g in groups:
        assert g is not None
        g.pop("kind")
        g.pop("apiVersion")
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def resource_list(group_version: str) -> Obj | None:
    """The APIResourceList of /api/v1 or /apis/<group>/<version>, or None when unknown."""
    members = [r for r in RESOURCES if r.api_version == group_version]
    if not members:
        return None
    out: list[Obj] = []
    for r in members:
        verbs = list(_VERBS)
        if r is R.NAMESPACES:
            verbs.remove("deletecollection")
        entry: Obj = {
            "name": r.plural,
            "singularName": r.singular or r.kind.lower(),
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": verbs,
        }
        if r.short_names:
            entry["shortNames"] = list(r.short_names)
        if r in (R.PODS, R.DEPLOYMENTS, R.REPLICA_SETS):
            entry["categories"] = ["all"]
        entry["storageVersionHash"] = hashlib.sha256(r.plural.encode()).hexdigest()[:12]
        out.append(entry)
        for sub in r.subresources:
            out.append(
                {
                    "name": f"{r.plural}/{sub}",
                    "singularName": "",
                    "namespaced": r.namespaced,
                    "kind": r.kind,
                    "verbs": ["get", "patch", "update"],
                }
            )
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": out,
    }


# --- OpenAPI v3 -----------------------------------------------------------------------------


def _gv_path(group_version: str) -> str:
    return "api/v1" if group_version == "v1" else f"apis/{group_version}"


def openapi_v3_document(gv_path: str) -> Obj | None:
    """A minimal OpenAPI v3 document for one group-version: every object path with its
    operations, each tagged with ``x-kubernetes-group-version-kind`` and accepting
    ``fieldValidation`` (which is what kubectl checks to rely on server-side validation)."""
    members = [r for r in RESOURCES if _gv_path(r.api_version) == gv_path]
    if not members:
        return None
    paths: Obj = {}
    schemas: Obj = {}
    for r in members:
        gvk = {"group": r.group, "version": r.version, "kind": r.kind}
        if r.custom:
            # a CRD's schema is named after its group reversed, as kube-apiserver publishes it
            schema_name = ".".join([*reversed(r.group.split(".")), r.version, r.kind])
        else:
            schema_name = f"io.k8s.api.{(r.group or 'core').split('.')[0]}.{r.version}.{r.kind}"
        schemas[schema_name] = {
            "type": "object",
            "description": f"{r.kind} of {r.api_version}",
            "properties": {
                "apiVersion": {"type": "string"},
                "kind": {"type": "string"},
                "metadata": {"type": "object"},
            },
            "x-kubernetes-group-version-kind": [gvk],
        }
        ref = {"$ref": f"#/components/schemas/{schema_name}"}
        params = [
            {"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": True}},
            {
                "name": "fieldManager",
                "in": "query",
                "schema": {"type": "string", "uniqueItems": True},
            },
            {
                "name": "fieldValidation",
                "in": "query",
                "schema": {"type": "string", "uniqueItems": True},
            },
        ]

        def op(action: str, gvk: Obj = gvk, params: list[Obj] = params, ref: Obj = ref) -> Obj:
            return {
                "operationId": f"{action}{gvk['kind']}",
                "parameters": list(params) if action in ("post", "put", "patch") else [],
                "responses": {
                    "200": {"description": "OK", "content": {"application/json": {"schema": ref}}}
                },
                "x-kubernetes-action": action,
                "x-kubernetes-group-version-kind": gvk,
            }

        base = "/" + gv_path
        collection = (
            f"{base}/namespaces/{{namespace}}/{r.plural}" if r.namespaced else f"{base}/{r.plural}"
        )
        paths[collection] = {
            "get": op("list"),
            "post": op("post"),
            "delete": op("deletecollection"),
        }
        paths[f"{collection}/{{name}}"] = {
            "get": op("get"),
            "put": op("put"),
            "patch": op("patch"),
            "delete": op("delete"),
        }
        for sub in r.subresources:
            paths[f"{collection}/{{name}}/{sub}"] = {
                "get": op("get"),
                "put": op("put"),
                "patch": op("patch"),
            }
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v" + ".".join(KUBE_VERSION)},
        "paths": paths,
        "components": {"schemas": schemas},
    }


def openapi_v3_root() -> Obj:
    """The /openapi/v3 index: one entry per group-version with a content hash."""
    out: Obj = {}
    for gv in sorted({_gv_path(r.api_version) for r in RESOURCES}):
        doc = openapi_v3_document(gv)
        digest = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:32].upper()
        out[gv] = {"serverRelativeURL": f"/openapi/v3/{gv}?hash={digest}"}
    return {"paths": out}


# --- Table ----------------------------------------------------------------------------------


def human_duration(seconds: float) -> str:
    """kubectl's HumanDuration: 45s, 5m10s, 3h20m, 4d, 2y10d."""
    s = int(seconds)
    if s < 0:
        return "<invalid>"
    if s < 120:
        return f"{s}s"
    m = s // 60
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if m < 180:
        return f"{m}m"
    h = m // 60
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    if h < 24 * 8:
        return f"{h // 24}d{h % 24}h" if h % 24 else f"{h // 24}d"
    if h < 24 * 365 * 2:
        return f"{h // 24}d"
    y = h // (24 * 365)
    return f"{y}y{(h % (24 * 365)) // 24}d" if y < 8 else f"{y}y"


def _age(obj: Obj, now: datetime) -> str:
    ts = (obj.get("metadata") or {}).get("creationTimestamp")
    if not ts:
        return "<unknown>"
    try:
        created = datetime.fromisoformat(str(ts).replace("Z", "+00:00"))
    except ValueError:
        return "<unknown>"
    return human_duration((now - created).total_seconds())


_MODES = {
    "ReadWriteOnce": "RWO",
    "ReadOnlyMany": "ROX",
    "ReadWriteMany": "RWX",
    "ReadWriteOncePod": "RWOP",
}


def _modes(modes: Any) -> str:
    return ",".join(_MODES.get(m, m) for m in modes or [])


def _col(
    name: str, description: str = "", priority: int = 0, fmt: str = "", typ: str = "string"
) -> Obj:
    return {
        "name": name,
        "type": typ,
        "format": fmt,
        "description": description,
        "priority": priority,
    }


_NAME = _col("Name", "Name must be unique within a namespace.", fmt="name")
_AGE = _col(
    "Age",
    "CreationTimestamp is a timestamp representing the server time when this object was created.",
)
_WIDE = 1
"""The priority of the columns kubectl prints only with ``-o wide``."""


def _strings(*names: str) -> list[Obj]:
    return [_col(n) for n in names]


# The built-in tables' columns after Name, in kubectl's order (the cells come from _cells).
_BUILTIN_COLUMNS: dict[Resource, list[Obj]] = {
    R.PERSISTENT_VOLUMES: [
        *_strings(
            "Capacity",
            "Access Modes",
            "Reclaim Policy",
            "Status",
            "Claim",
            "StorageClass",
            "VolumeAttributesClass",
            "Reason",
        ),
        _AGE,
        _col("VolumeMode", priority=_WIDE),
    ],
    R.PERSISTENT_VOLUME_CLAIMS: [
        *_strings(
            "Status", "Volume", "Capacity", "Access Modes", "StorageClass", "VolumeAttributesClass"
        ),
        _AGE,
        _col("VolumeMode", priority=_WIDE),
    ],
    R.STORAGE_CLASSES: [
        *_strings("Provisioner", "ReclaimPolicy", "VolumeBindingMode", "AllowVolumeExpansion"),
        _AGE,
    ],
    R.VOLUME_ATTRIBUTES_CLASSES: [
        _col("DriverName", "Name of the CSI driver This field is immutable."),
        _AGE,
    ],
    R.NAMESPACES: [_col("Status"), _AGE],
    R.NODES: [_col("Status"), _col("Roles"), _AGE, _col("Version")],
    R.PODS: [
        *_strings("Ready", "Status", "Restarts"),
        _AGE,
        _col("IP", priority=_WIDE),
        _col("Node", priority=_WIDE),
    ],
    R.VOLUME_ATTACHMENTS: [*_strings("Attacher", "PV", "Node", "Attached"), _AGE],
    R.SECRETS: [_col("Type"), _col("Data", typ="integer"), _AGE],
    R.CONFIGMAPS: [_col("Data", typ="integer"), _AGE],
    R.LEASES: [_col("Holder"), _AGE],
    R.CSINODES: [_col("Drivers", typ="integer"), _AGE],
    # No printer of its own: the registry's default table (Name, Created At).
    R.CSI_STORAGE_CAPACITIES: [
        _col(
            "Created At",
            "CreationTimestamp is a timestamp representing the server time when this object was "
            "created.",
            typ="date",
        )
    ],
    R.DEPLOYMENTS: [
        *_strings("Ready", "Up-to-date", "Available"),
        _AGE,
        _col("Containers", priority=_WIDE),
        _col("Images", priority=_WIDE),
        _col("Selector", priority=_WIDE),
    ],
    R.REPLICA_SETS: [
        _col("Desired", typ="integer"),
        _col("Current", typ="integer"),
        _col("Ready", typ="integer"),
        _AGE,
        _col("Containers", priority=_WIDE),
        _col("Images", priority=_WIDE),
        _col("Selector", priority=_WIDE),
    ],
}


def _columns(resource: Resource) -> list[Obj]:
    if resource.custom:
        return [_NAME, *_CRD_COLUMNS[resource], _col("Age", typ="date")]
    return [_NAME, *_BUILTIN_COLUMNS.get(resource, [_AGE])]


# The additionalPrinterColumns of external-snapshotter's CRDs: (name, type, JSON path), after
# Name and before Age.
_CRD_PRINTER_COLUMNS: dict[Resource, tuple[tuple[str, str, str], ...]] = {
    R.VOLUME_SNAPSHOTS: (
        ("ReadyToUse", "boolean", "status.readyToUse"),
        ("SourcePVC", "string", "spec.source.persistentVolumeClaimName"),
        ("SourceSnapshotContent", "string", "spec.source.volumeSnapshotContentName"),
        ("RestoreSize", "string", "status.restoreSize"),
        ("SnapshotClass", "string", "spec.volumeSnapshotClassName"),
        ("SnapshotContent", "string", "status.boundVolumeSnapshotContentName"),
        ("CreationTime", "date", "status.creationTime"),
    ),
    R.VOLUME_SNAPSHOT_CONTENTS: (
        ("ReadyToUse", "boolean", "status.readyToUse"),
        ("RestoreSize", "integer", "status.restoreSize"),
        ("DeletionPolicy", "string", "spec.deletionPolicy"),
        ("Driver", "string", "spec.driver"),
        ("VolumeSnapshotClass", "string", "spec.volumeSnapshotClassName"),
        ("VolumeSnapshot", "string", "spec.volumeSnapshotRef.name"),
        ("VolumeSnapshotNamespace", "string", "spec.volumeSnapshotRef.namespace"),
    ),
    R.VOLUME_SNAPSHOT_CLASSES: (
        ("Driver", "string", "driver"),
        ("DeletionPolicy", "string", "deletionPolicy"),
    ),
}
_CRD_COLUMNS: dict[Resource, list[Obj]] = {
    r: [_col(n, typ=t, fmt="date-time" if t == "date" else "") for n, t, _p in columns]
    for r, columns in _CRD_PRINTER_COLUMNS.items()
}


def _crd_cell(obj: Obj, path: str, typ: str, now: datetime) -> Any:
    """One printer-column cell: None when the field is absent (kubectl prints <none>), a
    ``date`` as the time since it."""
    cur: Any = obj
    for part in path.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    if cur is None:
        return None
    if typ == "date":
        try:
            when = datetime.fromisoformat(str(cur).replace("Z", "+00:00"))
        except ValueError:
            return None
        return human_duration((now - when).total_seconds())
    return cur


def _parts(obj: Obj) -> tuple[Obj, Obj, Obj]:
    return obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}


def _volume_cells(obj: Obj, age: str) -> list[Any]:
    meta, spec, status = _parts(obj)
    ref = spec.get("claimRef") or {}
    claim = f"{ref.get('namespace', '')}/{ref.get('name', '')}" if ref else ""
    phase = status.get("phase", "")
    if meta.get("deletionTimestamp"):
        phase = "Terminating"
    return [
        meta.get("name", ""),
        (spec.get("capacity") or {}).get("storage", ""),
        _modes(spec.get("accessModes")),
        spec.get("persistentVolumeReclaimPolicy", ""),
        phase,
        claim,
        spec.get("storageClassName", ""),
        spec.get("volumeAttributesClassName") or "<unset>",
        status.get("reason", ""),
        age,
        spec.get("volumeMode", ""),
    ]


def _claim_cells(obj: Obj, age: str) -> list[Any]:
    meta, spec, status = _parts(obj)
    phase = "Terminating" if meta.get("deletionTimestamp") else status.get("phase", "")
    return [
        meta.get("name", ""),
        phase,
        spec.get("volumeName", ""),
        (status.get("capacity") or {}).get("storage", ""),
        _modes(status.get("accessModes")),
        spec.get("storageClassName") or "",
        spec.get("volumeAttributesClassName") or "<unset>",
        age,
        spec.get("volumeMode", ""),
    ]


def _class_cells(obj: Obj, age: str) -> list[Any]:
    meta = obj.get("metadata") or {}
    name = meta.get("name", "")
    annotations = meta.get("annotations") or {}
    shown = name
    if "true" in (
        annotations.get("storageclass.kubernetes.io/is-default-class"),
        annotations.get("storageclass.beta.kubernetes.io/is-default-class"),
    ):
        shown = f"{name} (default)"
    return [
        shown,
        obj.get("provisioner", ""),
        obj.get("reclaimPolicy", ""),
        obj.get("volumeBindingMode", ""),
        bool(obj.get("allowVolumeExpansion", False)),
        age,
    ]


def _node_cells(obj: Obj, age: str) -> list[Any]:
    meta, spec, status = _parts(obj)
    ready = "Unknown"
    for c in status.get("conditions") or []:
        if c.get("type") == "Ready":
            ready = "Ready" if c.get("status") == "True" else "NotReady"
    if spec.get("unschedulable"):
        ready += ",SchedulingDisabled"
    roles = sorted(
        k.split("/", 1)[1]
        for k in meta.get("labels") or {}
        if k.startswith("node-role.kubernetes.io/")
    )
    version = (status.get("nodeInfo") or {}).get("kubeletVersion", "")
    return [meta.get("name", ""), ready, ",".join(roles) or "<none>", age, version]


def _pod_cells(obj: Obj, age: str) -> list[Any]:
    meta, spec, status = _parts(obj)
    statuses = status.get("containerStatuses") or []
    ready_count = sum(1 for c in statuses if c.get("ready"))
    total = len(spec.get("containers") or [])
    restarts = sum(int(c.get("restartCount") or 0) for c in statuses)
    phase = "Terminating" if meta.get("deletionTimestamp") else status.get("phase", "")
    return [
        meta.get("name", ""),
        f"{ready_count}/{total}",
        phase,
        str(restarts),
        age,
        status.get("podIP") or "<none>",
        spec.get("nodeName") or "<none>",
    ]


def _attachment_cells(obj: Obj, age: str) -> list[Any]:
    meta, spec, status = _parts(obj)
    return [
        meta.get("name", ""),
        spec.get("attacher", ""),
        (spec.get("source") or {}).get("persistentVolumeName", ""),
        spec.get("nodeName", ""),
        bool(status.get("attached", False)),
        age,
    ]


def _name(obj: Obj) -> Any:
    return (obj.get("metadata") or {}).get("name", "")


# kubectl's columns of each built-in kind this server serves (the name and age included).
def _selector_text(selector: Any) -> str:
    """A label selector as kubectl prints it (``app=x,tier in (a,b)``)."""
    if not isinstance(selector, dict):
        return "<none>"
    parts = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for expression in selector.get("matchExpressions") or []:
        key, op = expression.get("key", ""), expression.get("operator", "")
        values = ",".join(sorted(expression.get("values") or []))
        if op == "Exists":
            parts.append(key)
        elif op == "DoesNotExist":
            parts.append(f"!{key}")
        else:
            parts.append(f"{key} {'in' if op == 'In' else 'notin'} ({values})")
    return ",".join(parts) or "<none>"


def _workload_wide(spec: Obj) -> list[str]:
    pod_spec = (spec.get("template") or {}).get("spec") or {}
    containers = [c for c in pod_spec.get("containers") or [] if isinstance(c, dict)]
    return [
        ",".join(str(c.get("name", "")) for c in containers),
        ",".join(str(c.get("image", "")) for c in containers),
        _selector_text(spec.get("selector")),
    ]


def _deployment_cells(obj: Obj, age: str) -> list[Any]:
    meta, spec, status = _parts(obj)
    return [
        meta.get("name", ""),
        f"{status.get('readyReplicas', 0)}/{spec.get('replicas', 1)}",
        status.get("updatedReplicas", 0),
        status.get("availableReplicas", 0),
        age,
        *_workload_wide(spec),
    ]


def _replica_set_cells(obj: Obj, age: str) -> list[Any]:
    meta, spec, status = _parts(obj)
    return [
        meta.get("name", ""),
        spec.get("replicas", 1),
        status.get("replicas", 0),
        status.get("readyReplicas", 0),
        age,
        *_workload_wide(spec),
    ]


_CELLS: dict[Resource, Callable[[Obj, str], list[Any]]] = {
    R.CSI_STORAGE_CAPACITIES: lambda o, _age: [
        _name(o),
        (o.get("metadata") or {}).get("creationTimestamp"),
    ],
    R.DEPLOYMENTS: _deployment_cells,
    R.REPLICA_SETS: _replica_set_cells,
    R.PERSISTENT_VOLUMES: _volume_cells,
    R.PERSISTENT_VOLUME_CLAIMS: _claim_cells,
    R.STORAGE_CLASSES: _class_cells,
    R.VOLUME_ATTRIBUTES_CLASSES: lambda o, age: [_name(o), o.get("driverName", ""), age],
    R.NAMESPACES: lambda o, age: [_name(o), (o.get("status") or {}).get("phase", ""), age],
    R.NODES: _node_cells,
    R.PODS: _pod_cells,
    R.VOLUME_ATTACHMENTS: _attachment_cells,
    R.SECRETS: lambda o, age: [
        _name(o),
        o.get("type", ""),
        len(o.get("data") or {}) + len(o.get("stringData") or {}),
        age,
    ],
    R.CONFIGMAPS: lambda o, age: [
        _name(o),
        len(o.get("data") or {}) + len(o.get("binaryData") or {}),
        age,
    ],
    R.LEASES: lambda o, age: [
        _name(o),
        (o.get("spec") or {}).get("holderIdentity") or "",
        age,
    ],
    R.CSINODES: lambda o, age: [_name(o), len((o.get("spec") or {}).get("drivers") or []), age],
}


def _cells(resource: Resource, obj: Obj, now: datetime) -> list[Any]:
    age = _age(obj, now)
    cells = _CELLS.get(resource)
    if cells is not None:
        return cells(obj, age)
    if resource.custom:
        return [
            _name(obj),
            *(_crd_cell(obj, p, t, now) for _n, t, p in _CRD_PRINTER_COLUMNS[resource]),
            age,
        ]
    return [_name(obj), age]


def table_row(resource: Resource, obj: Obj, now: datetime, include: str) -> Obj:
    """One Table row; ``include`` is the includeObject policy (None, Metadata, Object)."""
    row: Obj = {"cells": _cells(resource, obj, now)}
    if include == "Object":
        row["object"] = obj
    elif include != "None":
        row["object"] = {
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": obj.get("metadata") or {},
        }
    return row


def to_table(
    resource: Resource,
    items: list[Obj],
    now: datetime,
    include: str,
    list_meta: Obj,
    *,
    with_columns: bool = True,
) -> Obj:
    """A meta.k8s.io/v1 Table of ``items`` (column definitions omitted for watch events
    after the first, as the real server does when asked)."""
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list_meta,
        "columnDefinitions": _columns(resource) if with_columns else [],
        "rows": [table_row(resource, o, now, include) for o in items],
    }

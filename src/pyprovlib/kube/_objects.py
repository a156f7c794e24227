"""Small helpers over the JSON dicts of Kubernetes objects: keys, names, metadata, annotations,
finalizers. They never convert to kubernetes-asyncio models."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = [
    "Obj",
    "annotations_of",
    "as_mapping",
    "finalizers_of",
    "has_finalizer",
    "is_deleting",
    "is_dns1123_label",
    "is_dns1123_subdomain",
    "labels_of",
    "mapping_field",
    "meta",
    "meta_namespace_key",
    "name_of",
    "namespace_of",
    "resource_version",
    "spec_of",
    "split_key",
    "status_of",
    "uid_of",
]

Obj = dict[str, Any]
"""A Kubernetes object as decoded from the wire's JSON."""


_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)


def is_dns1123_label(value: str) -> bool:
    """apimachinery's ``IsDNS1123Label`` passes: at most 63 lowercase alphanumerics or '-',
    starting and ending alphanumeric (namespace names)."""
    return len(value) <= 63 and _DNS1123_LABEL.match(value) is not None


def is_dns1123_subdomain(value: str) -> bool:
    """apimachinery's ``IsDNS1123Subdomain`` passes: at most 253 characters of DNS-1123 labels
    joined by dots (most object names, API groups, label key prefixes)."""
    return len(value) <= 253 and _DNS1123_SUBDOMAIN.match(value) is not None


def as_mapping(value: Any) -> Mapping[str, Any]:
    """``value`` when it is a mapping, else {}: a field of decoded JSON read without trusting
    its type."""
    # ``type(x) is dict`` first: decoded JSON is always a plain dict, and the ABC check costs
    # ~1 µs, paid several times per watch event.
    return value if (type(value) is dict or isinstance(value, Mapping)) else {}


def mapping_field(obj: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    """``obj[key]`` when it is a mapping; {} when missing or anything else."""
    return as_mapping(obj.get(key))


def meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """The object's ``metadata`` ({} when missing or not a mapping)."""
    return mapping_field(obj, "metadata")


def spec_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """The object's ``spec`` ({} when missing or not a mapping)."""
    return mapping_field(obj, "spec")


def status_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """The object's ``status`` ({} when missing or not a mapping)."""
    return mapping_field(obj, "status")


def is_deleting(obj: Mapping[str, Any]) -> bool:
    """Whether the object has a ``metadata.deletionTimestamp`` (being deleted; finalizers hold
    it), as Go's ``DeletionTimestamp != nil``: present counts, whatever its value."""
    return meta(obj).get("deletionTimestamp") is not None


def name_of(obj: Mapping[str, Any]) -> str:
    """``metadata.name`` ('' when missing)."""
    return str(meta(obj).get("name") or "")


def namespace_of(obj: Mapping[str, Any]) -> str:
    """``metadata.namespace`` ('' for cluster-scoped objects)."""
    return str(meta(obj).get("namespace") or "")


def uid_of(obj: Mapping[str, Any]) -> str:
    """``metadata.uid`` ('' before the server assigned one)."""
    return str(meta(obj).get("uid") or "")


def resource_version(obj: Mapping[str, Any]) -> str:
    """``metadata.resourceVersion``, the opaque version for optimistic concurrency."""
    return str(meta(obj).get("resourceVersion") or "")


def annotations_of(obj: Mapping[str, Any]) -> Mapping[str, str]:
    """``metadata.annotations`` ({} when missing)."""
    return mapping_field(meta(obj), "annotations")


def labels_of(obj: Mapping[str, Any]) -> Mapping[str, str]:
    """``metadata.labels`` ({} when missing)."""
    return mapping_field(meta(obj), "labels")


def finalizers_of(obj: Mapping[str, Any]) -> list[str]:
    """``metadata.finalizers`` (the string entries; [] when missing)."""
    f = meta(obj).get("finalizers")
    return [x for x in f if isinstance(x, str)] if isinstance(f, list) else []


def has_finalizer(obj: Mapping[str, Any], finalizer: str) -> bool:
    """True when ``finalizer`` is among the object's finalizers."""
    return finalizer in finalizers_of(obj)


def meta_namespace_key(obj: Mapping[str, Any]) -> str:
    """client-go's ``MetaNamespaceKeyFunc``: ``namespace/name``, or ``name`` when cluster-scoped."""
    ns, name = namespace_of(obj), name_of(obj)
    if not name:
        raise ValueError("object has no metadata.name; it cannot be keyed")
    return f"{ns}/{name}" if ns else name


def split_key(key: str) -> tuple[str, str]:
    """Inverse of :func:`meta_namespace_key`: ``(namespace, name)``, namespace '' when
    cluster-scoped. Raises ``ValueError`` on a key with more than one ``/``."""
    parts = key.split("/")
    if len(parts) == 1:
        return "", parts[0]
    if len(parts) == 2:
        return parts[0], parts[1]
    raise ValueError(f"unexpected key format: {key!r}")

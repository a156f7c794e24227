"""References to objects (client-go's ``tools/reference``): the ``ObjectReference`` an Event
names as its involved object, from a JSON dict or a kubernetes-asyncio model."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from kubernetes_asyncio.client import ApiClient

from pyprovlib.kube._objects import Obj
from pyprovlib.kube._resources import EVENTS, RESOURCES

__all__ = ["object_reference"]

_KIND_FROM_CLASS = re.compile(r"^V\d+(?:(?:alpha|beta)\d+)?(?P<kind>[A-Z]\w*)$")


def _kind_from_model(model: object) -> tuple[str, str]:
    match = _KIND_FROM_CLASS.match(type(model).__name__)
    if not match:
        return "", ""
    kind = match.group("kind")
    candidates = [r for r in RESOURCES if r.kind == kind and r is not EVENTS]
    if kind == "Event":
        candidates = [EVENTS]
    return (kind, candidates[0].api_version) if len(candidates) == 1 else (kind, "")


def _sanitize(value: Any) -> Any:
    # ApiClient.sanitize_for_serialization without needing a client (which needs a loop).
    if isinstance(value, list | tuple):
        return [_sanitize(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Mapping):
        return {k: _sanitize(v) for k, v in value.items()}
    if hasattr(value, "openapi_types") and hasattr(value, "attribute_map"):
        return {
            value.attribute_map[attr]: _sanitize(getattr(value, attr))
            for attr in value.openapi_types
            if getattr(value, attr) is not None
        }
    return value


def object_reference(obj: object, api_client: ApiClient | None = None) -> Obj:
    """An ``ObjectReference`` (kind, namespace, name, uid, apiVersion, resourceVersion) to
    ``obj``: a JSON dict, a kubernetes-asyncio model, or a reference dict itself.

    Models often lack kind/apiVersion (list items do); they are derived from the model's
    class, like client-go's ``GetReference`` consults the scheme. Raises ``ValueError`` when
    the object cannot be referenced.
    """
    data: Mapping[str, Any]
    derived_kind, derived_version = "", ""
    if isinstance(obj, Mapping):
        data = obj
    elif hasattr(obj, "openapi_types"):
        serialized = (
            api_client.sanitize_for_serialization(obj) if api_client is not None else _sanitize(obj)
        )
        if not isinstance(serialized, Mapping):
            raise ValueError(f"cannot reference a {type(obj).__name__}")
        data = serialized
        derived_kind, derived_version = _kind_from_model(obj)
    else:
        raise ValueError(f"cannot reference a {type(obj).__name__}: not a dict or a model")

    if "metadata" not in data and "name" in data:
        source: Mapping[str, Any] = data
        kind, api_version = data.get("kind"), data.get("apiVersion")
    else:
        meta = data.get("metadata")
        source = meta if isinstance(meta, Mapping) else {}
        kind, api_version = data.get("kind"), data.get("apiVersion")
    kind = kind or derived_kind
    api_version = api_version or derived_version
    if not kind:
        raise ValueError("object has no kind; cannot reference it")
    if not api_version:
        matches = [r for r in RESOURCES if r.kind == kind]
        if len(matches) != 1:
            raise ValueError(f"object of kind {kind!r} has no apiVersion; cannot reference it")
        api_version = matches[0].api_version
    name = source.get("name")
    if not name:
        raise ValueError(f"{kind} has no name; cannot reference it")
    ref: Obj = {"kind": kind, "apiVersion": api_version, "name": name}
    for field in ("namespace", "uid", "resourceVersion", "fieldPath"):
        value = source.get(field)
        if value:
            ref[field] = value
    return ref

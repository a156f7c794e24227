"""The three PATCH flavours of kube-apiserver over JSON dicts.

- JSON merge patch (RFC 7386) and JSON patch (RFC 6902) by the ``json-merge-patch`` and
  ``jsonpatch`` libraries, wrapped so that a bad patch fails with kube-apiserver's status codes
  and messages (a body that does not decode is a 400, an operation that does not apply a 422),
- strategic merge patch, which no Python library implements, with the patch strategies and merge
  keys of the fields storage controllers touch (``metadata.finalizers`` merges as a set of
  strings, ``ownerReferences`` by ``uid``, ``conditions`` by ``type``, containers/volumes/env by
  ``name``; other lists replace).
"""

from __future__ import annotations

from typing import Any

import json_merge_patch
import jsonpatch
import jsonpointer

from pyprovlib.testing._status import ApiError, bad_request
from pyprovlib.testing._storage import copy_json

__all__ = ["apply_json_patch", "apply_merge_patch", "apply_strategic_merge_patch", "go_json_kind"]


def apply_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 over a copy of ``target``: maps merge recursively, ``null`` deletes, everything
    else replaces."""
    return json_merge_patch.merge(copy_json(target), copy_json(patch))


# --- RFC 6902 ---------------------------------------------------------------------------------

# kube-apiserver answers a JSON patch that decodes but does not apply with this 422, whatever
# went wrong (checked on a real one; evanphx/json-patch's own message is not shown).
_NOT_APPLIED = "the server rejected our request due to an error in our request"


def go_json_kind(value: Any) -> str:
    """The name encoding/json gives a JSON value in "cannot unmarshal KIND into ..."."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    return "string" if isinstance(value, str) else "null"


def _undecodable(value: Any, into: str) -> ApiError:
    return bad_request(f"error decoding patch: json: cannot unmarshal {go_json_kind(value)} {into}")


def _decode_json_patch(ops: Any) -> list[dict[str, Any]]:
    """What kube-apiserver's decoding into ``[]jsonPatchOp`` refuses with a 400: a body that is
    not a list of objects, or an ``op``/``path``/``from`` that is not a string."""
    if not isinstance(ops, list):
        raise _undecodable(ops, "into Go value of type []handlers.jsonPatchOp")
    for op in ops:
        if not isinstance(op, dict):
            raise _undecodable(op, "into Go value of type handlers.jsonPatchOp")
        for field in ("op", "path", "from"):
            if op.get(field) is not None and not isinstance(op[field], str):
                raise _undecodable(
                    op[field], f"into Go struct field jsonPatchOp.{field} of type string"
                )
    return ops


def apply_json_patch(target: Any, ops: Any) -> Any:
    """RFC 6902 over a copy of ``target``: a body that does not decode is a 400, an operation that
    does not apply (a failing ``test`` included) a 422, as kube-apiserver answers them."""
    patch = _decode_json_patch(ops)
    try:
        return jsonpatch.apply_patch(copy_json(target), copy_json(patch), in_place=True)
    except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as e:
        raise ApiError(422, _NOT_APPLIED, "Invalid") from e


# --- strategic merge patch -------------------------------------------------------------------

# Merge keys of the lists whose patchStrategy is "merge" in the Kubernetes Go types.
_MERGE_KEYS: dict[str, str] = {
    "ownerReferences": "uid",
    "conditions": "type",
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "env": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "imagePullSecrets": "name",
    "addresses": "type",
    "drivers": "name",
    "ports": "containerPort",
}
_PRIMITIVE_MERGE: frozenset[str] = frozenset({"metadata.finalizers"})
_DIRECTIVE = "$patch"
_DELETE_PRIMITIVE = "$deleteFromPrimitiveList/"
_SET_ORDER = "$setElementOrder/"
_RETAIN_KEYS = "$retainKeys"


def apply_strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Apply a strategic merge patch to ``target`` (the whole object) and return the result."""
    if not isinstance(patch, dict):
        raise bad_request("strategic merge patch must be a JSON object")
    return _merge_map(copy_json(target) if isinstance(target, dict) else {}, patch, "")


def _merge_map(original: dict[str, Any], patch: dict[str, Any], path: str) -> dict[str, Any]:
    directive = patch.get(_DIRECTIVE)
    if directive == "replace":
        return {k: copy_json(v) for k, v in patch.items() if k != _DIRECTIVE}
    if directive == "delete":
        return {}
    if directive is not None:
        raise bad_request(f"Unknown patch type: {directive}")
    retain = patch.get(_RETAIN_KEYS)
    orders: dict[str, list[Any]] = {}
    for key, value in patch.items():
        if key in (_DIRECTIVE, _RETAIN_KEYS):
            continue
        if key.startswith(_SET_ORDER):
            if isinstance(value, list):
                orders[key[len(_SET_ORDER) :]] = value
            continue
        if key.startswith(_DELETE_PRIMITIVE):
            field = key[len(_DELETE_PRIMITIVE) :]
            current = original.get(field)
            if isinstance(current, list) and isinstance(value, list):
                kept = [v for v in current if v not in value]
                if kept:
                    original[field] = kept
                else:
                    original.pop(field, None)
            continue
        child = f"{path}.{key}" if path else key
        if value is None:
            original.pop(key, None)
            continue
        current = original.get(key)
        if isinstance(value, dict):
            if value.get(_DIRECTIVE) == "delete":
                original.pop(key, None)
                continue
            original[key] = _merge_map(
                dict(current) if isinstance(current, dict) else {}, value, child
            )
        elif isinstance(value, list):
            merged = _merge_list(current if isinstance(current, list) else [], value, key, child)
            original[key] = merged
        else:
            original[key] = copy_json(value)
    for field, order in orders.items():
        if isinstance(original.get(field), list):
            original[field] = _reorder(original[field], order, _MERGE_KEYS.get(field))
    if isinstance(retain, list):
        for key in list(original):
            if key not in retain:
                del original[key]
    return original


def _merge_list(original: list[Any], patch: list[Any], key: str, path: str) -> list[Any]:
    if path in _PRIMITIVE_MERGE:
        out = list(original)
        for item in patch:
            if item not in out:
                out.append(item)
        return _normalize_order(out, patch, original, None)
    merge_key = _MERGE_KEYS.get(key)
    if merge_key is None or not all(isinstance(p, dict) for p in patch):
        return copy_json([p for p in patch if not (isinstance(p, dict) and _DIRECTIVE in p)])
    if any(p.get(_DIRECTIVE) == "replace" for p in patch):
        return [copy_json(p) for p in patch if _DIRECTIVE not in p]
    out = [copy_json(o) for o in original]
    for item in patch:
        if merge_key not in item:
            raise bad_request(f"map: {item} does not contain declared merge key: {merge_key}")
        idx = next(
            (
                i
                for i, o in enumerate(out)
                if isinstance(o, dict) and o.get(merge_key) == item[merge_key]
            ),
            None,
        )
        if item.get(_DIRECTIVE) == "delete":
            if idx is not None:
                out.pop(idx)
            continue
        if idx is None:
            out.append(_merge_map({}, item, path))
        else:
            out[idx] = _merge_map(out[idx], item, path)
    plain = [p for p in patch if _DIRECTIVE not in p]
    return _normalize_order(out, plain, original, merge_key)


def _normalize_order(
    merged: list[Any], patch: list[Any], original: list[Any], merge_key: str | None
) -> list[Any]:
    """strategicpatch's order of a merged list: the patch's items in the patch's order, merged
    with the server-only items in their order, a patch item going first unless both are on the
    server (then the server's order decides)."""

    def ident(item: Any) -> str:
        return repr(item.get(merge_key) if merge_key and isinstance(item, dict) else item)

    patch_rank = {ident(p): i for i, p in enumerate(patch)}
    server_rank = {ident(o): i for i, o in reversed(list(enumerate(original)))}
    from_patch = sorted(
        (m for m in merged if ident(m) in patch_rank), key=lambda m: patch_rank[ident(m)]
    )
    server_only = sorted(
        (m for m in merged if ident(m) not in patch_rank),
        key=lambda m: server_rank.get(ident(m), len(server_rank)),
    )
    out: list[Any] = []
    i = j = 0
    while i < len(from_patch) or j < len(server_only):
        if i >= len(from_patch):
            out.append(server_only[j])
            j += 1
        elif j >= len(server_only):
            out.append(from_patch[i])
            i += 1
        else:
            left = server_rank.get(ident(from_patch[i]))
            right = server_rank.get(ident(server_only[j]))
            if left is not None and right is not None and right < left:
                out.append(server_only[j])
                j += 1
            else:
                out.append(from_patch[i])
                i += 1
    return out


def _reorder(items: list[Any], order: list[Any], merge_key: str | None) -> list[Any]:
    def ident(item: Any) -> Any:
        if merge_key and isinstance(item, dict):
            return item.get(merge_key)
        return item

    wanted = [o.get(merge_key) if merge_key and isinstance(o, dict) else o for o in order]
    rank = {repr(w): i for i, w in enumerate(wanted)}
    indexed = list(enumerate(items))
    indexed.sort(key=lambda p: rank.get(repr(ident(p[1])), len(rank) + p[0]))
    return [item for _i, item in indexed]

"""The three PATCH flavours of kube-apiserver over JSON dicts.

- JSON merge patch (RFC 7386),
- JSON patch (RFC 6902, all six operations),
- strategic merge patch, with the patch strategies and merge keys of the fields storage
  controllers touch (``metadata.finalizers`` merges as a set of strings, ``ownerReferences`` by
  ``uid``, ``conditions`` by ``type``, containers/volumes/env by ``name``; other lists replace).
"""

from __future__ import annotations

from typing import Any

from pyprovlib.testing._status import ApiError, bad_request
from pyprovlib.testing._storage import copy_json

__all__ = ["apply_json_patch", "apply_merge_patch", "apply_strategic_merge_patch"]


def apply_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: maps merge recursively, ``null`` deletes, everything else replaces."""
    if not isinstance(patch, dict):
        return copy_json(patch)
    result: dict[str, Any] = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = apply_merge_patch(result.get(key), value)
    return result


# --- RFC 6902 ---------------------------------------------------------------------------------


def _invalid(message: str) -> ApiError:
    # apiserver answers a JSON patch that fails to apply with a bare 422
    return ApiError(422, message, "Invalid")


def _pointer(path: Any) -> list[str]:
    if not isinstance(path, str):
        raise bad_request("json patch: path must be a string")
    if path == "":
        return []
    if not path.startswith("/"):
        raise _invalid(f'JSON pointer must be empty or start with a "/": {path!r}')
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _container(doc: Any, parts: list[str], path: str) -> Any:
    cur = doc
    for p in parts[:-1]:
        if isinstance(cur, dict):
            if p not in cur:
                raise _invalid(f'doc is missing path: "{path}": missing value')
            cur = cur[p]
        elif isinstance(cur, list):
            idx = _index(p, len(cur), path)
            cur = cur[idx]
        else:
            raise _invalid(f'doc is missing path: "{path}": missing value')
    return cur


def _index(p: str, length: int, path: str, allow_end: bool = False) -> int:
    if p == "-" and allow_end:
        return length
    if not p.isdigit() or (len(p) > 1 and p.startswith("0")):
        raise _invalid(f"Unable to access invalid index: {p}: invalid index referenced")
    idx = int(p)
    if idx > length or (idx == length and not allow_end):
        raise _invalid(f"Unable to access invalid index: {idx}: invalid index referenced")
    return idx


def _get_at(doc: Any, parts: list[str], path: str) -> Any:
    if not parts:
        return doc
    parent = _container(doc, parts, path)
    last = parts[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise _invalid(f"doc is missing key: {path}: missing value")
        return parent[last]
    if isinstance(parent, list):
        return parent[_index(last, len(parent), path)]
    raise _invalid(f'doc is missing path: "{path}": missing value')


def _add(doc: Any, parts: list[str], value: Any, path: str) -> Any:
    if not parts:
        return value
    parent = _container(doc, parts, path)
    last = parts[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_index(last, len(parent), path, allow_end=True), value)
    else:
        raise _invalid(f'doc is missing path: "{path}": missing value')
    return doc


def _remove(doc: Any, parts: list[str], path: str) -> Any:
    if not parts:
        raise _invalid("unable to remove the document root")
    parent = _container(doc, parts, path)
    last = parts[-1]
    if isinstance(parent, dict):
        if last not in parent:
            raise _invalid(f"Unable to remove nonexistent key: {last}: missing value")
        return parent.pop(last)
    if isinstance(parent, list):
        return parent.pop(_index(last, len(parent), path))
    raise _invalid(f'doc is missing path: "{path}": missing value')


def apply_json_patch(target: Any, ops: Any) -> Any:
    """RFC 6902 over a copy of ``target``; a failing op (``test`` included) is a 422."""
    if not isinstance(ops, list):
        raise bad_request("json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    doc = copy_json(target)
    for op in ops:
        if not isinstance(op, dict):
            raise bad_request("json: cannot unmarshal into Go value of type jsonpatch.Operation")
        kind = op.get("op")
        path = op.get("path")
        parts = _pointer(path)
        if kind == "add":
            if "value" not in op:
                raise _invalid("add operation does not apply: missing value")
            doc = _add(doc, parts, copy_json(op["value"]), str(path))
        elif kind == "remove":
            _remove(doc, parts, str(path))
        elif kind == "replace":
            if "value" not in op:
                raise _invalid("replace operation does not apply: missing value")
            _get_at(doc, parts, str(path))
            if not parts:
                doc = copy_json(op["value"])
            else:
                parent = _container(doc, parts, str(path))
                if isinstance(parent, dict):
                    parent[parts[-1]] = copy_json(op["value"])
                else:
                    parent[_index(parts[-1], len(parent), str(path))] = copy_json(op["value"])
        elif kind in ("move", "copy"):
            src = _pointer(op.get("from"))
            value = _get_at(doc, src, str(op.get("from")))
            if kind == "move":
                _remove(doc, src, str(op.get("from")))
            else:
                value = copy_json(value)
            doc = _add(doc, parts, value, str(path))
        elif kind == "test":
            actual = _get_at(doc, parts, str(path)) if parts else doc
            if actual != op.get("value"):
                raise _invalid(f"testing value {path} failed: test failed")
        else:
            raise bad_request(f"Unexpected kind: {kind}")
    return doc


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

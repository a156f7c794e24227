"""Label and field selectors of LIST/WATCH, parsed and matched the way kube-apiserver does.

Field selectors only accept the fields each registry exposes; anything else is a 400
``field label not supported``, as on a real cluster.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pyprovlib.kube._objects import Obj
from pyprovlib.testing._status import bad_request

__all__ = [
    "FieldSelector",
    "LabelSelector",
    "field_getters",
    "label_selector_from_json",
    "parse_field_selector",
    "parse_label_selector",
    "single_name",
]


@dataclass(frozen=True)
class _Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!exists"
    values: tuple[str, ...]

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        if self.op == "exists":
            return present
        if self.op == "!exists":
            return not present
        if self.op in ("=", "in"):
            return present and labels[self.key] in self.values
        # "!=" and "notin" match objects without the label as well
        return not present or labels[self.key] not in self.values


@dataclass(frozen=True)
class LabelSelector:
    """A parsed label selector; the empty selector matches everything."""

    requirements: tuple[_Requirement, ...]

    def matches(self, obj: Obj) -> bool:
        """Whether ``obj``'s labels satisfy every requirement."""
        if not self.requirements:
            return True
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return all(r.matches(labels) for r in self.requirements)


_KEY = r"[A-Za-z0-9](?:[-A-Za-z0-9_./]*[A-Za-z0-9])?"
_KEY_RE = re.compile(f"^{_KEY}$")
_VALUE_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def _split_top(text: str) -> list[str]:
    """Split on commas that are not inside parentheses."""
    parts: list[str] = []
    depth = 0
    cur: list[str] = []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return parts


def _check_value(v: str) -> str:
    if not _VALUE_RE.match(v) or len(v) > 63:
        raise bad_request(f"unable to parse requirement: invalid label value: {v!r}")
    return v


def parse_label_selector(text: str | None) -> LabelSelector:
    """Parse ``a=b,c!=d,e in (x,y),f notin (z),g,!h``; a syntax error is a 400."""
    if not text or not text.strip():
        return LabelSelector(())
    reqs: list[_Requirement] = []
    for raw in _split_top(text):
        part = raw.strip()
        if not part:
            raise bad_request(
                f"unable to parse requirement: found '', expected: identifier in {text!r}"
            )
        m = re.match(rf"^({_KEY})\s+(in|notin)\s*\((.*)\)$", part)
        if m:
            values = tuple(_check_value(v.strip()) for v in m.group(3).split(",") if v.strip())
            reqs.append(_Requirement(m.group(1), m.group(2), values))
            continue
        if part.startswith("!"):
            key = part[1:].strip()
            if not _KEY_RE.match(key):
                raise bad_request(f"unable to parse requirement: invalid label key {key!r}")
            reqs.append(_Requirement(key, "!exists", ()))
            continue
        m = re.match(rf"^({_KEY})\s*(==|=|!=)\s*(.*)$", part)
        if m:
            op = "!=" if m.group(2) == "!=" else "="
            value = m.group(3).strip()
            reqs.append(_Requirement(m.group(1), op, (_check_value(value),)))
            continue
        if _KEY_RE.match(part):
            reqs.append(_Requirement(part, "exists", ()))
            continue
        raise bad_request(f"unable to parse requirement: invalid selector {part!r}")
    return LabelSelector(tuple(reqs))


_EXPRESSION_OPS = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!exists"}


def label_selector_from_json(selector: Any) -> LabelSelector | None:
    """A ``metav1.LabelSelector`` (``matchLabels`` AND ``matchExpressions``) as a
    :class:`LabelSelector` (``LabelSelectorAsSelector``); an empty one matches everything.
    None when it is malformed (not an object, an unknown operator): it must match nothing."""
    if not isinstance(selector, dict):
        return None
    match_labels = selector.get("matchLabels") or {}
    expressions = selector.get("matchExpressions") or []
    if not isinstance(match_labels, dict) or not isinstance(expressions, list):
        return None
    reqs = [_Requirement(str(k), "=", (str(v),)) for k, v in match_labels.items()]
    for expr in expressions:
        if not isinstance(expr, dict):
            return None
        op = _EXPRESSION_OPS.get(str(expr.get("operator")))
        key, values = expr.get("key"), expr.get("values")
        if op is None or not isinstance(key, str):
            return None
        vals = values if isinstance(values, list) else []
        reqs.append(_Requirement(key, op, tuple(v for v in vals if isinstance(v, str))))
    return LabelSelector(tuple(reqs))


def _get(path: str) -> Callable[[Obj], str]:
    keys = path.split(".")

    def getter(obj: Obj) -> str:
        cur: Any = obj
        for k in keys:
            if not isinstance(cur, dict):
                return ""
            cur = cur.get(k)
        if cur is None:
            return ""
        if isinstance(cur, bool):
            return "true" if cur else "false"
        return str(cur)

    return getter


_COMMON = ("metadata.name", "metadata.namespace")

# Per-registry field labels, from each type's GetAttrs/ToSelectableFields upstream.
_FIELDS: dict[tuple[str, str], tuple[str, ...]] = {
    ("", "pods"): (
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "spec.hostNetwork",
        "status.phase",
        "status.podIP",
        "status.podIPs",
        "status.nominatedNodeName",
    ),
    ("", "events"): (
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "source",
        "type",
    ),
    ("events.k8s.io", "events"): (
        "regarding.kind",
        "regarding.namespace",
        "regarding.name",
        "regarding.uid",
        "regarding.apiVersion",
        "regarding.resourceVersion",
        "regarding.fieldPath",
        "reason",
        "reportingController",
        "type",
    ),
    ("", "secrets"): ("type",),
    ("", "namespaces"): ("status.phase",),
    ("", "nodes"): ("spec.unschedulable",),
    # The PV and PVC registries select on name only (and namespace for claims).
}


def field_getters(group: str, plural: str) -> dict[str, Callable[[Obj], str]]:
    """The selectable fields of a resource and how to read each from an object."""
    out = {f: _get(f) for f in _COMMON}
    for f in _FIELDS.get((group, plural), ()):
        out[f] = _get(f)
    if (group, plural) == ("", "events"):
        # core/v1 Event's "source" field label is source.component
        out["source"] = _get("source.component")
    if (group, plural) == ("", "nodes"):
        base = _get("spec.unschedulable")
        out["spec.unschedulable"] = lambda o: base(o) or "false"
    return out


@dataclass(frozen=True)
class FieldSelector:
    """A parsed field selector: ``(field, op, value)`` with op ``=`` or ``!=``."""

    terms: tuple[tuple[Callable[[Obj], str], str, str], ...]

    def matches(self, obj: Obj) -> bool:
        """Whether ``obj`` satisfies every term."""
        return all((get(obj) == value) == (op == "=") for get, op, value in self.terms)


def parse_field_selector(text: str | None, group: str, plural: str) -> FieldSelector:
    """Parse ``f=v,g!=w`` for a resource; an unknown field is ``field label not supported``."""
    if not text or not text.strip():
        return FieldSelector(())
    getters = field_getters(group, plural)
    terms: list[tuple[Callable[[Obj], str], str, str]] = []
    for raw in text.split(","):
        part = raw.strip()
        m = re.match(r"^([^=!]+?)\s*(==|=|!=)\s*(.*)$", part)
        if not m:
            raise bad_request(f"invalid selector: '{text}'; can't understand '{part}'")
        name, op, value = m.group(1).strip(), m.group(2), m.group(3).strip()
        get = getters.get(name)
        if get is None:
            raise bad_request(f"field label not supported: {name}")
        terms.append((get, "!=" if op == "!=" else "=", value))
    return FieldSelector(tuple(terms))


def single_name(selector: FieldSelector, text: str | None) -> str | None:
    """``metadata.name=x`` alone — lets a LIST/WATCH skip scanning the whole collection."""
    if text and len(selector.terms) == 1:
        m = re.match(r"^\s*metadata\.name\s*==?\s*(\S+)\s*$", text)
        if m:
            return m.group(1)
    return None

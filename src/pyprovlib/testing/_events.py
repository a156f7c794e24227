"""events.k8s.io/v1 as a view of core/v1 Events, and the create validation of both.

Like kube-apiserver, the server stores one kind of Event: an events.k8s.io/v1 request is
converted to the core shape on the way in and back on the way out, so an event written
through either API is read through both.
"""

from __future__ import annotations

import re
from typing import Any

from pyprovlib.kube import _resources as R
from pyprovlib.kube._objects import Obj
from pyprovlib.kube._resources import Resource
from pyprovlib.testing._storage import copy_json
from pyprovlib.testing._validation import Cause

__all__ = ["core_to_v1", "v1_to_core", "validate_event"]


# events.k8s.io/v1 field -> core/v1 field (same value, renamed)
_RENAMED = (
    ("regarding", "involvedObject"),
    ("note", "message"),
    ("reportingController", "reportingComponent"),
    ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
)
_NOTE_LIMIT = 1024
_INSTANCE_LIMIT = 128
_QUALIFIED = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")


def v1_to_core(obj: Any) -> Any:
    """An events.k8s.io/v1 Event body in the core/v1 shape (non-objects pass through)."""
    if not isinstance(obj, dict):
        return obj
    out = copy_json(obj)
    for new, old in _RENAMED:
        out.pop(old, None)
        if new in out:
            out[old] = out.pop(new)
    if out.get("apiVersion") == R.EVENTS_V1.api_version:
        out["apiVersion"] = R.EVENTS.api_version
    return out


def core_to_v1(obj: Obj) -> Obj:
    """A stored core/v1 Event as events.k8s.io/v1 shows it."""
    out: Obj = {"kind": "Event", "apiVersion": R.EVENTS_V1.api_version}
    for key, value in obj.items():
        if key in ("kind", "apiVersion"):
            continue
        out[key] = value
    for new, old in _RENAMED:
        out.pop(new, None)
        if old in out:
            out[new] = out.pop(old)
    if out.get("deprecatedSource") == {}:
        del out["deprecatedSource"]
    if out.get("deprecatedCount") == 0:
        del out["deprecatedCount"]
    return out


def validate_event(resource: Resource, event: Obj) -> list[Cause]:
    """Create-time validation of an Event (given in the core shape) for the API it came
    through: events.k8s.io/v1 requires the "new" fields; core/v1 accepts legacy events."""
    causes: list[Cause] = []
    core = resource is R.EVENTS
    controller_field = "reportingComponent" if core else "reportingController"
    namespace = (event.get("metadata") or {}).get("namespace") or ""
    involved = event.get("involvedObject") or {}
    involved_ns = involved.get("namespace") or "" if isinstance(involved, dict) else ""
    regarding = "involvedObject" if core else "regarding"

    def invalid(field: str, value: Any, detail: str) -> Cause:
        return ("FieldValueInvalid", f'Invalid value: "{value}": {detail}', field)

    def required(field: str) -> Cause:
        return ("FieldValueRequired", "Required value", field)

    if not core and not event.get("eventTime"):
        causes.append(required("eventTime"))
    if not event.get("eventTime"):
        if not involved_ns:
            if namespace not in ("", "default"):
                causes.append(
                    invalid(f"{regarding}.namespace", involved_ns, "does not match event.namespace")
                )
        elif namespace != involved_ns:
            causes.append(
                invalid(f"{regarding}.namespace", involved_ns, "does not match event.namespace")
            )
        return causes
    if not involved_ns and namespace not in ("default", "kube-system"):
        causes.append(
            invalid(f"{regarding}.namespace", involved_ns, "does not match event.namespace")
        )
    controller = event.get("reportingComponent") or ""
    if not controller:
        causes.append(required(controller_field))
    elif not all(_QUALIFIED.match(part) for part in str(controller).split("/", 1)):
        causes.append(invalid(controller_field, controller, "must be a qualified name"))
    instance = event.get("reportingInstance") or ""
    if not instance:
        causes.append(required("reportingInstance"))
    elif len(instance) > _INSTANCE_LIMIT:
        causes.append(
            (
                "FieldValueInvalid",
                f'Invalid value: "": can have at most {_INSTANCE_LIMIT} characters',
                "reportingInstance",
            )
        )
    if not event.get("action"):
        causes.append(required("action"))
    if not event.get("reason"):
        causes.append(required("reason"))
    message = event.get("message") or ""
    if len(message) > _NOTE_LIMIT:
        causes.append(
            (
                "FieldValueInvalid",
                f'Invalid value: "": can have at most {_NOTE_LIMIT} characters',
                "note" if not core else "message",
            )
        )
    if not core and event.get("type") not in ("Normal", "Warning"):
        causes.append(
            (
                "FieldValueNotSupported",
                f'Unsupported value: "{event.get("type", "")}": supported values: '
                '"Normal", "Warning"',
                "type",
            )
        )
    return causes

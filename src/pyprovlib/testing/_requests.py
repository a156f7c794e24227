"""How the in-memory API server reads a request: the resource URL, the query options it
validates as kube-apiserver does (422 Invalid naming the option), selectors and Table output."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pyprovlib.kube._resources import RESOURCES, Resource
from pyprovlib.testing._causes import Cause, forbidden, unsupported
from pyprovlib.testing._http import Request
from pyprovlib.testing._selectors import (
    FieldSelector,
    LabelSelector,
    parse_field_selector,
    parse_label_selector,
)
from pyprovlib.testing._status import ApiError

__all__ = [
    "Target",
    "parse_target",
    "selectors",
    "table_mode",
    "truthy",
    "validate_list_options",
    "validate_watch_options",
    "validate_write_options",
]

_BY_GV_PLURAL: dict[tuple[str, str], Resource] = {(r.api_version, r.plural): r for r in RESOURCES}


@dataclass(slots=True, eq=False)
class Target:
    """A parsed resource URL."""

    resource: Resource
    namespace: str | None
    name: str | None
    subresource: str | None
    watch_path: bool


def parse_target(path: str) -> Target | None:
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 2 and parts[0] == "api":
        gv, rest = parts[1], parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        gv, rest = f"{parts[1]}/{parts[2]}", parts[3:]
    else:
        return None
    watch_path = bool(rest) and rest[0] == "watch"
    if watch_path:
        rest = rest[1:]
    if not rest:
        return None
    namespace: str | None = None
    # /api/v1/namespaces/NAME/status is the namespace's subresource, not a collection
    if rest[0] == "namespaces" and len(rest) >= 3 and not (gv == "v1" and rest[2:] == ["status"]):
        namespace, rest = rest[1], rest[2:]
    plural, rest = rest[0], rest[1:]
    resource = _BY_GV_PLURAL.get((gv, plural))
    if resource is None or (namespace is not None and not resource.namespaced):
        return None
    name = rest[0] if rest else None
    subresource = rest[1] if len(rest) >= 2 else None
    if len(rest) > 2 or (subresource is not None and subresource not in resource.subresources):
        return None
    if name is not None and resource.namespaced and namespace is None:
        return None
    return Target(resource, namespace, name, subresource, watch_path)


_OPTIONS_KIND = {
    "create": "CreateOptions",
    "update": "UpdateOptions",
    "patch": "PatchOptions",
    "delete": "DeleteOptions",
    "deletecollection": "DeleteOptions",
}


def _invalid_options(kind: str, causes: list[Cause]) -> ApiError:
    """422 Invalid for query options, as the real server words it (``<Kind>.meta.k8s.io``)."""
    parts = ", ".join(f"{f}: {m}" for _r, m, f in causes)
    return ApiError(
        422,
        f'{kind}.meta.k8s.io "" is invalid: {parts}',
        "Invalid",
        {
            "group": "meta.k8s.io",
            "kind": kind,
            "causes": [{"reason": r, "message": m, "field": f} for r, m, f in causes],
        },
    )


_MATCH = "resourceVersionMatch"


def validate_write_options(verb: str, dry_run: list[str], field_validation: str | None) -> None:
    """ValidateDryRun and ValidateFieldValidation of Create/Update/Patch/DeleteOptions."""
    kind = _OPTIONS_KIND.get(verb)
    if kind is None:
        return
    causes: list[Cause] = []
    values = [v for v in dry_run if v != ""]
    if values and values != ["All"]:
        # the Go value printed as is: a []string, not a quoted string
        shown = "[]string{" + ", ".join(f'"{v}"' for v in dry_run) + "}"
        causes.append(
            (
                "FieldValueNotSupported",
                f'Unsupported value: {shown}: supported values: "All"',
                "dryRun",
            )
        )
    if kind != "DeleteOptions" and field_validation not in (None, "", "Ignore", "Warn", "Strict"):
        causes.append(
            unsupported("fieldValidation", field_validation, ["", "Ignore", "Strict", "Warn"])
        )
    if causes:
        raise _invalid_options(kind, causes)


def validate_watch_options(send_initial: str | None, match: str | None, token: str | None) -> None:
    """validateWatchOptions: sendInitialEvents and resourceVersionMatch go together."""
    causes: list[Cause] = []
    if send_initial is not None and match != "NotOlderThan":
        causes.append(
            forbidden(
                _MATCH, "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan"
            )
        )
    if match:
        if send_initial is None:
            causes.append(
                forbidden(
                    _MATCH,
                    "resourceVersionMatch is forbidden for watch unless sendInitialEvents is "
                    "provided",
                )
            )
        if match != "NotOlderThan":
            causes.append(unsupported(_MATCH, match, ["NotOlderThan"]))
        if token:
            causes.append(
                forbidden(_MATCH, "resourceVersionMatch is forbidden when continue is provided")
            )
    if causes:
        raise _invalid_options("ListOptions", causes)


def validate_list_options(rv: str | None, match: str | None) -> None:
    """ListOptions validation of resourceVersion/resourceVersionMatch (422 like the server)."""
    if not match:
        return
    if not rv:
        cause = forbidden(
            _MATCH, "resourceVersionMatch is forbidden unless resourceVersion is provided"
        )
    elif match == "Exact" and rv == "0":
        cause = forbidden(
            _MATCH, 'resourceVersionMatch "exact" is forbidden for resourceVersion "0"'
        )
    elif match not in ("Exact", "NotOlderThan"):
        cause = unsupported(_MATCH, match, ["Exact", "NotOlderThan"])
    else:
        return
    raise _invalid_options("ListOptions", [cause])


def truthy(value: str | None) -> bool:
    return value is not None and value.lower() in ("true", "1")


def selectors(query: Mapping[str, str], r: Resource) -> tuple[LabelSelector, FieldSelector]:
    """The label and field selectors of a LIST, WATCH or DELETE collection request."""
    return (
        parse_label_selector(query.get("labelSelector")),
        parse_field_selector(query.get("fieldSelector"), r.group, r.plural),
    )


def table_mode(request: Request) -> bool:
    """Whether the client asked for ``meta.k8s.io/v1`` Table output."""
    accept = request.headers.get("Accept", "")
    if "as=Table" not in accept:
        return False
    for part in accept.split(","):
        if (
            "as=Table" in part
            and "g=meta.k8s.io" in part
            and "v=v1" in part
            and "v=v1beta1" not in part
        ):
            return True
    return False

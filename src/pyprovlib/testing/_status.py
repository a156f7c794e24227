"""``kind: Status`` error bodies shaped exactly like kube-apiserver's, raised as :class:`ApiError`.

Every handler of the in-memory server raises these; the server turns them into the HTTP answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pyprovlib._errors import PyprovlibError
from pyprovlib.kube._resources import Resource

__all__ = [
    "ApiError",
    "already_exists",
    "bad_request",
    "conflict",
    "expired",
    "forbidden",
    "internal_error",
    "invalid",
    "method_not_allowed",
    "not_acceptable",
    "not_found",
    "status_success",
    "too_many_requests",
    "unsupported_media_type",
]

_REASONS = {
    400: "BadRequest",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


@dataclass
class ApiError(PyprovlibError):
    """An API failure carrying the ``Status`` body the real server would send."""

    code: int
    message: str
    reason: str = ""
    details: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.reason:
            self.reason = _REASONS.get(self.code, "Unknown" if self.code >= 400 else "")
        super().__init__(self.message)

    def body(self) -> dict[str, Any]:
        """The ``Status`` object as a JSON-ready dict."""
        out: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
        }
        if self.details is not None:
            out["details"] = self.details
        out["code"] = self.code
        return out


def _details(resource: Resource | None, name: str | None) -> dict[str, Any]:
    d: dict[str, Any] = {}
    if name:
        d["name"] = name
    if resource is not None:
        if resource.group:
            d["group"] = resource.group
        d["kind"] = resource.plural
    return d


def _qualified(resource: Resource) -> str:
    return f"{resource.plural}.{resource.group}" if resource.group else resource.plural


def _about(resource: Resource, name: str, code: int, message: str, reason: str = "") -> ApiError:
    """An error about one named object: the details name it as kube-apiserver's do; the reason
    defaults to the code's."""
    return ApiError(code, message, reason, _details(resource, name))


def not_found(resource: Resource, name: str) -> ApiError:
    """404 ``<plural> "<name>" not found``."""
    return _about(resource, name, 404, f'{_qualified(resource)} "{name}" not found')


def already_exists(resource: Resource, name: str) -> ApiError:
    """409 AlreadyExists."""
    return _about(
        resource, name, 409, f'{_qualified(resource)} "{name}" already exists', "AlreadyExists"
    )


def conflict(resource: Resource, name: str, why: str) -> ApiError:
    """409 Conflict: ``Operation cannot be fulfilled on <plural> "<name>": <why>``."""
    message = f'Operation cannot be fulfilled on {_qualified(resource)} "{name}": {why}'
    return _about(resource, name, 409, message)


def invalid(resource: Resource, name: str, causes: list[tuple[str, str, str]]) -> ApiError:
    """422 Invalid; ``causes`` are (reason, message, field) like field.ErrorList."""
    group_kind = f"{resource.kind}.{resource.group}" if resource.group else resource.kind
    parts = [f"{f}: {m}" if f else m for _r, m, f in causes]
    summary = parts[0] if len(parts) == 1 else "[" + ", ".join(parts) + "]"
    details = {
        "name": name,
        **({"group": resource.group} if resource.group else {}),
        "kind": resource.kind,
        "causes": [{"reason": r, "message": m, "field": f} for r, m, f in causes],
    }
    return ApiError(422, f'{group_kind} "{name}" is invalid: {summary}', "Invalid", details)


def bad_request(message: str) -> ApiError:
    """400 BadRequest."""
    return ApiError(400, message, "BadRequest")


def forbidden(resource: Resource, name: str, why: str) -> ApiError:
    """403 Forbidden: ``<plural> "<name>" is forbidden: <why>``."""
    return _about(resource, name, 403, f'{_qualified(resource)} "{name}" is forbidden: {why}')


def method_not_allowed(method: str) -> ApiError:
    """405 MethodNotAllowed."""
    return ApiError(
        405,
        "the server does not allow this method on the requested resource",
        "MethodNotAllowed",
        {},
    )


def unsupported_media_type(content_type: str) -> ApiError:
    """415 UnsupportedMediaType."""
    return ApiError(
        415,
        f"the body of the request was in an unknown format - accepted media "
        f"types include: application/json-patch+json, application/merge-patch+json, "
        f"application/apply-patch+yaml, application/strategic-merge-patch+json; "
        f'got "{content_type}"',
        "UnsupportedMediaType",
    )


def not_acceptable(accept: str) -> ApiError:
    """406 NotAcceptable."""
    return ApiError(
        406,
        f"only the following media types are accepted: application/json, "
        f"application/yaml; got {accept}",
        "NotAcceptable",
    )


def expired(requested: int, oldest: int) -> ApiError:
    """410 Expired, worded like the watch cache: ``too old resource version: X (Y)``."""
    return ApiError(410, f"too old resource version: {requested} ({oldest})", "Expired")


def too_many_requests(retry_after: int) -> ApiError:
    """429 with a Retry-After header and ``details.retryAfterSeconds``."""
    return ApiError(
        429,
        "Too many requests, please try again later.",
        "TooManyRequests",
        {"retryAfterSeconds": retry_after},
        {"Retry-After": str(retry_after)},
    )


def internal_error(message: str) -> ApiError:
    """500 InternalError."""
    return ApiError(
        500,
        f"Internal error occurred: {message}",
        "InternalError",
        {"causes": [{"message": message}]},
    )


def status_success(resource: Resource, name: str, uid: str) -> dict[str, Any]:
    """The ``Status`` a delete returns when the object is gone at once."""
    details: dict[str, Any] = {"name": name, "kind": resource.plural, "uid": uid}
    if resource.group:
        details = {"name": name, "group": resource.group, "kind": resource.plural, "uid": uid}
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": details,
    }

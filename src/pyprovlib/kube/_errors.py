"""Classify errors from the Kubernetes API the way client-go's ``apierrors`` does.

kubernetes-asyncio raises ``ApiException`` with the HTTP status and the ``Status`` body; these
helpers read the status code, the ``reason`` and the ``Retry-After`` hint from it.
"""

from __future__ import annotations

import json
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

__all__ = [
    "ApiException",
    "api_error_text",
    "is_already_exists",
    "is_conflict",
    "is_gone",
    "is_invalid",
    "is_not_found",
    "is_retryable",
    "is_too_many_requests",
    "retry_after_seconds",
    "status_reason",
]


def _status(err: BaseException) -> int | None:
    return err.status if isinstance(err, ApiException) else None


def status_reason(err: BaseException) -> str:
    """The ``reason`` of the ``Status`` body (``AlreadyExists``, ``Conflict``, ...), or ''."""
    if not isinstance(err, ApiException) or not err.body:
        return ""
    try:
        body: Any = json.loads(err.body)
    except (TypeError, ValueError):
        return ""
    reason = body.get("reason", "") if isinstance(body, dict) else ""
    return reason if isinstance(reason, str) else ""


def is_not_found(err: BaseException) -> bool:
    """404 NotFound: the object (or its namespace) does not exist."""
    return _status(err) == 404


def is_already_exists(err: BaseException) -> bool:
    """409 with reason AlreadyExists: a create found an object of that name."""
    return _status(err) == 409 and status_reason(err) == "AlreadyExists"


def is_conflict(err: BaseException) -> bool:
    """A 409 that is not AlreadyExists: a stale resourceVersion or a failed precondition."""
    return _status(err) == 409 and status_reason(err) != "AlreadyExists"


def is_gone(err: BaseException) -> bool:
    """410 Gone: a watch or list asked for a resourceVersion the server no longer keeps."""
    return _status(err) == 410


def is_invalid(err: BaseException) -> bool:
    """422 Invalid: the server's validation rejected the object (see the Status causes)."""
    return _status(err) == 422


def is_too_many_requests(err: BaseException) -> bool:
    """429 TooManyRequests: throttled; see :func:`retry_after_seconds`."""
    return _status(err) == 429


def is_retryable(err: BaseException) -> bool:
    """Errors worth retrying unchanged: throttling, server errors and timeouts."""
    status = _status(err)
    return status is not None and (status == 429 or status >= 500)


def retry_after_seconds(err: BaseException) -> float | None:
    """The server's ``Retry-After`` hint (header, or ``details.retryAfterSeconds``), if any."""
    if not isinstance(err, ApiException):
        return None
    headers: Any = err.headers or {}
    value = headers.get("Retry-After") or headers.get("retry-after")
    if value is not None:
        try:
            return max(0.0, float(value))
        except ValueError:
            pass
    if err.body:
        try:
            body = json.loads(err.body)
            seconds = body.get("details", {}).get("retryAfterSeconds")
            if isinstance(seconds, int | float):
                return max(0.0, float(seconds))
        except (TypeError, ValueError, AttributeError):
            return None
    return None


def api_error_text(err: BaseException) -> str:
    """A short description of an error for a status, an event or a log line: an API error's
    ``Status`` message (not the whole body), else the exception's text."""
    if isinstance(err, ApiException):
        body: Any = err.body
        try:
            decoded = json.loads(body) if body else None
        except (TypeError, ValueError):
            decoded = None
        if isinstance(decoded, dict) and isinstance(decoded.get("message"), str):
            return str(decoded["message"])
        return f"{err.status} {err.reason}".strip()
    return str(err) or type(err).__name__

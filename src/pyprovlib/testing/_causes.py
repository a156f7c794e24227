"""The ``causes`` of a 422 Invalid answer, worded as kube-apiserver's field errors."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["Cause", "forbidden", "invalid_object", "invalid_value", "required", "unsupported"]

Cause = tuple[str, str, str]  # reason, message, field


def required(field: str, detail: str = "") -> Cause:
    return ("FieldValueRequired", "Required value" + (f": {detail}" if detail else ""), field)


def invalid_value(field: str, value: Any, detail: str) -> Cause:
    shown = f'"{value}"' if isinstance(value, str) else str(value)
    return ("FieldValueInvalid", f"Invalid value: {shown}: {detail}", field)


def invalid_object(field: str, value: Any, detail: str) -> Cause:
    """An invalid structured value (a map, a list, null), printed as JSON as the real server
    prints it (``Invalid value: {"app":"x"}: ...``)."""
    shown = json.dumps(value, separators=(",", ":"), sort_keys=True)
    return ("FieldValueInvalid", f"Invalid value: {shown}: {detail}", field)


def forbidden(field: str, detail: str) -> Cause:
    return ("FieldValueForbidden", f"Forbidden: {detail}", field)


def unsupported(field: str, value: Any, allowed: list[str]) -> Cause:
    options = ", ".join(f'"{a}"' for a in allowed)
    return (
        "FieldValueNotSupported",
        f'Unsupported value: "{value}": supported values: {options}',
        field,
    )

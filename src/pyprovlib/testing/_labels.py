"""kube-apiserver's checks of label keys, label values and ``metav1.LabelSelector`` fields
(apimachinery's ``IsQualifiedName``, ``IsValidLabelValue`` and ``ValidateLabelSelector``),
worded as its field errors, and a selector's match against a set of labels."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pyprovlib.kube._objects import is_dns1123_subdomain
from pyprovlib.testing._causes import Cause, forbidden, invalid_value, required

__all__ = [
    "SUBDOMAIN_MSG",
    "label_key_messages",
    "label_selector_causes",
    "label_value_messages",
    "selector_matches",
]

_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_NAME_PART_MSG = (
    "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and "
    "end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex "
    "used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)
SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used "
    "for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
"""What kube-apiserver says of a value that is not a DNS-1123 subdomain."""
_PREFIX_MSG = "prefix part " + SUBDOMAIN_MSG
_QUALIFIED_MSG = (
    "a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start "
    "and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex "
    "used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS "
    "subdomain prefix and '/' (e.g. 'example.com/MyName')"
)
_VALUE_MSG = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or "
    "'my_value',  or '12345', regex used for validation is "
    "'(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
)
_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


def label_key_messages(key: str) -> list[str]:
    """``IsQualifiedName``: an optional DNS subdomain prefix and a name part of at most 63
    characters."""
    parts = key.split("/")
    if len(parts) == 1:
        prefix, name = "", parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            return ["prefix part must be non-empty"]
    else:
        return [_QUALIFIED_MSG]
    messages: list[str] = []
    if prefix and not is_dns1123_subdomain(prefix):
        messages.append(_PREFIX_MSG)
    if not name:
        messages.append("name part must be non-empty")
    elif len(name) > 63:
        messages.append("name part must be no more than 63 characters")
    if not _QUALIFIED_NAME.match(name):
        messages.append(_NAME_PART_MSG)
    return messages


def label_value_messages(value: str) -> list[str]:
    """``IsValidLabelValue``: empty, or at most 63 characters of the label alphabet."""
    messages: list[str] = []
    if len(value) > 63:
        messages.append("must be no more than 63 characters")
    if not _LABEL_VALUE.match(value):
        messages.append(_VALUE_MSG)
    return messages


def label_selector_causes(path: str, selector: Any) -> list[Cause]:
    """``ValidateLabelSelector`` for the selector at ``path`` (None: nothing to check)."""
    if not isinstance(selector, dict):
        return []
    causes: list[Cause] = []
    labels = selector.get("matchLabels") or {}
    if isinstance(labels, dict):
        for key in sorted(labels):
            causes.extend(
                invalid_value(f"{path}.matchLabels", key, m) for m in label_key_messages(key)
            )
            value = labels[key]
            if isinstance(value, str):
                causes.extend(
                    invalid_value(f"{path}.matchLabels", value, m)
                    for m in label_value_messages(value)
                )
    expressions = selector.get("matchExpressions") or []
    for index, expression in enumerate(expressions if isinstance(expressions, list) else []):
        where = f"{path}.matchExpressions[{index}]"
        if not isinstance(expression, dict):
            continue
        operator = expression.get("operator")
        values = expression.get("values") or []
        if operator in ("In", "NotIn"):
            if not values:
                causes.append(
                    required(
                        f"{where}.values", "must be specified when `operator` is 'In' or 'NotIn'"
                    )
                )
        elif operator in ("Exists", "DoesNotExist"):
            if values:
                causes.append(
                    forbidden(
                        f"{where}.values",
                        "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
                    )
                )
        else:
            causes.append(
                invalid_value(f"{where}.operator", operator, "not a valid selector operator")
            )
        key = expression.get("key")
        if isinstance(key, str):
            causes.extend(invalid_value(f"{where}.key", key, m) for m in label_key_messages(key))
        for i, value in enumerate(values if isinstance(values, list) else []):
            if isinstance(value, str):
                causes.extend(
                    invalid_value(f"{where}.values[{i}]", value, m)
                    for m in label_value_messages(value)
                )
    return causes


def selector_matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """Whether ``labels`` satisfy ``selector`` (``matchLabels`` AND every expression); an empty
    selector matches everything."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        key = expression.get("key", "")
        operator = expression.get("operator")
        values = expression.get("values") or []
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and key in labels and labels[key] in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
        if operator not in _OPERATORS:
            return False
    return True

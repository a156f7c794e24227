"""Strip CSI secrets from messages before they reach a log line or an error message.

Port of csi-lib-utils' ``protosanitizer``: every field the spec marks ``[(csi_secret) = true]``
(the generated :data:`~pyprovlib.csi._proto.secret_fields.SECRET_FIELDS` table, derived from
csi.proto) is replaced by ``"***stripped***"``, recursively through nested, repeated and map
message fields. betterproto2's ``repr`` prints secrets verbatim, so a CSI message must never be
formatted directly: format :func:`strip_secrets` or :func:`sanitize` instead.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import enum
import json
from collections.abc import Mapping
from typing import Any, cast

import betterproto2

from pyprovlib.csi._proto.message_pool import default_message_pool
from pyprovlib.csi._proto.secret_fields import SECRET_FIELDS

__all__ = [
    "STRIPPED",
    "Sanitized",
    "full_name",
    "is_secret_field",
    "sanitize",
    "scrub_secret_values",
    "secret_values",
    "strip_secrets",
    "strip_secrets_dict",
]

STRIPPED = "***stripped***"
"""What a secret field's value is replaced with (csi-lib-utils' text)."""

_URL_PREFIX = "type.googleapis.com/"


def full_name(message_type: type[betterproto2.Message]) -> str:
    """The protobuf full name of a generated message class, e.g. ``csi.v1.CreateVolumeRequest``."""
    url = default_message_pool.type_to_url.get(message_type)
    if url is None:
        return message_type.__qualname__
    return url.removeprefix(_URL_PREFIX)


def is_secret_field(message_type: type[betterproto2.Message], field: str) -> bool:
    """True when ``field`` of ``message_type`` carries the ``csi_secret`` option."""
    return field in SECRET_FIELDS.get(full_name(message_type), frozenset())


def _empty(value: Any) -> bool:
    # Proto3 scalars at their default are indistinguishable from unset: leave them out, as Go's
    # JSON rendering of the message does.
    return value is None or (not isinstance(value, betterproto2.Message) and not value)


def _timestamp(value: datetime.datetime) -> str:
    # protojson's form of a google.protobuf.Timestamp: RFC 3339 in UTC with a "Z".
    if value.tzinfo is not None:
        value = value.astimezone(datetime.UTC).replace(tzinfo=None)
    return value.isoformat() + "Z"


def _duration(value: datetime.timedelta) -> str:
    # protojson's form of a google.protobuf.Duration: seconds with a "s" suffix.
    return f"{value.total_seconds():.9f}".rstrip("0").rstrip(".") + "s"


def _plain(value: Any) -> Any:
    """A JSON-able form of a field value. betterproto2 turns well-known types into Python
    values (Timestamp into ``datetime``, Duration into ``timedelta``, wrappers into scalars);
    anything else not JSON-able is rendered with ``str`` rather than failing the log line."""
    if isinstance(value, betterproto2.Message):
        return strip_secrets(value)
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, datetime.datetime):
        return _timestamp(value)
    if isinstance(value, datetime.timedelta):
        return _duration(value)
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


def strip_secrets(message: betterproto2.Message) -> dict[str, Any]:
    """A JSON-able dict of ``message`` (proto field names) with its secrets stripped."""
    secret = SECRET_FIELDS.get(full_name(type(message)), frozenset())
    out: dict[str, Any] = {}
    # Fields with presence (oneof members, wrapper types, `optional`) are set even at their
    # zero value: a maximum_volume_size of 0 is not an unset one.
    # betterproto2 gives exactly those fields a default of None.
    # Generated messages are dataclasses; betterproto2.Message does not say so to mypy.
    for field in dataclasses.fields(cast(Any, message)):
        name = field.name
        value = getattr(message, name)
        if value is None or (cast(Any, field.default_factory) is not type(None) and _empty(value)):
            continue
        out[name] = STRIPPED if name in secret else _plain(value)
    return out


def strip_secrets_dict(
    message_type: type[betterproto2.Message], data: Mapping[str, Any]
) -> dict[str, Any]:
    """Like :func:`strip_secrets` for a message already rendered as a dict (``to_dict()`` or
    hand-built), keyed by proto or Python field names."""
    message = message_type.from_dict(dict(data))
    return strip_secrets(message)


def sanitize(message: betterproto2.Message | None) -> str:
    """A compact JSON rendering of ``message`` with secrets stripped, for logs and errors."""
    if message is None:
        return "null"
    return json.dumps(strip_secrets(message), sort_keys=True, separators=(",", ":"), default=str)


def secret_values(message: betterproto2.Message) -> list[str]:
    """The values of ``message``'s top-level secret fields (map values or scalars)."""
    secret = SECRET_FIELDS.get(full_name(type(message)), frozenset())
    values: list[str] = []
    for name in secret:
        value = getattr(message, name, None)
        if isinstance(value, dict):
            values.extend(str(v) for v in value.values())
        elif value:
            values.append(str(value))
    return [v for v in values if v]


def scrub_secret_values(text: str, message: betterproto2.Message | None) -> str:
    """Replace every secret value of ``message`` found in ``text`` by ``***stripped***``.

    For text the request did not produce itself — a driver's error message, a traceback —
    which may quote a secret it was given.
    """
    if message is None:
        return text
    for value in sorted(secret_values(message), key=len, reverse=True):
        text = text.replace(value, STRIPPED)
    return text


class Sanitized:
    """A message to log: rendered (with :func:`sanitize`) only when a log line is written, so
    debug logging of every call costs nothing while debug is off."""

    __slots__ = ("message",)

    def __init__(self, message: betterproto2.Message | None) -> None:
        self.message = message

    def __str__(self) -> str:
        # Rendered inside a logging handler or a structlog processor: a failure here must
        # cost the log line at most, never the call being logged.
        try:
            return sanitize(self.message)
        except Exception as exc:
            name = type(self.message).__name__
            return f"<{name}: not renderable ({type(exc).__name__})>"

    __repr__ = __str__

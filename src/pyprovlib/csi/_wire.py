"""Strict checking of a request's protobuf bytes before betterproto2 parses them.

betterproto2 parses leniently: a truncated field is cut short, a field of the wrong wire type
lands in the message with the wrong Python type, bad wire types are skipped. A CSI handler must
never see such a message (a truncated volume name is another volume), so the server kit's codec
checks the encoding against the message's field table first, as protobuf's own parsers do.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import betterproto2

from pyprovlib._errors import PyprovlibError

__all__ = ["MalformedError", "check_wire"]


class MalformedError(PyprovlibError):
    """The request's bytes are not a valid encoding of its message type. The text names
    fields and offsets, never values (the bytes may hold secrets)."""


# The wire type each protobuf field type is encoded with (packed repeated scalars aside).
_WIRE_VARINT: Final = 0
_WIRE_I64: Final = 1
_WIRE_LEN: Final = 2
_WIRE_GROUP_START: Final = 3
_WIRE_GROUP_END: Final = 4
_WIRE_I32: Final = 5
_WIRE_OF: Final[dict[str, int]] = {
    **dict.fromkeys(
        ("enum", "bool", "int32", "int64", "uint32", "uint64", "sint32", "sint64"), _WIRE_VARINT
    ),
    **dict.fromkeys(("fixed64", "sfixed64", "double"), _WIRE_I64),
    **dict.fromkeys(("fixed32", "sfixed32", "float"), _WIRE_I32),
    **dict.fromkeys(("string", "bytes", "message", "map"), _WIRE_LEN),
}
_MAX_FIELD_NUMBER: Final = (1 << 29) - 1
_MAX_DEPTH: Final = 100
"""protobuf's default recursion limit for nested messages."""


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = 0
    for index in range(10):
        if pos >= len(data):
            raise MalformedError(f"truncated varint at byte {pos}")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << (7 * index)
        if not byte & 0x80:
            if index == 9 and byte > 1:
                raise MalformedError(f"varint overflowing 64 bits ending at byte {pos}")
            return result, pos
    raise MalformedError(f"varint longer than 10 bytes ending at byte {pos}")


def _skip_value(data: bytes, pos: int, number: int, wire: int) -> tuple[int, int]:
    """Check the framing of one field value at ``pos``; returns (start of its payload, end)."""
    if wire == _WIRE_VARINT:
        _, end = _varint(data, pos)
        return pos, end
    if wire in (_WIRE_I64, _WIRE_I32):
        end = pos + (8 if wire == _WIRE_I64 else 4)
        if end > len(data):
            raise MalformedError(f"field {number}: truncated fixed-size value at byte {pos}")
        return pos, end
    if wire == _WIRE_LEN:
        length, start = _varint(data, pos)
        if length > len(data) - start:
            raise MalformedError(
                f"field {number}: length {length} runs past the end of the message"
            )
        return start, start + length
    if wire in (_WIRE_GROUP_START, _WIRE_GROUP_END):
        # proto3 (and CSI) has no groups, and betterproto2 cannot skip one: it would read the
        # group's inner fields as fields of the message.
        raise MalformedError(f"field {number}: groups are not supported")
    raise MalformedError(f"field {number}: invalid wire type {wire}")


def _check_packed(payload: bytes, number: int, wire: int) -> None:
    if wire == _WIRE_VARINT:
        pos = 0
        while pos < len(payload):
            _, pos = _varint(payload, pos)
    elif len(payload) % (8 if wire == _WIRE_I64 else 4):
        raise MalformedError(f"field {number}: packed values of a partial size")


@dataclass(frozen=True)
class _Field:
    name: str
    meta: betterproto2.FieldMetadata
    nested: Callable[[], _Table] | None
    """The field table of a message or map-entry value, built on first use (types may recurse)."""


_Table = dict[int, _Field]


def _message_class(hint: Any) -> type[betterproto2.Message] | None:
    """The message class in a field's type hint (``X``, ``X | None``, ``list[X]``)."""
    if isinstance(hint, type) and issubclass(hint, betterproto2.Message):
        return hint
    for arg in typing.get_args(hint):
        found = _message_class(arg)
        if found is not None:
            return found
    return None


def _nested(meta: betterproto2.FieldMetadata, hint: Any) -> Callable[[], _Table] | None:
    if meta.proto_type == "message":
        sub = meta.unwrap() if meta.unwrap is not None else _message_class(hint)
        if sub is None:
            return None
        message = sub
        return lambda: _table(message)
    if meta.proto_type == "map" and meta.map_meta is not None:
        # A map entry is a message of its own: key = 1, value = 2.
        key, value = meta.map_meta
        args = typing.get_args(hint)
        entry = {
            1: _Field("key", key, None),
            2: _Field("value", value, _nested(value, args[1] if len(args) == 2 else None)),
        }
        return lambda: entry
    return None


@functools.cache
def _table(cls: type[betterproto2.Message]) -> _Table:
    """``cls``'s fields by number, from betterproto2's public per-field metadata
    (``FieldMetadata.get`` over the dataclass fields) and the class's type hints."""
    hints = typing.get_type_hints(cls)
    table: _Table = {}
    for field in dataclasses.fields(typing.cast(Any, cls)):  # generated dataclasses
        meta = betterproto2.FieldMetadata.get(field)
        table[meta.number] = _Field(field.name, meta, _nested(meta, hints.get(field.name)))
    return table


def check_wire(data: bytes, cls: type[betterproto2.Message]) -> None:
    """Raise :class:`MalformedError` unless ``data`` is a valid encoding of ``cls``.

    betterproto2 parses leniently: a truncated field is cut short, a field of the wrong wire
    type lands in the message with the wrong Python type, bad wire types are skipped. A
    handler must never see such a message (a truncated volume name is another volume)."""
    _check(data, _table(cls), 0)


def _check(data: bytes, table: _Table, depth: int) -> None:
    if depth > _MAX_DEPTH:
        raise MalformedError("messages nested too deeply")
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if not 1 <= number <= _MAX_FIELD_NUMBER:
            raise MalformedError(f"invalid field number {number}")
        field = table.get(number)
        start, pos = _skip_value(data, pos, number, wire)
        if field is None:
            continue  # an unknown field: kept as such, as protobuf does
        name, meta = field.name, field.meta
        expected = _WIRE_OF[meta.proto_type]
        payload = data[start:pos]
        if wire != expected:
            if wire == _WIRE_LEN and meta.repeated and expected != _WIRE_LEN:
                _check_packed(payload, number, expected)
                continue
            raise MalformedError(
                f"field {name} ({number}) has wire type {wire}, expected {expected}"
            )
        if meta.proto_type == "string":
            try:
                payload.decode("utf-8")
            except UnicodeDecodeError:
                raise MalformedError(f"field {name} ({number}) is not valid UTF-8") from None
        elif field.nested is not None:
            _check(payload, field.nested(), depth + 1)

"""Strict checking of a request's protobuf bytes before betterproto2 parses them.

betterproto2 parses leniently: a truncated field is cut short, a field of the wrong wire type
lands in the message with the wrong Python type, bad wire types are skipped. A CSI handler must
never see such a message (a truncated volume name is another volume), so the server kit's codec
checks the encoding against the message's field table first, as protobuf's own parsers do.
"""

from __future__ import annotations

from typing import Any, Final

import betterproto2

from pyprovlib.errors import PyprovlibError

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


def check_wire(data: bytes, cls: type[betterproto2.Message], depth: int = 0) -> None:
    """Raise :class:`MalformedError` unless ``data`` is a valid encoding of ``cls``.

    betterproto2 parses leniently: a truncated field is cut short, a field of the wrong wire
    type lands in the message with the wrong Python type, bad wire types are skipped. A
    handler must never see such a message (a truncated volume name is another volume)."""
    if depth > _MAX_DEPTH:
        raise MalformedError("messages nested too deeply")
    # betterproto2's per-class field table (a class property its typing does not express).
    meta: Any = getattr(cls, "_betterproto")  # noqa: B009
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if not 1 <= number <= _MAX_FIELD_NUMBER:
            raise MalformedError(f"invalid field number {number}")
        name = meta.field_name_by_number.get(number)
        start, pos = _skip_value(data, pos, number, wire)
        if name is None:
            continue  # an unknown field: kept as such, as protobuf does
        field = meta.meta_by_field_name[name]
        expected = _WIRE_OF[field.proto_type]
        payload = data[start:pos]
        if wire != expected:
            if wire == _WIRE_LEN and field.repeated and expected != _WIRE_LEN:
                _check_packed(payload, number, expected)
                continue
            raise MalformedError(
                f"field {name} ({number}) has wire type {wire}, expected {expected}"
            )
        if field.proto_type == "string":
            try:
                payload.decode("utf-8")
            except UnicodeDecodeError:
                raise MalformedError(f"field {name} ({number}) is not valid UTF-8") from None
        elif field.proto_type == "message":
            sub: type[betterproto2.Message] = (
                field.unwrap() if field.unwrap is not None else meta.cls_by_field[name]
            )
            check_wire(payload, sub, depth + 1)
        elif field.proto_type == "map":
            check_wire(payload, meta.cls_by_field[name], depth + 1)

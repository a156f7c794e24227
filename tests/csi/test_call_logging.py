"""Logging of CSI calls never changes or loses an answer (issue 21).

Regression: ``redact._plain`` did not know the ``datetime`` betterproto2 makes of a
``google.protobuf.Timestamp``, so rendering a CreateSnapshot response for the "csi call done"
debug line raised; on the server that happened before the answer was sent (the client got
UNKNOWN for a snapshot that existed), in ``CSIConnection.call`` it raised into the caller.

Every CSI message type is rendered here with every field set — real Timestamps, wrapper types,
oneof members, maps, enums, nested messages — and every unary RPC of every service is served and
called with debug logging on, and again with a logging pipeline that raises on every line.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import io
import json
import logging
import pathlib
import typing
from collections.abc import Iterator
from typing import Any

import betterproto2
import pytest
import structlog
from grpclib.client import Channel, UnaryUnaryMethod
from structlog.typing import EventDict

from pyprovlib.csi._connection import ConnectionOptions, CSIConnection
from pyprovlib.csi._proto.csi import v1
from pyprovlib.csi._redact import STRIPPED, is_secret_field, sanitize, strip_secrets
from pyprovlib.csi._server import (
    ControllerService,
    CSIServer,
    GroupControllerService,
    IdentityService,
    NodeService,
)
from pyprovlib.runtime._logging import configure_logging

WHEN = datetime.datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=datetime.UTC)
SECRET = "hunter2-very-secret"


def _unwrapped(cls: type[Any]) -> Any:
    """The Python value betterproto2 uses for a well-known wrapper type."""
    name = cls.__name__
    if name == "Timestamp":
        return WHEN
    if name == "Duration":
        return datetime.timedelta(seconds=90, microseconds=500)
    if name == "BoolValue":
        return True
    if name in ("StringValue",):
        return "wrapped"
    if name == "BytesValue":
        return b"\x00\x01"
    if name in ("FloatValue", "DoubleValue"):
        return 0.5
    return 0  # integer wrappers at zero: set, and must still be rendered


def _scalar(proto_type: str, hint: Any) -> Any:
    if proto_type == "string":
        return "plain"
    if proto_type == "bytes":
        return b"\xffbytes"
    if proto_type == "bool":
        return True
    if proto_type in ("float", "double"):
        return 1.5
    if proto_type == "enum":
        members = [m for m in hint if m.value != 0]
        return members[0] if members else next(iter(hint))
    return 7


def _strip_optional(hint: Any) -> Any:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (typing.Union, __import__("types").UnionType):
        return args[0]
    return hint


def populate(cls: type[betterproto2.Message], depth: int = 0) -> Any:
    """An instance of ``cls`` with every field set (the first member of each oneof)."""
    hints = typing.get_type_hints(cls)
    groups: set[str] = set()
    values: dict[str, Any] = {}
    for field in dataclasses.fields(cast_any(cls)):
        meta = field.metadata["betterproto"]
        if meta.group:
            if meta.group in groups:
                continue
            groups.add(meta.group)
        hint = _strip_optional(hints[field.name])
        if meta.proto_type == "map":
            _key_hint, value_hint = typing.get_args(hint)
            value = _field_value(meta.map_meta[1], value_hint, depth)
            values[field.name] = {"key": value} if value is not None else {}
        elif meta.repeated:
            (item_hint,) = typing.get_args(hint)
            item = _field_value(meta, item_hint, depth)
            values[field.name] = [item] if item is not None else []
        else:
            value = _field_value(meta, hint, depth)
            if value is not None:
                values[field.name] = value
        if is_secret_field(cls, field.name):
            values[field.name] = {"password": SECRET} if meta.proto_type == "map" else SECRET
    return cls(**values)


def _field_value(meta: Any, hint: Any, depth: int) -> Any:
    if meta.proto_type == "message":
        if meta.unwrap is not None:
            return _unwrapped(meta.unwrap())
        if depth >= 4:
            return None
        return populate(hint, depth + 1)
    return _scalar(meta.proto_type, hint)


def cast_any(value: Any) -> Any:
    return value


def message_classes() -> list[type[betterproto2.Message]]:
    return sorted(
        (
            obj
            for obj in vars(v1).values()
            if isinstance(obj, type)
            and issubclass(obj, betterproto2.Message)
            and obj is not betterproto2.Message
        ),
        key=lambda c: c.__name__,
    )


def _walk_values(value: Any) -> Iterator[Any]:
    if isinstance(value, dict):
        for item in value.values():
            yield from _walk_values(item)
    elif isinstance(value, list):
        for item in value:
            yield from _walk_values(item)
    else:
        yield value


@pytest.mark.parametrize("cls", message_classes(), ids=lambda c: c.__name__)
def test_every_csi_message_renders_with_every_field_set(cls: type[betterproto2.Message]) -> None:
    message = populate(cls)
    assert type(message).parse(bytes(message)) == message  # a valid, complete message
    rendered = json.loads(sanitize(message))
    as_dict = strip_secrets(message)
    assert rendered == json.loads(json.dumps(as_dict))
    for field in dataclasses.fields(cast_any(cls)):
        if is_secret_field(cls, field.name) and getattr(message, field.name):
            assert rendered[field.name] == STRIPPED
    hints = typing.get_type_hints(cls)
    for name, hint in hints.items():
        if "datetime" in str(hint) and getattr(message, name) is not None:
            assert rendered[name] == "2026-01-02T03:04:05.678000Z"
    # Wrapper values at zero are set, not absent.
    for field in dataclasses.fields(cast_any(cls)):
        meta = field.metadata["betterproto"]
        if meta.unwrap is not None and getattr(message, field.name) == 0:
            assert rendered[field.name] == 0


def test_durations_and_other_values_render() -> None:
    # No CSI message has a Duration today (betterproto2 would make it a timedelta); its
    # rendering is protobuf JSON's all the same.
    from pyprovlib.csi import _redact as redact

    assert redact._plain(datetime.timedelta(seconds=90, microseconds=500)) == "90.0005s"
    assert redact._plain(datetime.timedelta(0)) == "0s"
    naive = datetime.datetime(2026, 1, 2, 3, 4, 5)
    assert redact._plain(naive) == "2026-01-02T03:04:05Z"

    class Odd:
        def __str__(self) -> str:
            return "odd"

    assert redact._plain(Odd()) == "odd"
    E = enum.Enum("E", "A")
    assert redact._plain(E.A) == "A"


# -- every unary RPC served and called, logging on -----------------------------------------------

SERVICES: list[tuple[type[Any], type[Any]]] = [
    (v1.IdentityBase, v1.IdentityStub),
    (v1.ControllerBase, v1.ControllerStub),
    (v1.NodeBase, v1.NodeStub),
    (v1.GroupControllerBase, v1.GroupControllerStub),
]


def answering_services() -> tuple[list[Any], dict[str, tuple[Any, Any]]]:
    """Kit services whose every unary RPC answers a fully populated response; and, per
    method path, the populated request to send and the response to expect."""
    services: list[Any] = [
        IdentityService("logging.test", "1"),
        ControllerService(),
        NodeService("node"),
        GroupControllerService(),
    ]
    calls: dict[str, tuple[Any, Any]] = {}
    for service in services:
        for path, handler in service.__mapping__().items():
            if handler.cardinality.name != "UNARY_UNARY":
                continue
            request, response = populate(handler.request_type), populate(handler.reply_type)

            async def answer(message: Any, response: Any = response) -> Any:
                return response

            name = betterproto2.casing.snake_case(path.rsplit("/", 1)[1])
            setattr(service, name, answer)
            calls[path] = (request, response)
    return services, calls


async def call_everything(path: pathlib.Path, calls: dict[str, tuple[Any, Any]]) -> None:
    channel = Channel(path=str(path))
    try:
        for method, (request, response) in calls.items():
            call = UnaryUnaryMethod(channel, method, type(request), type(response))
            assert await call(request, timeout=10) == response, method
    finally:
        channel.close()


@pytest.fixture
def debug_json_logs() -> Iterator[io.StringIO]:
    saved = structlog.get_config()
    buffer = io.StringIO()
    configure_logging("json", "debug", stream=buffer)
    try:
        yield buffer
    finally:
        configure_logging("json", "warning", stream=io.StringIO())
        structlog.configure(**saved)


async def test_every_unary_rpc_answers_with_debug_logging(
    sock_dir: pathlib.Path, debug_json_logs: io.StringIO, capsys: pytest.CaptureFixture[str]
) -> None:
    services, calls = answering_services()
    assert len(calls) >= 30  # every unary RPC of the four services
    path = sock_dir / "csi.sock"
    async with CSIServer(services, f"unix://{path}", check_capabilities=False):
        await call_everything(path, calls)
    lines = [json.loads(line) for line in debug_json_logs.getvalue().splitlines()]
    done = [line for line in lines if line["event"] == "csi call done"]
    assert len(done) == len(calls)
    assert any("2026-01-02T03:04:05.678000Z" in line["response"] for line in done)
    assert all(SECRET not in json.dumps(line) for line in lines)
    assert "Logging error" not in capsys.readouterr().err


def _raise(_logger: Any, _method: str, _event: EventDict) -> EventDict:
    raise TypeError("a log processor that fails")


@pytest.fixture
def failing_logs() -> Iterator[None]:
    saved = structlog.get_config()
    logger = logging.getLogger("pyprovlib")
    level = logger.level
    logger.setLevel(logging.DEBUG)  # every call line is processed, and fails
    structlog.configure(processors=[_raise], cache_logger_on_first_use=False)
    try:
        yield
    finally:
        structlog.configure(**saved)
        logger.setLevel(level)


async def test_a_failing_log_pipeline_changes_no_answer(
    sock_dir: pathlib.Path, failing_logs: None
) -> None:
    services, calls = answering_services()
    path = sock_dir / "csi.sock"
    async with CSIServer(services, f"unix://{path}", check_capabilities=False):
        await call_everything(path, calls)
        # And the client side: CSIConnection logs every call it makes.
        connection = await CSIConnection.open(str(path), ConnectionOptions())
        try:
            for method in ("/csi.v1.Controller/CreateSnapshot", "/csi.v1.Controller/ListSnapshots"):
                request, response = calls[method]
                assert await connection.call(method, request) == response
        finally:
            connection.close()


async def test_snapshot_answers_reach_the_client_under_default_logging(
    sock_dir: pathlib.Path,
) -> None:
    # Nothing configured, as a library user starts: the answer holding a Timestamp arrives.
    services, calls = answering_services()
    path = sock_dir / "csi.sock"
    async with CSIServer(services, f"unix://{path}", check_capabilities=False):
        connection = await CSIConnection.open(str(path), ConnectionOptions())
        try:
            request, response = calls["/csi.v1.Controller/CreateSnapshot"]
            answer = await connection.call("/csi.v1.Controller/CreateSnapshot", request)
            assert answer == response
            assert answer.snapshot.creation_time == WHEN
        finally:
            connection.close()

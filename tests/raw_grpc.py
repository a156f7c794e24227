"""Calling a gRPC server with hand-made bytes: a grpclib codec that sends a payload as it is,
and :func:`raw_call`, for tests that give a CSI server bytes no generated stub would send
(tests/csi and tests/reliability; here at the root of ``tests/``, which pytest puts on
``sys.path``)."""

from __future__ import annotations

import pathlib
from typing import Any

from grpclib.client import Channel, UnaryUnaryMethod
from grpclib.encoding.base import CodecBase
from grpclib.exceptions import GRPCError


class RawCodec(CodecBase):
    """The ``proto`` content subtype with no encoding: bytes in, bytes out."""

    __content_subtype__ = "proto"

    def encode(self, message: Any, message_type: Any) -> bytes:
        assert isinstance(message, bytes)
        return message

    def decode(self, data: bytes, message_type: Any) -> Any:
        return data


async def raw_call(path: pathlib.Path, method: str, payload: bytes) -> tuple[int, str]:
    """Call ``method`` on the unix socket ``path`` with ``payload`` as the message bytes:
    (the gRPC status code, its message); (0, "") when the call succeeds."""
    channel = Channel(path=str(path), codec=RawCodec())
    try:
        call: UnaryUnaryMethod[bytes, bytes] = UnaryUnaryMethod(channel, method, bytes, bytes)
        try:
            await call(payload, timeout=5)
        except GRPCError as err:
            return err.status.value, err.message or ""
        return 0, ""
    finally:
        channel.close()

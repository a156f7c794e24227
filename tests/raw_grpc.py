"""A grpclib codec that sends a payload's bytes as they are and hands back the reply's bytes,
for tests that give a CSI server bytes no generated stub would send (tests/csi and
tests/reliability; here at the root of ``tests/``, which pytest puts on ``sys.path``)."""

from __future__ import annotations

from typing import Any

from grpclib.encoding.base import CodecBase


class RawCodec(CodecBase):
    """The ``proto`` content subtype with no encoding: bytes in, bytes out."""

    __content_subtype__ = "proto"

    def encode(self, message: Any, message_type: Any) -> bytes:
        assert isinstance(message, bytes)
        return message

    def decode(self, data: bytes, message_type: Any) -> Any:
        return data

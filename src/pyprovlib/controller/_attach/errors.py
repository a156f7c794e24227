"""The attach controller's errors: options out of range, and an attach or detach call that ran
out of time (turned into an in-progress :class:`~pyprovlib.AttachError`, as a CSI call's
deadline would be)."""

from __future__ import annotations

import asyncio
from typing import Any

from pyprovlib._attacher import AttachError, GrpcCode
from pyprovlib._errors import InvalidOptionsError

__all__ = ["InvalidAttachOptionsError", "OperationTimeout", "error_code"]


class InvalidAttachOptionsError(InvalidOptionsError):
    """An :class:`~pyprovlib.AttachControllerOptions` field is out of range."""


class OperationTimeout:
    """``asyncio.timeout`` for one attach/detach call that turns the timeout into an
    in-progress :class:`AttachError` (gRPC DeadlineExceeded, as a CSI call's context would)."""

    def __init__(self, seconds: float, op: str, volume_id: str, node: str) -> None:
        self._cm = asyncio.timeout(seconds)
        self._seconds = seconds
        self._what = f"{op} of volume {volume_id} on node {node}"

    async def __aenter__(self) -> None:
        await self._cm.__aenter__()

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        try:
            await self._cm.__aexit__(exc_type, exc, tb)
        except TimeoutError:
            raise AttachError(
                f"{self._what} timed out after {self._seconds:g}s; it may still be in progress",
                code=GrpcCode.DEADLINE_EXCEEDED,
            ) from None
        return False


def error_code(err: BaseException) -> int | None:
    """The gRPC code an attacher gave its error (recorded in the VolumeAttachment's status)."""
    return err.code if isinstance(err, AttachError) else None

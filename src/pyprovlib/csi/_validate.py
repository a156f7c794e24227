"""Request checks every CSI driver repeats, answering with the codes the CSI spec names.

Each helper raises :class:`~pyprovlib.csi.CSIError` with the spec's code — a missing
required field is INVALID_ARGUMENT, a capacity range the driver cannot satisfy OUT_OF_RANGE —
so a handler starts with a few lines::

    async def create_volume(self, message):
        require(message, "name", "volume_capabilities")
        check_volume_capabilities(message.volume_capabilities)
        size = capacity_from_range(message.capacity_range, default=1 << 30, maximum=self.free)

Messages name the field (as the spec spells it), never a value: a value may be a secret.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any

import betterproto2
from grpclib.const import Status

from pyprovlib._errors import PyprovlibError
from pyprovlib.csi._proto.csi import v1
from pyprovlib.csi._redact import full_name

__all__ = [
    "CSIError",
    "capacity_from_range",
    "check_volume_capabilities",
    "check_volume_capability",
    "require",
    "unsupported_capability",
]

AccessMode = v1.VolumeCapabilityAccessModeMode


class CSIError(PyprovlibError):
    """Raised by a service method to answer with a deliberate gRPC status.

    The message goes to the caller as the status message: never put secrets in it.
    """

    def __init__(self, status: Status, message: str) -> None:
        super().__init__(f"{status.name}: {message}")
        self.status = status
        self.message = message


def _present(value: Any) -> bool:
    if value is None:
        return False
    if isinstance(value, betterproto2.Message):
        return True
    return bool(value)


def require(message: betterproto2.Message, *fields: str) -> None:
    """INVALID_ARGUMENT naming the first of ``fields`` that ``message`` leaves unset or empty
    (an empty string, list or map counts as missing, as the spec's "REQUIRED" means)."""
    for name in fields:
        if not _present(getattr(message, name)):
            kind = full_name(type(message)).rsplit(".", 1)[-1]
            raise CSIError(Status.INVALID_ARGUMENT, f"{kind}: {name} is required")


def unsupported_capability(
    capability: v1.VolumeCapability,
    *,
    access_modes: Collection[AccessMode] | None = None,
    block: bool = True,
    mount: bool = True,
    fs_types: Collection[str] | None = None,
) -> str | None:
    """Why the driver cannot serve ``capability``, or None when it can.

    For ValidateVolumeCapabilities, which answers an unsupported capability with an empty
    ``confirmed`` and this reason rather than an error. ``access_modes`` None accepts any
    mode; ``fs_types`` None accepts any file system (an empty ``fs_type`` always passes).
    """
    if capability.block is None and capability.mount is None:
        return "a volume capability needs an access type (block or mount)"
    if capability.access_mode is None or capability.access_mode.mode == AccessMode.UNKNOWN:
        return "a volume capability needs an access mode"
    if capability.block is not None and not block:
        return "block access is not supported"
    if capability.mount is not None:
        if not mount:
            return "mount access is not supported"
        fs_type = capability.mount.fs_type
        if fs_type and fs_types is not None and fs_type not in fs_types:
            return f"file system type {fs_type!r} is not supported"
    mode = capability.access_mode.mode
    if access_modes is not None and mode not in access_modes:
        return f"access mode {AccessMode(mode).name} is not supported"
    return None


def check_volume_capabilities(
    capabilities: Iterable[v1.VolumeCapability] | None,
    *,
    access_modes: Collection[AccessMode] | None = None,
    block: bool = True,
    mount: bool = True,
    fs_types: Collection[str] | None = None,
    field: str = "volume_capabilities",
) -> None:
    """INVALID_ARGUMENT unless ``capabilities`` is non-empty and each one is well formed and
    supported (see :func:`unsupported_capability` for the options). For CreateVolume,
    ControllerPublish and the node calls, which fail on a capability they cannot serve."""
    items = list(capabilities or ())
    if not items:
        raise CSIError(Status.INVALID_ARGUMENT, f"{field} is required")
    for capability in items:
        reason = unsupported_capability(
            capability, access_modes=access_modes, block=block, mount=mount, fs_types=fs_types
        )
        if reason is not None:
            raise CSIError(Status.INVALID_ARGUMENT, f"{field}: {reason}")


def check_volume_capability(
    capability: v1.VolumeCapability | None,
    *,
    access_modes: Collection[AccessMode] | None = None,
    block: bool = True,
    mount: bool = True,
    fs_types: Collection[str] | None = None,
    field: str = "volume_capability",
) -> v1.VolumeCapability:
    """:func:`check_volume_capabilities` for the one ``volume_capability`` of
    ControllerPublish, NodeStage and NodePublish; returns it."""
    if capability is None:
        raise CSIError(Status.INVALID_ARGUMENT, f"{field} is required")
    check_volume_capabilities(
        [capability],
        access_modes=access_modes,
        block=block,
        mount=mount,
        fs_types=fs_types,
        field=field,
    )
    return capability


def capacity_from_range(
    capacity_range: v1.CapacityRange | None,
    *,
    default: int,
    maximum: int | None = None,
    granularity: int = 1,
) -> int:
    """The size to create for ``capacity_range``: ``required_bytes`` rounded up to
    ``granularity`` (``default`` when neither bound is set), never over ``limit_bytes``.

    Negative bounds are INVALID_ARGUMENT; a range no size satisfies (a limit below the
    requirement, or one that rounding cannot meet) or a size over ``maximum`` (what the
    driver can provide) is OUT_OF_RANGE, as CreateVolume and ControllerExpandVolume answer.
    """
    if granularity < 1:
        raise ValueError(f"granularity must be at least 1, got {granularity}")
    required = capacity_range.required_bytes if capacity_range is not None else 0
    limit = capacity_range.limit_bytes if capacity_range is not None else 0
    if required < 0 or limit < 0:
        raise CSIError(Status.INVALID_ARGUMENT, "capacity_range bounds must not be negative")
    if limit and required > limit:
        raise CSIError(
            Status.OUT_OF_RANGE,
            f"capacity_range: required_bytes {required} is over limit_bytes {limit}",
        )
    if required:
        size = -(-required // granularity) * granularity
    elif limit:
        size = min(default, limit) if default else limit
    else:
        size = default
    if limit and size > limit:
        raise CSIError(
            Status.OUT_OF_RANGE,
            f"capacity_range: no size in steps of {granularity} bytes fits between "
            f"{required} and {limit}",
        )
    if maximum is not None and size > maximum:
        raise CSIError(
            Status.OUT_OF_RANGE, f"capacity_range: {size} bytes is over the maximum {maximum}"
        )
    return size

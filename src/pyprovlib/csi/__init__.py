"""CSI over gRPC: connections to a driver, and a kit for serving CSI from Python.

- A connection to a driver: :class:`CSIConnection` (with :class:`ConnectionOptions`),
  its errors and its metrics (:class:`CSIMetrics`); :func:`sanitize` and
  :func:`strip_secrets` keep secrets out of what is logged.
- Serving CSI: :class:`CSIServer` runs the :class:`IdentityService`,
  :class:`ControllerService`, :class:`NodeService` and :class:`GroupControllerService` a driver
  subclasses; :class:`CSIError` answers with a gRPC status, and :func:`require`,
  :func:`capacity_from_range` and :func:`check_volume_capabilities` check a request.
- The messages and enums of the CSI spec: :mod:`pyprovlib.csi.messages`.
- The sidecars, each runnable with ``python -m``: :mod:`pyprovlib.csi.provisioner`,
  :mod:`pyprovlib.csi.attacher`, :mod:`pyprovlib.csi.resizer`; all three in one process with
  ``python -m pyprovlib.csi``.

The modules whose names start with ``_`` are internal.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyprovlib._reexports import lazy_reexports

if TYPE_CHECKING:
    from grpclib.const import Status

    from pyprovlib.csi._connection import (
        ConnectionOptions,
        CSICallError,
        CSIConnection,
        CSIConnectionLost,
        CSIMetrics,
        DriverNotReadyError,
        PluginCapabilities,
    )
    from pyprovlib.csi._redact import sanitize, strip_secrets
    from pyprovlib.csi._server import (
        CapabilityError,
        ControllerService,
        CSIError,
        CSIServer,
        GroupControllerService,
        IdentityService,
        NodeService,
    )
    from pyprovlib.csi._validate import (
        capacity_from_range,
        check_volume_capabilities,
        check_volume_capability,
        require,
        unsupported_capability,
    )

__all__ = [
    "CSICallError",
    "CSIConnection",
    "CSIConnectionLost",
    "CSIError",
    "CSIMetrics",
    "CSIServer",
    "CapabilityError",
    "ConnectionOptions",
    "ControllerService",
    "DriverNotReadyError",
    "GroupControllerService",
    "IdentityService",
    "NodeService",
    "PluginCapabilities",
    "Status",
    "capacity_from_range",
    "check_volume_capabilities",
    "check_volume_capability",
    "require",
    "sanitize",
    "strip_secrets",
    "unsupported_capability",
]

# Imported on first use, so `python -m pyprovlib.csi` reaches its __main__ first.
__getattr__, __dir__ = lazy_reexports(
    __name__,
    {
        "._connection": [
            "CSICallError",
            "CSIConnection",
            "CSIConnectionLost",
            "CSIMetrics",
            "ConnectionOptions",
            "DriverNotReadyError",
            "PluginCapabilities",
        ],
        "._redact": ["sanitize", "strip_secrets"],
        "._server": [
            "CSIError",
            "CSIServer",
            "CapabilityError",
            "ControllerService",
            "GroupControllerService",
            "IdentityService",
            "NodeService",
        ],
        "grpclib.const": ["Status"],
        "._validate": [
            "capacity_from_range",
            "check_volume_capabilities",
            "check_volume_capability",
            "require",
            "unsupported_capability",
        ],
    },
)

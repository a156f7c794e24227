"""hostpath example backend: local PersistentVolumes in ``<basePath>/<pv name>`` on the node the
scheduler picked (OpenEBS local-hostpath style). Run it with ``python -m
pyprovlib.examples.hostpath`` (``--demo`` for a self-contained tour)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyprovlib._reexports import lazy_reexports

if TYPE_CHECKING:
    from pyprovlib.examples.hostpath._provisioner import (
        HostPathParameters,
        HostPathProvisioner,
        NodeHostPathProvisioner,
    )

__all__ = [
    "HostPathParameters",
    "HostPathProvisioner",
    "NodeHostPathProvisioner",
]

# Imported on first use, so `python -m pyprovlib.examples.hostpath` reaches its __main__ first.
__getattr__, __dir__ = lazy_reexports(
    __name__,
    {
        "._provisioner": ["HostPathParameters", "HostPathProvisioner", "NodeHostPathProvisioner"],
    },
)

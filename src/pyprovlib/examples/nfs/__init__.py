"""NFS example backend: each volume a subdirectory of one NFS export
(nfs-subdir-external-provisioner style). Run it with ``python -m pyprovlib.examples.nfs``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyprovlib._reexports import lazy_reexports

if TYPE_CHECKING:
    from pyprovlib.examples.nfs._provisioner import NFSParameters, NFSProvisioner

__all__ = [
    "NFSParameters",
    "NFSProvisioner",
]

# Imported on first use, so `python -m pyprovlib.examples.nfs` reaches its __main__ first.
__getattr__, __dir__ = lazy_reexports(
    __name__,
    {
        "._provisioner": ["NFSParameters", "NFSProvisioner"],
    },
)

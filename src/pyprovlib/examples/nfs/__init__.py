"""NFS example backend: each volume a subdirectory of one NFS export
(nfs-subdir-external-provisioner style). Run it with ``python -m pyprovlib.examples.nfs``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyprovlib._reexports import lazy_reexports

if TYPE_CHECKING:
    from pyprovlib.examples.nfs.provisioner import (
        DEFAULT_DIR_MODE,
        DEFAULT_MOUNT_PATH,
        DEFAULT_PROVISIONER_NAME,
        NFSParameters,
        NFSProvisioner,
        expand_path_pattern,
        parse_parameters,
    )

__all__ = [
    "DEFAULT_DIR_MODE",
    "DEFAULT_MOUNT_PATH",
    "DEFAULT_PROVISIONER_NAME",
    "NFSParameters",
    "NFSProvisioner",
    "expand_path_pattern",
    "parse_parameters",
]

# Imported on first use, so `python -m pyprovlib.examples.nfs` reaches its __main__ first.
__getattr__, __dir__ = lazy_reexports(
    __name__,
    {
        ".provisioner": [
            "DEFAULT_DIR_MODE",
            "DEFAULT_MOUNT_PATH",
            "DEFAULT_PROVISIONER_NAME",
            "NFSParameters",
            "NFSProvisioner",
            "expand_path_pattern",
            "parse_parameters",
        ],
    },
)

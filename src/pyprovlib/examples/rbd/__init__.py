"""Ceph RBD example backend: the in-tree Kubernetes RBD provisioner's behaviour on pyprovlib,
each volume an RBD image created and deleted with the ``rbd`` command. Run it with
``python -m pyprovlib.examples.rbd``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyprovlib._reexports import lazy_reexports

if TYPE_CHECKING:
    from pyprovlib.examples.rbd.provisioner import (
        DEFAULT_PROVISIONER_NAME,
        IMAGE_PREFIX,
        RBDParameters,
        RBDProvisioner,
        RBDVolumeRef,
        VolumeInUseError,
        image_name_for,
        parse_parameters,
    )
    from pyprovlib.examples.rbd.rbd_cli import (
        CephCredentials,
        ImageInfo,
        RbdBinaryNotFoundError,
        RbdError,
        RbdRunner,
    )
    from pyprovlib.examples.rbd.resizer import (
        RBDResizer,
    )

__all__ = [
    "DEFAULT_PROVISIONER_NAME",
    "IMAGE_PREFIX",
    "CephCredentials",
    "ImageInfo",
    "RBDParameters",
    "RBDProvisioner",
    "RBDResizer",
    "RBDVolumeRef",
    "RbdBinaryNotFoundError",
    "RbdError",
    "RbdRunner",
    "VolumeInUseError",
    "image_name_for",
    "parse_parameters",
]

# Imported on first use, so `python -m pyprovlib.examples.rbd` reaches its __main__ first.
__getattr__, __dir__ = lazy_reexports(
    __name__,
    {
        ".provisioner": [
            "DEFAULT_PROVISIONER_NAME",
            "IMAGE_PREFIX",
            "RBDParameters",
            "RBDProvisioner",
            "RBDVolumeRef",
            "VolumeInUseError",
            "image_name_for",
            "parse_parameters",
        ],
        ".rbd_cli": [
            "CephCredentials",
            "ImageInfo",
            "RbdBinaryNotFoundError",
            "RbdError",
            "RbdRunner",
        ],
        ".resizer": ["RBDResizer"],
    },
)

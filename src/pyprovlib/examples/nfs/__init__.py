"""NFS example backend: each volume a subdirectory of one NFS export
(nfs-subdir-external-provisioner style). Run it with ``python -m pyprovlib.examples.nfs``."""

from pyprovlib.examples.nfs.provisioner import (
    DEFAULT_MOUNT_PATH,
    DEFAULT_PROVISIONER_NAME,
    NFSParameters,
    NFSProvisioner,
    expand_path_pattern,
    parse_parameters,
)

__all__ = [
    "DEFAULT_MOUNT_PATH",
    "DEFAULT_PROVISIONER_NAME",
    "NFSParameters",
    "NFSProvisioner",
    "expand_path_pattern",
    "parse_parameters",
]

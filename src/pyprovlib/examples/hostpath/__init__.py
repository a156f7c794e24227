"""hostpath example backend: local PersistentVolumes in ``<basePath>/<pv name>`` on the node the
scheduler picked (OpenEBS local-hostpath style). Run it with ``python -m
pyprovlib.examples.hostpath`` (``--demo`` for a self-contained tour)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyprovlib._reexports import lazy_reexports

if TYPE_CHECKING:
    from pyprovlib.examples.hostpath.helper_pod import (
        DEFAULT_HELPER_IMAGE,
        DEFAULT_HELPER_TIMEOUT,
        HELPER_MOUNT_PATH,
        LABEL_HELPER_OPERATION,
        LABEL_MANAGED_BY,
        HelperPodDirectories,
        HelperPodError,
        helper_command,
        helper_pod_name,
    )
    from pyprovlib.examples.hostpath.provisioner import (
        ANNOTATION_NODE,
        ANNOTATION_ON_DELETE,
        ANNOTATION_SELECTED_NODE,
        DEFAULT_BASE_PATH,
        DEFAULT_DIR_MODE,
        DEFAULT_PROVISIONER_NAME,
        HOSTNAME_LABEL,
        HostPathParameters,
        HostPathProvisioner,
        LocalDirectories,
        NodeHostPathProvisioner,
        NodeInfo,
        VolumeDirectories,
        archived_name,
        parse_parameters,
    )

__all__ = [
    "ANNOTATION_NODE",
    "ANNOTATION_ON_DELETE",
    "ANNOTATION_SELECTED_NODE",
    "DEFAULT_BASE_PATH",
    "DEFAULT_DIR_MODE",
    "DEFAULT_HELPER_IMAGE",
    "DEFAULT_HELPER_TIMEOUT",
    "DEFAULT_PROVISIONER_NAME",
    "HELPER_MOUNT_PATH",
    "HOSTNAME_LABEL",
    "LABEL_HELPER_OPERATION",
    "LABEL_MANAGED_BY",
    "HelperPodDirectories",
    "HelperPodError",
    "HostPathParameters",
    "HostPathProvisioner",
    "LocalDirectories",
    "NodeHostPathProvisioner",
    "NodeInfo",
    "VolumeDirectories",
    "archived_name",
    "helper_command",
    "helper_pod_name",
    "parse_parameters",
]

# Imported on first use, so `python -m pyprovlib.examples.hostpath` reaches its __main__ first.
__getattr__, __dir__ = lazy_reexports(
    __name__,
    {
        ".provisioner": [
            "ANNOTATION_NODE",
            "ANNOTATION_ON_DELETE",
            "ANNOTATION_SELECTED_NODE",
            "DEFAULT_BASE_PATH",
            "DEFAULT_DIR_MODE",
            "DEFAULT_PROVISIONER_NAME",
            "HOSTNAME_LABEL",
            "HostPathParameters",
            "HostPathProvisioner",
            "LocalDirectories",
            "NodeHostPathProvisioner",
            "NodeInfo",
            "VolumeDirectories",
            "archived_name",
            "parse_parameters",
        ],
        ".helper_pod": [
            "DEFAULT_HELPER_IMAGE",
            "DEFAULT_HELPER_TIMEOUT",
            "HELPER_MOUNT_PATH",
            "LABEL_HELPER_OPERATION",
            "LABEL_MANAGED_BY",
            "HelperPodDirectories",
            "HelperPodError",
            "helper_command",
            "helper_pod_name",
        ],
    },
)

"""hostpath example backend: local PersistentVolumes in ``<basePath>/<pv name>`` on the node the
scheduler picked (OpenEBS local-hostpath style). Run it with ``python -m
pyprovlib.examples.hostpath`` (``--demo`` for a self-contained tour)."""

from pyprovlib.examples.hostpath.helper_pod import HelperPodDirectories, HelperPodError
from pyprovlib.examples.hostpath.provisioner import (
    DEFAULT_BASE_PATH,
    DEFAULT_PROVISIONER_NAME,
    HostPathParameters,
    HostPathProvisioner,
    LocalDirectories,
    NodeHostPathProvisioner,
    NodeInfo,
    VolumeDirectories,
    parse_parameters,
)

__all__ = [
    "DEFAULT_BASE_PATH",
    "DEFAULT_PROVISIONER_NAME",
    "HelperPodDirectories",
    "HelperPodError",
    "HostPathParameters",
    "HostPathProvisioner",
    "LocalDirectories",
    "NodeHostPathProvisioner",
    "NodeInfo",
    "VolumeDirectories",
    "parse_parameters",
]

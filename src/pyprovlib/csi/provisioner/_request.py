"""What a CreateVolume request is made of, from the claim and its class: the volume name
(upstream's ``makeVolumeName``), the class parameters split between the driver and the
provisioner's own ``csi.storage.k8s.io/`` keys, and the volume capabilities
(``getVolumeCapabilities``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from pyprovlib._provisioner import ProvisioningError
from pyprovlib.csi._proto.csi import v1
from pyprovlib.csi.provisioner._secrets import CSI_PARAMETER_PREFIX, SECRET_PARAMETER_KEYS

__all__ = [
    "FSTYPE_KEY",
    "KNOWN_PARAMETER_KEYS",
    "PVC_NAMESPACE_KEY",
    "PVC_NAME_KEY",
    "PV_NAME_KEY",
    "make_volume_name",
    "split_parameters",
    "volume_capabilities",
]

FSTYPE_KEY: Final = CSI_PARAMETER_PREFIX + "fstype"
"""Class parameter: the filesystem of mounted volumes."""
PVC_NAME_KEY: Final = CSI_PARAMETER_PREFIX + "pvc/name"
"""CreateVolume parameter with ``extra_create_metadata``: the claim's name."""
PVC_NAMESPACE_KEY: Final = CSI_PARAMETER_PREFIX + "pvc/namespace"
"""CreateVolume parameter with ``extra_create_metadata``: the claim's namespace."""
PV_NAME_KEY: Final = CSI_PARAMETER_PREFIX + "pv/name"
"""CreateVolume parameter with ``extra_create_metadata``: the PV's name."""
KNOWN_PARAMETER_KEYS: Final = frozenset(
    {FSTYPE_KEY, PVC_NAME_KEY, PVC_NAMESPACE_KEY, PV_NAME_KEY} | SECRET_PARAMETER_KEYS
)
"""Every key under ``csi.storage.k8s.io/`` a StorageClass may use; any other is an error."""

AccessMode = v1.VolumeCapabilityAccessModeMode


def make_volume_name(prefix: str, claim_uid: str, uuid_length: int) -> str:
    """The CreateVolume name: ``<prefix>-<claim uid>``, the uid cut to ``uuid_length``
    characters (dashes removed) unless that is -1 (upstream's ``makeVolumeName``)."""
    if not prefix:
        raise ValueError("volume name prefix cannot be empty")
    if not claim_uid:
        raise ValueError("claim has no UID")
    if uuid_length == -1:
        return f"{prefix}-{claim_uid}"
    if uuid_length < 0:
        raise ValueError(f"volume name UUID length {uuid_length} must be -1 or positive")
    return f"{prefix}-{claim_uid.replace('-', '')[:uuid_length]}"


def volume_capabilities(
    access_modes: Sequence[str],
    *,
    block: bool,
    fs_type: str,
    mount_flags: Sequence[str],
    single_node_multi_writer: bool = False,
) -> list[v1.VolumeCapability]:
    """One VolumeCapability per access mode, mount (fsType, flags) or block
    (upstream's ``getVolumeCapabilities``)."""
    if not access_modes:
        raise ValueError("claim has no access modes")
    caps: list[v1.VolumeCapability] = []
    for mode in access_modes:
        if mode == "ReadWriteOnce":
            csi_mode = (
                AccessMode.SINGLE_NODE_MULTI_WRITER
                if single_node_multi_writer
                else AccessMode.SINGLE_NODE_WRITER
            )
        elif mode == "ReadWriteOncePod":
            csi_mode = (
                AccessMode.SINGLE_NODE_SINGLE_WRITER
                if single_node_multi_writer
                else AccessMode.SINGLE_NODE_WRITER
            )
        elif mode == "ReadOnlyMany":
            csi_mode = AccessMode.MULTI_NODE_READER_ONLY
        elif mode == "ReadWriteMany":
            csi_mode = AccessMode.MULTI_NODE_MULTI_WRITER
        else:
            raise ValueError(f"unknown access mode {mode!r}")
        cap = v1.VolumeCapability(access_mode=v1.VolumeCapabilityAccessMode(mode=csi_mode))
        if block:
            cap.block = v1.VolumeCapabilityBlockVolume()
        else:
            cap.mount = v1.VolumeCapabilityMountVolume(
                fs_type=fs_type, mount_flags=list(mount_flags)
            )
        caps.append(cap)
    return caps


def split_parameters(class_name: str, parameters: Mapping[str, str]) -> tuple[str, dict[str, str]]:
    """The class's fsType (``csi.storage.k8s.io/fstype``, '' when unset) and the parameters
    passed to the driver (all but the ``csi.storage.k8s.io/`` ones). An unknown key under that
    prefix, or the deprecated ``fstype`` parameter, is a ProvisioningError naming the class."""
    fs_type = ""
    driver_parameters: dict[str, str] = {}
    for key, value in parameters.items():
        if key.startswith(CSI_PARAMETER_PREFIX):
            if key not in KNOWN_PARAMETER_KEYS:
                raise ProvisioningError(
                    f"StorageClass {class_name!r} has the unknown parameter key {key!r} "
                    f"with reserved namespace {CSI_PARAMETER_PREFIX}"
                )
            if key == FSTYPE_KEY:
                fs_type = value
            continue
        if key.lower() == "fstype":
            raise ProvisioningError(
                f"StorageClass {class_name!r}: parameter {key!r} is deprecated and no longer "
                f"supported; use {FSTYPE_KEY}"
            )
        driver_parameters[key] = value
    return fs_type, driver_parameters

"""The CSI provisioner: :class:`CSIProvisioner`, a :class:`~pyprovlib.provisioner.Provisioner`
that creates and deletes volumes through a CSI driver's Controller service, and the sidecar
running it (``python -m pyprovlib.csi.provisioner``), a port of
kubernetes-csi/external-provisioner.

Its modules follow external-provisioner's file map:

- :mod:`~pyprovlib.csi.provisioner.controller`: CSIProvisioner, CreateVolume and DeleteVolume
  (``pkg/controller/controller.go``);
- :mod:`~pyprovlib.csi.provisioner.request`: what CreateVolume is sent (volume name, class
  parameters, volume capabilities);
- :mod:`~pyprovlib.csi.provisioner.topology`: accessibility requirements (``topology.go``);
- :mod:`~pyprovlib.csi.provisioner.secrets`: secret reference templates and their resolution;
- :mod:`~pyprovlib.csi.provisioner.data_source`: clone and snapshot sources, their validation
  and protection finalizers (``clone_controller.go``, the snapshot-source protection);
- :mod:`~pyprovlib.csi.provisioner.options`: the options and the sidecar's flags
  (``cmd/csi-provisioner``);
- :mod:`~pyprovlib.csi.provisioner.main`: the sidecar process (``main()``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyprovlib._reexports import lazy_reexports

if TYPE_CHECKING:
    from pyprovlib.csi.provisioner import secrets as secrets
    from pyprovlib.csi.provisioner.controller import (
        PROVISIONER_ID_KEY,
        CSIProvisioner,
        check_error,
    )
    from pyprovlib.csi.provisioner.data_source import (
        ANN_ALLOW_VOLUME_MODE_CHANGE,
        CLONE_FINALIZER,
        SNAPSHOT_API_GROUP,
        SNAPSHOT_FINALIZER,
        SNAPSHOT_KIND,
    )
    from pyprovlib.csi.provisioner.main import (
        CSIProvisionerController,
        DriverUnsupportedError,
        build_controller,
        main,
        make_controller,
    )
    from pyprovlib.csi.provisioner.options import (
        CSIProvisionerOptions,
        build_parser,
    )
    from pyprovlib.csi.provisioner.request import (
        make_volume_name,
        volume_capabilities,
    )
    from pyprovlib.csi.provisioner.secrets import (
        ANN_DELETION_SECRET_NAME,
        ANN_DELETION_SECRET_NAMESPACE,
        ANN_MODIFY_SECRET_NAME,
        ANN_MODIFY_SECRET_NAMESPACE,
        CONTROLLER_EXPAND_SECRET,
        CONTROLLER_MODIFY_SECRET,
        CONTROLLER_PUBLISH_SECRET,
        CSI_PARAMETER_PREFIX,
        NODE_EXPAND_SECRET,
        NODE_PUBLISH_SECRET,
        NODE_STAGE_SECRET,
        PROVISIONER_SECRET,
        PV_SECRETS,
        SECRET_PARAMETER_KEYS,
        SecretParams,
        SecretRef,
        read_secret,
        resolve_template,
        secret_reference,
    )
    from pyprovlib.csi.provisioner.topology import (
        TopologyError,
        generate_accessibility_requirements,
    )

__all__ = [
    "ANN_ALLOW_VOLUME_MODE_CHANGE",
    "ANN_DELETION_SECRET_NAME",
    "ANN_DELETION_SECRET_NAMESPACE",
    "ANN_MODIFY_SECRET_NAME",
    "ANN_MODIFY_SECRET_NAMESPACE",
    "CLONE_FINALIZER",
    "CONTROLLER_EXPAND_SECRET",
    "CONTROLLER_MODIFY_SECRET",
    "CONTROLLER_PUBLISH_SECRET",
    "CSI_PARAMETER_PREFIX",
    "NODE_EXPAND_SECRET",
    "NODE_PUBLISH_SECRET",
    "NODE_STAGE_SECRET",
    "PROVISIONER_ID_KEY",
    "PROVISIONER_SECRET",
    "PV_SECRETS",
    "SECRET_PARAMETER_KEYS",
    "SNAPSHOT_API_GROUP",
    "SNAPSHOT_FINALIZER",
    "SNAPSHOT_KIND",
    "CSIProvisioner",
    "CSIProvisionerController",
    "CSIProvisionerOptions",
    "DriverUnsupportedError",
    "SecretParams",
    "SecretRef",
    "TopologyError",
    "build_controller",
    "build_parser",
    "check_error",
    "generate_accessibility_requirements",
    "main",
    "make_controller",
    "make_volume_name",
    "read_secret",
    "resolve_template",
    "secret_reference",
    "volume_capabilities",
]

# Imported on first use, so `python -m pyprovlib.csi.provisioner` reaches its __main__ first.
__getattr__, __dir__ = lazy_reexports(
    __name__,
    {
        ".controller": ["PROVISIONER_ID_KEY", "CSIProvisioner", "check_error"],
        ".data_source": [
            "ANN_ALLOW_VOLUME_MODE_CHANGE",
            "CLONE_FINALIZER",
            "SNAPSHOT_API_GROUP",
            "SNAPSHOT_FINALIZER",
            "SNAPSHOT_KIND",
        ],
        ".main": [
            "CSIProvisionerController",
            "DriverUnsupportedError",
            "build_controller",
            "main",
            "make_controller",
        ],
        ".options": ["CSIProvisionerOptions", "build_parser"],
        ".request": ["make_volume_name", "volume_capabilities"],
        ".secrets": [
            "ANN_DELETION_SECRET_NAME",
            "ANN_DELETION_SECRET_NAMESPACE",
            "ANN_MODIFY_SECRET_NAME",
            "ANN_MODIFY_SECRET_NAMESPACE",
            "CONTROLLER_EXPAND_SECRET",
            "CONTROLLER_MODIFY_SECRET",
            "CONTROLLER_PUBLISH_SECRET",
            "CSI_PARAMETER_PREFIX",
            "NODE_EXPAND_SECRET",
            "NODE_PUBLISH_SECRET",
            "NODE_STAGE_SECRET",
            "PROVISIONER_SECRET",
            "PV_SECRETS",
            "SECRET_PARAMETER_KEYS",
            "SecretParams",
            "SecretRef",
            "read_secret",
            "resolve_template",
            "secret_reference",
        ],
        ".topology": ["TopologyError", "generate_accessibility_requirements"],
    },
    submodules=["secrets"],
)

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

from pyprovlib.csi.provisioner import secrets
from pyprovlib.csi.provisioner.controller import PROVISIONER_ID_KEY, CSIProvisioner, check_error
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
from pyprovlib.csi.provisioner.options import CSIProvisionerOptions, build_parser
from pyprovlib.csi.provisioner.request import make_volume_name, volume_capabilities
from pyprovlib.csi.provisioner.secrets import *  # noqa: F403 - the package exports secrets' names
from pyprovlib.csi.provisioner.topology import TopologyError, generate_accessibility_requirements

__all__ = [
    "ANN_ALLOW_VOLUME_MODE_CHANGE",
    "CLONE_FINALIZER",
    "PROVISIONER_ID_KEY",
    "SNAPSHOT_API_GROUP",
    "SNAPSHOT_FINALIZER",
    "SNAPSHOT_KIND",
    "CSIProvisioner",
    "CSIProvisionerController",
    "CSIProvisionerOptions",
    "DriverUnsupportedError",
    "TopologyError",
    "build_controller",
    "build_parser",
    "check_error",
    "generate_accessibility_requirements",
    "main",
    "make_controller",
    "make_volume_name",
    "volume_capabilities",
]
__all__ += secrets.__all__

"""The CSI provisioner: :class:`CSIProvisioner`, a :class:`~pyprovlib.Provisioner`
that creates and deletes volumes through a CSI driver's Controller service, and the sidecar
running it (``python -m pyprovlib.csi.provisioner``), a port of
kubernetes-csi/external-provisioner.

Its modules follow external-provisioner's file map:

- :mod:`~pyprovlib.csi.provisioner._controller`: CSIProvisioner, CreateVolume and DeleteVolume
  (``pkg/controller/controller.go``);
- :mod:`~pyprovlib.csi.provisioner._request`: what CreateVolume is sent (volume name, class
  parameters, volume capabilities);
- :mod:`~pyprovlib.csi.provisioner._topology`: accessibility requirements (``topology.go``);
- :mod:`~pyprovlib.csi.provisioner._secrets`: secret reference templates and their resolution;
- :mod:`~pyprovlib.csi.provisioner._data_source`: clone and snapshot sources, their validation
  and protection finalizers (``clone_controller.go``, the snapshot-source protection);
- :mod:`~pyprovlib.csi.provisioner._options`: the options and the sidecar's flags
  (``cmd/csi-provisioner``);
- :mod:`~pyprovlib.csi.provisioner._main`: the sidecar process (``main()``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyprovlib._reexports import lazy_reexports

if TYPE_CHECKING:
    from pyprovlib.csi.provisioner._controller import CSIProvisioner
    from pyprovlib.csi.provisioner._main import main
    from pyprovlib.csi.provisioner._options import CSIProvisionerOptions

__all__ = [
    "CSIProvisioner",
    "CSIProvisionerOptions",
    "main",
]

# Imported on first use, so `python -m pyprovlib.csi.provisioner` reaches its __main__ first.
__getattr__, __dir__ = lazy_reexports(
    __name__,
    {
        "._controller": ["CSIProvisioner"],
        "._options": ["CSIProvisionerOptions"],
        "._main": ["main"],
    },
)

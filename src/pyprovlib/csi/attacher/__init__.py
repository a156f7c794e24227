"""The CSI attacher: :class:`CSIAttacher`, an :class:`~pyprovlib.attacher.Attacher` over a CSI
driver's ControllerPublishVolume / ControllerUnpublishVolume / ListVolumes, and the sidecar
running it (``python -m pyprovlib.csi.attacher``), a port of kubernetes-csi/external-attacher.

Its modules follow the shape of every sidecar package here:

- :mod:`~pyprovlib.csi.attacher.controller`: CSIAttacher and the volume capability it sends
  (upstream's ``pkg/attacher``);
- :mod:`~pyprovlib.csi.attacher.options`: the sidecar's flags and the controller options they
  make (``cmd/csi-attacher``);
- :mod:`~pyprovlib.csi.attacher.main`: the sidecar process (``main()``), which runs an
  :class:`~pyprovlib.controller.attach.AttachController` with the CSI handler when the driver
  has PUBLISH_UNPUBLISH_VOLUME, with the trivial handler otherwise; the reconciler runs when
  the driver has LIST_VOLUMES and LIST_VOLUMES_PUBLISHED_NODES.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyprovlib._reexports import lazy_reexports

if TYPE_CHECKING:
    from pyprovlib.csi.attacher.controller import (
        CSIAttacher,
        UnsupportedAccessModeError,
        csi_access_mode,
        volume_capability,
    )
    from pyprovlib.csi.attacher.main import AttacherSidecar, build, build_controller, main
    from pyprovlib.csi.attacher.options import DEFAULT_CSI_ADDRESS, controller_options, parser

__all__ = [
    "DEFAULT_CSI_ADDRESS",
    "AttacherSidecar",
    "CSIAttacher",
    "UnsupportedAccessModeError",
    "build",
    "build_controller",
    "controller_options",
    "csi_access_mode",
    "main",
    "parser",
    "volume_capability",
]

# Imported on first use, so `python -m pyprovlib.csi.attacher` reaches its __main__ first.
__getattr__, __dir__ = lazy_reexports(
    __name__,
    {
        ".controller": [
            "CSIAttacher",
            "UnsupportedAccessModeError",
            "csi_access_mode",
            "volume_capability",
        ],
        ".main": ["AttacherSidecar", "build", "build_controller", "main"],
        ".options": ["DEFAULT_CSI_ADDRESS", "controller_options", "parser"],
    },
)

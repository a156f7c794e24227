"""The CSI attacher: :class:`CSIAttacher`, an :class:`~pyprovlib.Attacher` over a CSI
driver's ControllerPublishVolume / ControllerUnpublishVolume / ListVolumes, and the sidecar
running it (``python -m pyprovlib.csi.attacher``), a port of kubernetes-csi/external-attacher.

Its modules follow the shape of every sidecar package here:

- :mod:`~pyprovlib.csi.attacher._controller`: CSIAttacher and the volume capability it sends
  (upstream's ``pkg/attacher``);
- :mod:`~pyprovlib.csi.attacher._options`: the sidecar's flags and the controller options they
  make (``cmd/csi-attacher``);
- :mod:`~pyprovlib.csi.attacher._main`: the sidecar process (``main()``), which runs an
  :class:`~pyprovlib.AttachController` with the CSI handler when the driver
  has PUBLISH_UNPUBLISH_VOLUME, with the trivial handler otherwise; the reconciler runs when
  the driver has LIST_VOLUMES and LIST_VOLUMES_PUBLISHED_NODES.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyprovlib._reexports import lazy_reexports

if TYPE_CHECKING:
    from pyprovlib.csi.attacher._controller import CSIAttacher
    from pyprovlib.csi.attacher._main import main

__all__ = [
    "CSIAttacher",
    "main",
]

# Imported on first use, so `python -m pyprovlib.csi.attacher` reaches its __main__ first.
__getattr__, __dir__ = lazy_reexports(
    __name__,
    {
        "._controller": ["CSIAttacher"],
        "._main": ["main"],
    },
)

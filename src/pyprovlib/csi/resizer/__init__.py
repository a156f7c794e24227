"""The CSI resizer: :class:`CSIResizer`, a :class:`~pyprovlib.Resizer` over a CSI
driver's ControllerExpandVolume, :class:`TrivialResizer` for drivers that expand on the node
only, :class:`CSIModifier`, a :class:`~pyprovlib.Modifier` over ControllerModifyVolume,
and the sidecar running them (``python -m pyprovlib.csi.resizer``), a port of
kubernetes-csi/external-resizer.

Its modules follow the shape of every sidecar package here:

- :mod:`~pyprovlib.csi.resizer._controller`: CSIResizer, TrivialResizer and
  :func:`choose_resizer` (upstream's ``pkg/resizer``);
- :mod:`~pyprovlib.csi.resizer._modifier`: CSIModifier and :func:`choose_modifier` (upstream's
  ``pkg/modifier``);
- :mod:`~pyprovlib.csi.resizer._options`: the sidecar's flags and the controller options they
  make (``cmd/csi-resizer``);
- :mod:`~pyprovlib.csi.resizer._main`: the sidecar process (``main()``), which runs a
  :class:`~pyprovlib.ResizeController` with the resizer the driver's
  capabilities call for and a :class:`~pyprovlib.ModifyController`, under one
  Lease.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyprovlib._reexports import lazy_reexports

if TYPE_CHECKING:
    from pyprovlib.csi.resizer._controller import CSIResizer, TrivialResizer
    from pyprovlib.csi.resizer._main import main
    from pyprovlib.csi.resizer._modifier import CSIModifier

__all__ = [
    "CSIModifier",
    "CSIResizer",
    "TrivialResizer",
    "main",
]

# Imported on first use, so `python -m pyprovlib.csi.resizer` reaches its __main__ first.
__getattr__, __dir__ = lazy_reexports(
    __name__,
    {
        "._controller": ["CSIResizer", "TrivialResizer"],
        "._modifier": ["CSIModifier"],
        "._main": ["main"],
    },
)

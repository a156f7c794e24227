"""The CSI resizer: :class:`CSIResizer`, a :class:`~pyprovlib.resizer.Resizer` over a CSI
driver's ControllerExpandVolume, :class:`TrivialResizer` for drivers that expand on the node
only, and the sidecar running them (``python -m pyprovlib.csi.resizer``), a port of
kubernetes-csi/external-resizer.

Its modules follow the shape of every sidecar package here:

- :mod:`~pyprovlib.csi.resizer.controller`: CSIResizer, TrivialResizer and
  :func:`choose_resizer` (upstream's ``pkg/resizer``);
- :mod:`~pyprovlib.csi.resizer.options`: the sidecar's flags and the controller options they
  make (``cmd/csi-resizer``);
- :mod:`~pyprovlib.csi.resizer.main`: the sidecar process (``main()``), which runs a
  :class:`~pyprovlib.controller.resize.ResizeController` with the resizer the driver's
  capabilities call for.
"""

from pyprovlib.csi.resizer.controller import (
    CSIResizer,
    DriverCannotExpandError,
    TrivialResizer,
    choose_resizer,
)
from pyprovlib.csi.resizer.main import ResizerSidecar, build, build_controller, main
from pyprovlib.csi.resizer.options import DEFAULT_CSI_ADDRESS, controller_options, parser

__all__ = [
    "DEFAULT_CSI_ADDRESS",
    "CSIResizer",
    "DriverCannotExpandError",
    "ResizerSidecar",
    "TrivialResizer",
    "build",
    "build_controller",
    "choose_resizer",
    "controller_options",
    "main",
    "parser",
]

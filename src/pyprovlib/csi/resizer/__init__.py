"""The CSI resizer: :class:`CSIResizer`, a :class:`~pyprovlib.resizer.Resizer` over a CSI
driver's ControllerExpandVolume, :class:`TrivialResizer` for drivers that expand on the node
only, :class:`CSIModifier`, a :class:`~pyprovlib.modifier.Modifier` over ControllerModifyVolume,
and the sidecar running them (``python -m pyprovlib.csi.resizer``), a port of
kubernetes-csi/external-resizer.

Its modules follow the shape of every sidecar package here:

- :mod:`~pyprovlib.csi.resizer.controller`: CSIResizer, TrivialResizer and
  :func:`choose_resizer` (upstream's ``pkg/resizer``);
- :mod:`~pyprovlib.csi.resizer.modifier`: CSIModifier and :func:`choose_modifier` (upstream's
  ``pkg/modifier``);
- :mod:`~pyprovlib.csi.resizer.options`: the sidecar's flags and the controller options they
  make (``cmd/csi-resizer``);
- :mod:`~pyprovlib.csi.resizer.main`: the sidecar process (``main()``), which runs a
  :class:`~pyprovlib.controller.resize.ResizeController` with the resizer the driver's
  capabilities call for and a :class:`~pyprovlib.controller.modify.ModifyController`, under one
  Lease.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyprovlib._reexports import lazy_reexports

if TYPE_CHECKING:
    from pyprovlib.csi.resizer.controller import (
        CSIResizer,
        DriverCannotExpandError,
        TrivialResizer,
        choose_resizer,
    )
    from pyprovlib.csi.resizer.main import (
        ResizerSidecar,
        build,
        build_controller,
        build_controllers,
        build_modify_controller,
        main,
    )
    from pyprovlib.csi.resizer.modifier import (
        ANN_MODIFY_SECRET_NAME,
        ANN_MODIFY_SECRET_NAMESPACE,
        CSIModifier,
        choose_modifier,
    )
    from pyprovlib.csi.resizer.options import (
        DEFAULT_CSI_ADDRESS,
        controller_options,
        modify_controller_options,
        parser,
    )

__all__ = [
    "ANN_MODIFY_SECRET_NAME",
    "ANN_MODIFY_SECRET_NAMESPACE",
    "DEFAULT_CSI_ADDRESS",
    "CSIModifier",
    "CSIResizer",
    "DriverCannotExpandError",
    "ResizerSidecar",
    "TrivialResizer",
    "build",
    "build_controller",
    "build_controllers",
    "build_modify_controller",
    "choose_modifier",
    "choose_resizer",
    "controller_options",
    "main",
    "modify_controller_options",
    "parser",
]

# Imported on first use, so `python -m pyprovlib.csi.resizer` reaches its __main__ first.
__getattr__, __dir__ = lazy_reexports(
    __name__,
    {
        ".controller": [
            "CSIResizer",
            "DriverCannotExpandError",
            "TrivialResizer",
            "choose_resizer",
        ],
        ".main": [
            "ResizerSidecar",
            "build",
            "build_controller",
            "build_controllers",
            "build_modify_controller",
            "main",
        ],
        ".modifier": [
            "ANN_MODIFY_SECRET_NAME",
            "ANN_MODIFY_SECRET_NAMESPACE",
            "CSIModifier",
            "choose_modifier",
        ],
        ".options": [
            "DEFAULT_CSI_ADDRESS",
            "controller_options",
            "modify_controller_options",
            "parser",
        ],
    },
)

"""pyprovlib: write Kubernetes storage controllers (provisioners, attachers, resizers) in Python.

This module is the user contract and the controllers that drive it::

    from pyprovlib import ProvisionController, Provisioner, ProvisionOptions

The rest of the public API lives in five packages, each listing its names in ``__all__``:
:mod:`pyprovlib.controller` (capacity, volume stores, metrics, annotations),
:mod:`pyprovlib.kube` (client-go's machinery), :mod:`pyprovlib.runtime` (process wiring),
:mod:`pyprovlib.csi` (CSI over gRPC, the sidecars in its subpackages) and
:mod:`pyprovlib.testing` (the in-memory API server). Every module whose name starts with ``_``
is internal and may change without notice; docs/reference lists the whole public surface.

``import pyprovlib`` changes nothing in the interpreter and imports nothing heavy: each name
below is imported from its module the first time it is used (PEP 562), so an application can
call :func:`enable_lazy_kubernetes_imports` (the one opt-in that does change how
kubernetes-asyncio imports) right after ``import pyprovlib``. pyprovlib's own ``python -m``
entry points turn it on for themselves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyprovlib._lazy_kubernetes import enable as enable_lazy_kubernetes_imports
from pyprovlib._reexports import lazy_reexports
from pyprovlib._version import __version__

if TYPE_CHECKING:
    from pyprovlib._attacher import Attacher, AttachError, AttachNode, AttachVolume
    from pyprovlib._errors import InvalidOptionsError, PyprovlibError
    from pyprovlib._modifier import Modifier, ModifyError, NotModifiable
    from pyprovlib._provisioner import (
        BlockProvisioner,
        DeletionGuard,
        IgnoredError,
        InfeasibleError,
        MountOptionsProvisioner,
        ObjectDeleter,
        Provisioner,
        ProvisioningError,
        ProvisioningState,
        ProvisionOptions,
        Qualifier,
    )
    from pyprovlib._resizer import ExpansionResult, NotExpandable, ResizeError, Resizer
    from pyprovlib.controller._attach import AttachController, AttachControllerOptions
    from pyprovlib.controller._lifecycle import LeaderElectionLostError
    from pyprovlib.controller._modify import ModifyController, ModifyControllerOptions
    from pyprovlib.controller._options import Backoff, ProvisionControllerOptions
    from pyprovlib.controller._provision import ProvisionController
    from pyprovlib.controller._resize import ResizeController, ResizeControllerOptions

__all__ = [
    "AttachController",
    "AttachControllerOptions",
    "AttachError",
    "AttachNode",
    "AttachVolume",
    "Attacher",
    "Backoff",
    "BlockProvisioner",
    "DeletionGuard",
    "ExpansionResult",
    "IgnoredError",
    "InfeasibleError",
    "InvalidOptionsError",
    "LeaderElectionLostError",
    "Modifier",
    "ModifyController",
    "ModifyControllerOptions",
    "ModifyError",
    "MountOptionsProvisioner",
    "NotExpandable",
    "NotModifiable",
    "ObjectDeleter",
    "ProvisionController",
    "ProvisionControllerOptions",
    "ProvisionOptions",
    "Provisioner",
    "ProvisioningError",
    "ProvisioningState",
    "PyprovlibError",
    "Qualifier",
    "ResizeController",
    "ResizeControllerOptions",
    "ResizeError",
    "Resizer",
    "__version__",
    "enable_lazy_kubernetes_imports",
]

# Each name is imported from its module on first use (PEP 562).
__getattr__, __dir__ = lazy_reexports(
    __name__,
    {
        "pyprovlib._attacher": ["Attacher", "AttachError", "AttachNode", "AttachVolume"],
        "pyprovlib._errors": ["InvalidOptionsError", "PyprovlibError"],
        "pyprovlib._modifier": ["Modifier", "ModifyError", "NotModifiable"],
        "pyprovlib._provisioner": [
            "BlockProvisioner",
            "DeletionGuard",
            "IgnoredError",
            "InfeasibleError",
            "MountOptionsProvisioner",
            "ObjectDeleter",
            "Provisioner",
            "ProvisioningError",
            "ProvisioningState",
            "ProvisionOptions",
            "Qualifier",
        ],
        "pyprovlib._resizer": ["ExpansionResult", "NotExpandable", "ResizeError", "Resizer"],
        "pyprovlib.controller._attach": ["AttachController", "AttachControllerOptions"],
        "pyprovlib.controller._lifecycle": ["LeaderElectionLostError"],
        "pyprovlib.controller._modify": ["ModifyController", "ModifyControllerOptions"],
        "pyprovlib.controller._options": ["Backoff", "ProvisionControllerOptions"],
        "pyprovlib.controller._provision": ["ProvisionController"],
        "pyprovlib.controller._resize": ["ResizeController", "ResizeControllerOptions"],
    },
)

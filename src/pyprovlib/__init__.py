"""pyprovlib: write Kubernetes storage controllers (provisioners, attachers, resizers) in Python.

This module only re-exports the public API::

    from pyprovlib import ProvisionController, Provisioner, ProvisionOptions

See the documentation for the tour: the user contracts live in :mod:`pyprovlib.provisioner`
and :mod:`pyprovlib.attacher`, the controllers in :mod:`pyprovlib.controller`, client-go's
machinery in :mod:`pyprovlib.kube`, process wiring in :mod:`pyprovlib.runtime` and the
in-memory API server for tests in :mod:`pyprovlib.testing`.

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
    from pyprovlib.attacher import Attacher, AttachError, AttachNode, AttachVolume
    from pyprovlib.controller.attach import AttachController, AttachControllerOptions
    from pyprovlib.controller.options import (
        Backoff,
        InvalidOptionsError,
        ProvisionControllerOptions,
    )
    from pyprovlib.controller.provision import LeaderElectionLostError, ProvisionController
    from pyprovlib.controller.resize import ResizeController, ResizeControllerOptions
    from pyprovlib.errors import PyprovlibError
    from pyprovlib.provisioner import (
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
    from pyprovlib.resizer import ExpansionResult, NotExpandable, ResizeError, Resizer

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
    "MountOptionsProvisioner",
    "NotExpandable",
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
        "pyprovlib.attacher": ["Attacher", "AttachError", "AttachNode", "AttachVolume"],
        "pyprovlib.controller.attach": ["AttachController", "AttachControllerOptions"],
        "pyprovlib.controller.options": [
            "Backoff",
            "InvalidOptionsError",
            "ProvisionControllerOptions",
        ],
        "pyprovlib.controller.provision": ["LeaderElectionLostError", "ProvisionController"],
        "pyprovlib.controller.resize": ["ResizeController", "ResizeControllerOptions"],
        "pyprovlib.errors": ["PyprovlibError"],
        "pyprovlib.provisioner": [
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
        "pyprovlib.resizer": ["ExpansionResult", "NotExpandable", "ResizeError", "Resizer"],
    },
)

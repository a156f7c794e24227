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

import importlib
from typing import TYPE_CHECKING, Any

from pyprovlib import _lazy_kubernetes
from pyprovlib._lazy_kubernetes import enable as enable_lazy_kubernetes_imports
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

# Where each re-exported name lives.
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(
        ("Attacher", "AttachError", "AttachNode", "AttachVolume"), "pyprovlib.attacher"
    ),
    "AttachController": "pyprovlib.controller.attach",
    "AttachControllerOptions": "pyprovlib.controller.attach",
    **dict.fromkeys(
        ("Backoff", "InvalidOptionsError", "ProvisionControllerOptions"),
        "pyprovlib.controller.options",
    ),
    **dict.fromkeys(
        ("LeaderElectionLostError", "ProvisionController"), "pyprovlib.controller.provision"
    ),
    "ResizeController": "pyprovlib.controller.resize",
    "ResizeControllerOptions": "pyprovlib.controller.resize",
    "PyprovlibError": "pyprovlib.errors",
    **dict.fromkeys(
        (
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
        ),
        "pyprovlib.provisioner",
    ),
    **dict.fromkeys(
        ("ExpansionResult", "NotExpandable", "ResizeError", "Resizer"), "pyprovlib.resizer"
    ),
}


def __getattr__(name: str) -> Any:  # PEP 562: a re-export is imported on first use
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pyprovlib' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


# Only when this process is `python -m pyprovlib.<entry point>` (a no-op in every other
# process): before the entry point's own imports pull kubernetes_asyncio in.
_lazy_kubernetes.enable_for_entry_point()

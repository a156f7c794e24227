"""pyprovlib: write Kubernetes storage controllers (provisioners, attachers, resizers) in Python.

This module only re-exports the public API::

    from pyprovlib import ProvisionController, Provisioner, ProvisionOptions

See the documentation for the tour: the user contracts live in :mod:`pyprovlib.provisioner`
and :mod:`pyprovlib.attacher`, the controllers in :mod:`pyprovlib.controller`, client-go's
machinery in :mod:`pyprovlib.kube`, process wiring in :mod:`pyprovlib.runtime` and the
in-memory API server for tests in :mod:`pyprovlib.testing`.
"""

# First, before anything imports kubernetes_asyncio.client: makes its ~830 generated
# API/model modules load on first use (see pyprovlib._lazy_kubernetes).
import pyprovlib._lazy_kubernetes  # noqa: F401
from pyprovlib._version import __version__
from pyprovlib.attacher import Attacher, AttachError, AttachNode, AttachVolume
from pyprovlib.controller.attach import AttachController
from pyprovlib.controller.attach_options import AttachControllerOptions
from pyprovlib.controller.options import (
    Backoff,
    InvalidOptionsError,
    ProvisionControllerOptions,
)
from pyprovlib.controller.provision import LeaderElectionLostError, ProvisionController
from pyprovlib.controller.resize import ResizeController
from pyprovlib.controller.resize_options import ResizeControllerOptions
from pyprovlib.errors import PyprovlibError
from pyprovlib.provisioner import (
    BlockProvisioner,
    DeletionGuard,
    IgnoredError,
    InfeasibleError,
    MountOptionsProvisioner,
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
]

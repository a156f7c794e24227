"""The user contract for expanding volumes: implement :class:`Resizer` and hand it to
:class:`~pyprovlib.ResizeController`, which drives it from claims whose
storage request grew, the way kubernetes-csi/external-resizer drives a CSI driver's
ControllerExpandVolume.

A minimal backend::

    from pyprovlib._resizer import ExpansionResult, ResizeError, Resizer

    class MyArray(Resizer):
        name = "my.driver.example.com"  # the class provisioner whose claims it expands

        def can_support(self, pv: V1PersistentVolume) -> bool:
            csi = pv.spec.csi if pv.spec else None
            return csi is not None and csi.driver == self.name

        async def expand(self, pv: V1PersistentVolume, new_size: int) -> ExpansionResult:
            size = await my_api.grow(pv.spec.csi.volume_handle, new_size)  # idempotent
            # True: the file system still has to grow on the node (kubelet's job).
            return ExpansionResult(size, node_expansion_required=True)

    controller = ResizeController(api_client, MyArray())
    await controller.run()

``expand`` must be idempotent and must accept a size the volume already has: the controller
calls it again after any error and after a restart, and it is the only way it learns whether
the node still has work to do.
"""

from __future__ import annotations

import abc
from typing import Final, NamedTuple

from kubernetes_asyncio.client import V1PersistentVolume

from pyprovlib._attacher import GrpcCode, is_final_code
from pyprovlib._errors import PyprovlibError

__all__ = [
    "INFEASIBLE_CODES",
    "ExpansionResult",
    "NotExpandable",
    "ResizeError",
    "Resizer",
]

INFEASIBLE_CODES: Final = frozenset(
    {GrpcCode.INVALID_ARGUMENT, GrpcCode.OUT_OF_RANGE, GrpcCode.NOT_FOUND}
)
"""Codes that say the expansion can never succeed as asked (external-resizer's
``IsInfeasibleError``): the claim is marked ``ControllerResizeInfeasible`` and retried slowly
until the user changes the request."""


class ExpansionResult(NamedTuple):
    """What :meth:`Resizer.expand` returns: the volume's new ``size`` in bytes (at least the
    size asked for) and whether the file system must still be grown on the node."""

    size: int
    node_expansion_required: bool


class ResizeError(PyprovlibError):
    """An expansion that failed. ``message`` goes into the claim's ``ControllerResizeError``
    condition and the ``VolumeResizeFailed`` event (never put secrets in it); ``code`` is the
    gRPC status code when there is one.

    ``final`` says that nothing is in progress on the backend any more (by default: there is a
    code and it is not one of :data:`~pyprovlib._attacher.IN_PROGRESS_CODES`, as upstream's
    ``IsFinalError``); only then may the user's lowered request be used instead of the size
    already being allocated. ``infeasible`` (by default: a code in :data:`INFEASIBLE_CODES`)
    marks the request as impossible. ``in_use`` (by default: FAILED_PRECONDITION) says the
    backend can only expand the volume while no pod uses it.
    """

    def __init__(
        self,
        message: str,
        *,
        code: int | None = None,
        final: bool | None = None,
        infeasible: bool | None = None,
        in_use: bool | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.final = is_final_code(code) if final is None else final
        self.infeasible = (code in INFEASIBLE_CODES) if infeasible is None else infeasible
        self.in_use = (code == GrpcCode.FAILED_PRECONDITION) if in_use is None else in_use


class Resizer(abc.ABC):
    """A storage backend that can grow volumes (CSI's ControllerExpandVolume).

    ``name`` identifies the backend: it names the controller's work queue, its events'
    source (``external-resizer <name>``) and its leader election Lease, and claims whose
    class's ``provisioner`` is ``name`` but whose volume :meth:`can_support` refuses get an
    event saying so. The PersistentVolume is handed over as a kubernetes-asyncio
    ``V1PersistentVolume``, converted from the controller's cache once per claim looked at and
    shared by :meth:`can_support`, :meth:`unsupported_reason` and :meth:`expand` (do not
    modify it); sizes are bytes.

    Raise :class:`ResizeError` for failures with a code; any other exception is reported
    with its message and retried with backoff as a non-final error.
    """

    name: str
    """The backend's name; usually the provisioner (or CSI driver) name of its volumes."""

    @abc.abstractmethod
    def can_support(self, pv: V1PersistentVolume) -> bool:
        """Whether this backend expands ``pv`` (e.g. its CSI driver is ours). Volumes it
        refuses are left alone. Must be cheap: it runs for every claim that wants to grow."""

    @abc.abstractmethod
    async def expand(self, pv: V1PersistentVolume, new_size: int) -> ExpansionResult:
        """Grow the volume of ``pv`` to at least ``new_size`` bytes and return its new size
        and whether the node must still grow the file system. Must be idempotent."""

    @property
    def supports_control_plane_expansion(self) -> bool:
        """False for a backend whose expansion happens on the node only (upstream's trivial
        resizer): then a failed node expansion is retried at the user's current request."""
        return True

    def unsupported_reason(self, pv: V1PersistentVolume) -> str:
        """Why :meth:`can_support` refused ``pv``, for the event the claim's user sees when
        the claim's class names this backend."""
        return "this backend does not support expanding it"


class NotExpandable(Resizer):
    """A backend whose volumes cannot grow (e.g. hostpath directories): run a
    :class:`~pyprovlib.ResizeController` with it under the provisioner's
    name and every claim of its classes that asks for more gets a ``VolumeResizeFailed`` event
    saying ``reason``, instead of waiting silently."""

    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        self.reason = reason

    def can_support(self, pv: V1PersistentVolume) -> bool:
        """No volume is supported."""
        return False

    async def expand(self, pv: V1PersistentVolume, new_size: int) -> ExpansionResult:
        """Never called (nothing is supported); refuses for safety."""
        raise ResizeError(self.reason, code=GrpcCode.UNIMPLEMENTED)

    def unsupported_reason(self, pv: V1PersistentVolume) -> str:
        """The ``reason`` given at construction."""
        return self.reason

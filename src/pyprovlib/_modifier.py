"""The user contract for modifying volumes: implement :class:`Modifier` and hand it to
:class:`~pyprovlib.ModifyController`, which drives it from claims whose
``spec.volumeAttributesClassName`` changed, the way kubernetes-csi/external-resizer's modify
controller drives a CSI driver's ControllerModifyVolume.

A minimal backend::

    from pyprovlib._attacher import GrpcCode
    from pyprovlib._modifier import Modifier, ModifyError

    class MyArray(Modifier):
        name = "my.driver.example.com"  # the CSI driver (VolumeAttributesClass driverName)

        def can_support(self, pv: V1PersistentVolume) -> bool:
            csi = pv.spec.csi if pv.spec else None
            return csi is not None and csi.driver == self.name

        async def modify(self, pv: V1PersistentVolume, parameters: Mapping[str, str]) -> None:
            unknown = set(parameters) - {"iops", "throughput"}
            if unknown:
                # Never possible as asked: the claim shows Infeasible until the class changes.
                raise ModifyError(f"unknown parameters {sorted(unknown)}",
                                  code=GrpcCode.INVALID_ARGUMENT)
            await my_api.tune(pv.spec.csi.volume_handle, parameters)  # idempotent

    controller = ModifyController(api_client, MyArray())
    await controller.run()

``modify`` must be idempotent: after an error that leaves the outcome open (a timeout, a lost
connection) the controller calls it again with the same parameters, and after a restart it
finishes what the claim's status says was in progress.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Final

from kubernetes_asyncio.client import V1PersistentVolume

from pyprovlib._attacher import GrpcCode, is_final_code
from pyprovlib._errors import PyprovlibError

__all__ = [
    "MODIFY_INFEASIBLE_CODES",
    "Modifier",
    "ModifyError",
    "NotModifiable",
]

MODIFY_INFEASIBLE_CODES: Final = frozenset({GrpcCode.INVALID_ARGUMENT})
"""Codes that say the modification can never succeed as asked (external-resizer's
``IsModifyInfeasibleError``): the claim's ``modifyVolumeStatus`` becomes ``Infeasible`` and the
change is retried only slowly until the user names another class."""


class ModifyError(PyprovlibError):
    """A modification that failed. ``message`` goes into the ``VolumeModifyFailed`` event and
    ``detail`` (default: ``message``; for a CSI driver, its gRPC status message) into the claim's
    ``ModifyVolumeError`` condition — never put secrets in either; ``code`` is the gRPC status
    code when there is one (the condition's reason).

    ``final`` says that nothing is in progress on the backend any more (by default: there is a
    code and it is not one of :data:`~pyprovlib._attacher.IN_PROGRESS_CODES`, upstream's
    ``IsFinalError``); until then the controller keeps working towards the class it started
    with, whatever the claim asks for meanwhile. ``infeasible`` (by default: a code in
    :data:`MODIFY_INFEASIBLE_CODES`) marks the parameters as impossible. An error without a code
    is reported and retried, and changes nothing in the claim's status (the backend was not
    asked, or cannot say).
    """

    def __init__(
        self,
        message: str,
        *,
        code: int | None = None,
        final: bool | None = None,
        infeasible: bool | None = None,
        detail: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.detail = message if detail is None else detail
        self.code = code
        self.final = is_final_code(code) if final is None else final
        self.infeasible = (code in MODIFY_INFEASIBLE_CODES) if infeasible is None else infeasible


class Modifier(abc.ABC):
    """A storage backend that can change a volume's mutable attributes (CSI's
    ControllerModifyVolume).

    ``name`` identifies the backend: it names the controller's work queue, its events' source
    (``external-resizer <name>``) and its default leader election Lease. The PersistentVolume is
    handed over as a kubernetes-asyncio ``V1PersistentVolume``, converted from the controller's
    cache once per call (do not modify it). The parameters are the VolumeAttributesClass's
    (plus, with ``extra_modify_metadata``, the claim's and the volume's names under the
    ``csi.storage.k8s.io/`` keys).

    Raise :class:`ModifyError` for failures; any other exception is reported with its message
    and retried with backoff, as an error without a code.
    """

    name: str
    """The backend's name; usually the CSI driver name of its volumes."""

    @abc.abstractmethod
    def can_support(self, pv: V1PersistentVolume) -> bool:
        """Whether ``pv`` is one of this backend's volumes (e.g. its CSI driver is ours).
        Volumes it refuses are left alone. Must be cheap: it runs for every claim looked at."""

    @abc.abstractmethod
    async def modify(self, pv: V1PersistentVolume, parameters: Mapping[str, str]) -> None:
        """Give the volume of ``pv`` the attributes ``parameters``. Must be idempotent."""

    @property
    def modify_supported(self) -> bool:
        """False for a backend that owns volumes but cannot modify them: the controller then
        only tells the users who ask for another class, by a ``VolumeModifyNotSupported``
        event, instead of leaving them waiting."""
        return True

    def unsupported_reason(self, pv: V1PersistentVolume) -> str:
        """Why the volumes of a backend without :attr:`modify_supported` cannot change, for
        that event."""
        return "this backend cannot modify volumes"


class NotModifiable(Modifier):
    """The volumes of the CSI driver ``name`` that cannot be modified (a driver without the
    MODIFY_VOLUME capability): a claim of one that asks for another VolumeAttributesClass gets
    a ``VolumeModifyNotSupported`` event saying ``reason``, and nothing else happens."""

    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        self.reason = reason

    def can_support(self, pv: V1PersistentVolume) -> bool:
        """CSI volumes of this driver."""
        csi = pv.spec.csi if pv.spec else None
        return csi is not None and csi.driver == self.name

    async def modify(self, pv: V1PersistentVolume, parameters: Mapping[str, str]) -> None:
        """Never called; refuses for safety."""
        raise ModifyError(self.reason, code=GrpcCode.UNIMPLEMENTED)

    @property
    def modify_supported(self) -> bool:
        """False: nothing can be modified."""
        return False

    def unsupported_reason(self, pv: V1PersistentVolume) -> str:
        """The ``reason`` given at construction."""
        return self.reason

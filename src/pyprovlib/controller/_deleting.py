"""Calling a provisioner's delete with the form it works on: ``delete_object`` with the PV's
JSON for an :class:`~pyprovlib.provisioner.ObjectDeleter`, else ``delete`` with a
``V1PersistentVolume`` converted once per operation and shared with the
:class:`~pyprovlib.provisioner.DeletionGuard`'s ``should_delete`` (upstream hands both the same
object)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from types import MappingProxyType

from kubernetes_asyncio.client import V1PersistentVolume

from pyprovlib.kube.convert import to_model
from pyprovlib.kube.objects import Obj
from pyprovlib.provisioner import ObjectDeleter, Provisioner

__all__ = ["LazyVolume", "deleter"]


class LazyVolume:
    """A PV's cached JSON and its model, converted on first use (one conversion per
    operation, however many calls into user code receive it)."""

    __slots__ = ("_model", "obj")

    def __init__(self, obj: Obj) -> None:
        self.obj = obj
        self._model: V1PersistentVolume | None = None

    def model(self) -> V1PersistentVolume:
        """The PV as a ``V1PersistentVolume``; raises
        :class:`~pyprovlib.kube.convert.ConversionError` when the PV is malformed."""
        if self._model is None:
            self._model = to_model(self.obj, V1PersistentVolume)
        return self._model


def deleter(provisioner: Provisioner, volume: LazyVolume) -> Callable[[], Awaitable[None]]:
    """The call that deletes ``volume``'s asset. A model is converted here, before the call,
    so a malformed PV raises :class:`~pyprovlib.kube.convert.ConversionError` from this
    function rather than from the provisioner."""
    if isinstance(provisioner, ObjectDeleter):
        frozen = MappingProxyType(volume.obj)
        return lambda: provisioner.delete_object(frozen)
    model = volume.model()
    return lambda: provisioner.delete(model)

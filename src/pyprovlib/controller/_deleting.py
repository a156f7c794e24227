"""Calling a provisioner's delete with the form it works on: ``delete_object`` with the PV's
JSON for an :class:`~pyprovlib.ObjectDeleter`, else ``delete`` with a
``V1PersistentVolume`` converted once per operation and shared with the
:class:`~pyprovlib.DeletionGuard`'s ``should_delete`` (upstream hands both the same
object)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from types import MappingProxyType

from kubernetes_asyncio.client import V1PersistentVolume

from pyprovlib._provisioner import ObjectDeleter, Provisioner
from pyprovlib.kube._convert import to_model
from pyprovlib.kube._objects import Obj

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
        :class:`~pyprovlib.kube._convert.ConversionError` when the PV is malformed."""
        if self._model is None:
            self._model = to_model(self.obj, V1PersistentVolume)
        return self._model


def deleter(provisioner: Provisioner, volume: LazyVolume) -> Callable[[], Awaitable[None]]:
    """The call that deletes ``volume``'s asset. A model is converted here, before the call,
    so a malformed PV raises :class:`~pyprovlib.kube._convert.ConversionError` from this
    function rather than from the provisioner."""
    if isinstance(provisioner, ObjectDeleter):
        frozen = MappingProxyType(volume.obj)
        return lambda: provisioner.delete_object(frozen)
    model = volume.model()
    return lambda: provisioner.delete(model)

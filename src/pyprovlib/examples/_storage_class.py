"""What the example backends share about their StorageClasses: the check that a class names
only parameters the backend knows, and the lookup of a volume's class when deleting it (its
parameters hold the deletion policy or the credentials the backend needs)."""

from __future__ import annotations

from collections.abc import Iterable

from kubernetes_asyncio.client import StorageV1Api, V1StorageClass
from kubernetes_asyncio.client.exceptions import ApiException

from pyprovlib._provisioner import ProvisioningError
from pyprovlib.kube._errors import is_not_found

__all__ = ["class_parameters", "read_class_of_volume", "reject_unknown_parameters"]


def class_parameters(
    storage_class: V1StorageClass, known: Iterable[str], backend: str
) -> tuple[str, dict[str, str]]:
    """The class's name and its parameters, all of them in ``known`` (else
    :func:`reject_unknown_parameters`)."""
    name = storage_class.metadata.name if storage_class.metadata else "?"
    params: dict[str, str] = dict(storage_class.parameters or {})
    accepted = set(known)
    reject_unknown_parameters(name, [k for k in params if k not in accepted], accepted, backend)
    return name, params


def reject_unknown_parameters(
    name: str, unknown: Iterable[str], accepted: Iterable[str], backend: str
) -> None:
    """A :class:`ProvisioningError` naming the class's ``unknown`` parameters and those the
    ``backend``'s provisioner accepts, if there are any unknown ones."""
    unknown = sorted(unknown)
    if unknown:
        raise ProvisioningError(
            f"StorageClass {name!r} has unknown parameter(s) {', '.join(unknown)}; the "
            f"{backend} provisioner accepts only {', '.join(sorted(accepted))}"
        )


async def read_class_of_volume(
    storage: StorageV1Api, pv_name: str, class_name: str, *, fix: str
) -> V1StorageClass:
    """The StorageClass ``class_name`` of PersistentVolume ``pv_name``, read to delete the
    volume; a missing class is a :class:`RuntimeError` naming both and saying how to ``fix``
    it (the controller retries the deletion with backoff)."""
    try:
        storage_class: V1StorageClass = await storage.read_storage_class(class_name)
    except ApiException as err:
        if is_not_found(err):
            raise RuntimeError(
                f"PersistentVolume {pv_name}: StorageClass {class_name!r} not found; {fix}"
            ) from err
        raise
    return storage_class

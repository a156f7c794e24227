"""Options of the :class:`~pyprovlib.controller.CapacityController`, with
external-provisioner's flag defaults (``--capacity-*``, ``--timeout``, the retry intervals) in
one frozen dataclass, and the labels its CSIStorageCapacity objects carry."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from pyprovlib._errors import InvalidOptionsError
from pyprovlib.controller._renamed import renamed_field

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

__all__ = [
    "DEFAULT_MANAGED_BY",
    "DEFAULT_POLL_INTERVAL",
    "DRIVER_NAME_LABEL",
    "MANAGED_BY_LABEL",
    "CapacityControllerOptions",
    "InvalidCapacityOptionsError",
    "managed_labels",
]

DRIVER_NAME_LABEL: Final = "csi.storage.k8s.io/drivername"
"""Label naming the driver of a CSIStorageCapacity (upstream's ``DriverNameLabel``)."""
MANAGED_BY_LABEL: Final = "csi.storage.k8s.io/managed-by"
"""Label naming the instance that manages it (upstream's ``ManagedByLabel``)."""
DEFAULT_MANAGED_BY: Final = "external-provisioner"
"""The managed-by value of a central provisioner, upstream's: a Go csi-provisioner and
pyprovlib can take over each other's objects when one replaces the other."""
DEFAULT_POLL_INTERVAL: Final = 60.0
"""``--capacity-poll-interval``: how often every object is refreshed."""
DEFAULT_RESYNC: Final = 3600.0
"""Informer resync of the capacity objects (upstream's ``ResyncPeriodOfCsiNodeInformer``)."""


class InvalidCapacityOptionsError(InvalidOptionsError):
    """A :class:`CapacityControllerOptions` field is out of range."""


def managed_labels(driver: str, managed_by: str = DEFAULT_MANAGED_BY) -> dict[str, str]:
    """The labels of the CSIStorageCapacity objects an instance manages for ``driver``."""
    return {DRIVER_NAME_LABEL: driver, MANAGED_BY_LABEL: managed_by}


@renamed_field("threads", "workers")
@dataclass(frozen=True, kw_only=True)
class CapacityControllerOptions:
    """How a :class:`~pyprovlib.controller.CapacityController` runs.

    ``namespace`` (required) holds the CSIStorageCapacity objects (upstream: ``$NAMESPACE``,
    the sidecar's own). ``owner``, when given, is the ownerReference every object gets (a
    ``controller: true`` reference to the Deployment, StatefulSet or Pod the instance runs
    as, see :func:`~pyprovlib.controller.lookup_owner`), so that deleting the
    deployment deletes its objects. ``managed_by`` is the ``csi.storage.k8s.io/managed-by``
    label value: an instance only ever touches objects with its driver's name and this value.

    Objects are refreshed every ``poll_interval`` seconds and soon after a volume is created or
    deleted; classes with ``volumeBindingMode: Immediate`` get objects only with
    ``immediate_binding``. ``workers`` write objects (``threads``, the former name, still
    works with a DeprecationWarning); ``timeout`` bounds each GetCapacity call; a failed item
    is retried after ``retry_interval_start`` seconds, doubling up to ``retry_interval_max``.
    Work queue and capacity metrics go to ``registry`` (prometheus_client's default when None).

    Usually the controller runs under the provisioner's Lease
    (:meth:`~pyprovlib.ProvisionController.run_beside`); the leader
    election fields let it hold a Lease of its own instead.
    """

    namespace: str
    owner: Mapping[str, Any] | None = None
    managed_by: str = DEFAULT_MANAGED_BY
    poll_interval: float = DEFAULT_POLL_INTERVAL
    immediate_binding: bool = False
    workers: int = 1
    timeout: float = 10.0
    retry_interval_start: float = 1.0
    retry_interval_max: float = 300.0
    resync_period: float = DEFAULT_RESYNC
    leader_election: bool = False
    leader_election_namespace: str | None = None
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 5.0
    registry: CollectorRegistry | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.namespace:
            raise InvalidCapacityOptionsError(
                "namespace must name the namespace of the CSIStorageCapacity objects "
                "(the sidecar reads it from $NAMESPACE)"
            )
        if not self.managed_by:
            raise InvalidCapacityOptionsError("managed_by must not be empty")
        if self.poll_interval <= 0:
            raise InvalidCapacityOptionsError(
                f"poll_interval must be positive, got {self.poll_interval}"
            )
        if self.workers < 1:
            raise InvalidCapacityOptionsError(f"workers must be at least 1, got {self.workers}")
        if self.timeout <= 0:
            raise InvalidCapacityOptionsError(f"timeout must be positive, got {self.timeout}")
        if not 0 < self.retry_interval_start <= self.retry_interval_max:
            raise InvalidCapacityOptionsError(
                "retry intervals must satisfy 0 < retry_interval_start <= retry_interval_max, "
                f"got {self.retry_interval_start} and {self.retry_interval_max}"
            )
        if self.owner is not None:
            missing = [k for k in ("apiVersion", "kind", "name", "uid") if not self.owner.get(k)]
            if missing:
                raise InvalidCapacityOptionsError(
                    f"owner must be an ownerReference with apiVersion, kind, name and uid; "
                    f"{', '.join(missing)} missing"
                )

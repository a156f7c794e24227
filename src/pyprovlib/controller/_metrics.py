"""Prometheus collectors of the provision controller, under sig-storage-lib-external-provisioner's
names and labels (``controller/metrics/metrics.go``):

- ``controller_persistentvolumeclaim_provision_total{class,source}``
- ``controller_persistentvolumeclaim_provision_failed_total{class,source}``
- ``controller_persistentvolumeclaim_provision_duration_seconds{class,source}`` (histogram)
- ``controller_persistentvolume_delete_total{class}``
- ``controller_persistentvolume_delete_failed_total{class}``
- ``controller_persistentvolume_delete_duration_seconds{class}`` (histogram)

``source`` is the kind of the claim's ``dataSource`` ('' when none). Histograms use the Go
client's default buckets, so dashboards built for the Go sidecars read these unchanged.
"""

from __future__ import annotations

import functools
from typing import Final

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram

__all__ = [
    "CONTROLLER_SUBSYSTEM",
    "GO_DEFAULT_BUCKETS",
    "ProvisionMetrics",
    "default_metrics",
]

CONTROLLER_SUBSYSTEM: Final = "controller"
"""The subsystem prefix of every collector here (upstream's ``ControllerSubsystem``)."""

GO_DEFAULT_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""``prometheus.DefBuckets`` of the Go client (prometheus_client's defaults differ)."""


class ProvisionMetrics:
    """The six collectors, registered in ``registry`` under ``<subsystem>_...`` names.

    Create one per registry (prometheus_client refuses a duplicate name); tests pass a fresh
    :class:`CollectorRegistry` to read their own counts.
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = REGISTRY,
        *,
        subsystem: str = CONTROLLER_SUBSYSTEM,
    ) -> None:
        self.registry = registry
        counter = functools.partial(Counter, subsystem=subsystem, registry=registry)
        histogram = functools.partial(
            Histogram, subsystem=subsystem, registry=registry, buckets=GO_DEFAULT_BUCKETS
        )
        per_claim = ("class", "source")
        per_volume = ("class",)
        self.provision_total = counter(
            "persistentvolumeclaim_provision_total",
            "Total number of persistent volumes provisioned succesfully. Broken down by storage "
            "class name and source of the claim.",
            per_claim,
        )
        self.provision_failed_total = counter(
            "persistentvolumeclaim_provision_failed_total",
            "Total number of persistent volume provision failed attempts. Broken down by "
            "storage class name and source of the claim.",
            per_claim,
        )
        self.provision_duration_seconds = histogram(
            "persistentvolumeclaim_provision_duration_seconds",
            "Latency in seconds to provision persistent volumes. Failed provisioning attempts "
            "are ignored. Broken down by storage class name and source of the claim.",
            per_claim,
        )
        self.delete_total = counter(
            "persistentvolume_delete_total",
            "Total number of persistent volumes deleted succesfully. Broken down by storage "
            "class name.",
            per_volume,
        )
        self.delete_failed_total = counter(
            "persistentvolume_delete_failed_total",
            "Total number of persistent volume delete failed attempts. Broken down by storage "
            "class name.",
            per_volume,
        )
        self.delete_duration_seconds = histogram(
            "persistentvolume_delete_duration_seconds",
            "Latency in seconds to delete persistent volumes. Failed deletion attempts are "
            "ignored. Broken down by storage class name.",
            per_volume,
        )

    def provision_succeeded(self, class_name: str, source: str, seconds: float) -> None:
        """Count a provisioned volume and observe how long it took."""
        self.provision_duration_seconds.labels(class_name, source).observe(seconds)
        self.provision_total.labels(class_name, source).inc()

    def provision_failed(self, class_name: str, source: str) -> None:
        """Count a failed provisioning attempt."""
        self.provision_failed_total.labels(class_name, source).inc()

    def delete_succeeded(self, class_name: str, seconds: float) -> None:
        """Count a deleted volume and observe how long it took."""
        self.delete_duration_seconds.labels(class_name).observe(seconds)
        self.delete_total.labels(class_name).inc()

    def delete_failed(self, class_name: str) -> None:
        """Count a failed deletion attempt."""
        self.delete_failed_total.labels(class_name).inc()


_default: ProvisionMetrics | None = None


def default_metrics() -> ProvisionMetrics:
    """The process-wide collectors in prometheus_client's default registry, created on first
    use and shared by every controller of the process (their series add up by class)."""
    global _default  # noqa: PLW0603 - one set of collectors per process, like upstream's M
    if _default is None:
        _default = ProvisionMetrics(REGISTRY)
    return _default

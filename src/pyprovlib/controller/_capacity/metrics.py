"""The capacity controller's gauges, under external-provisioner's names (computed when
scraped, as upstream's ``CollectWithStability``):

- ``csistoragecapacities_desired_goal``: objects that are supposed to be managed;
- ``csistoragecapacities_desired_current``: of those, the ones that exist;
- ``csistoragecapacities_obsolete``: objects that exist and will be deleted.

The work queue's own series are ``workqueue_*{name="csistoragecapacity"}``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Final

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

__all__ = ["CURRENT", "GOAL", "OBSOLETE", "CapacityCollector"]

GOAL: Final = "csistoragecapacities_desired_goal"
"""Objects that are supposed to be managed (classes of the driver by segments)."""
CURRENT: Final = "csistoragecapacities_desired_current"
"""Of those, the objects that exist."""
OBSOLETE: Final = "csistoragecapacities_obsolete"
"""Objects that exist and will be deleted."""

_HELP = {
    GOAL: "Number of CSIStorageCapacity objects that are supposed to be managed automatically.",
    CURRENT: "Number of CSIStorageCapacity objects that exist and are supposed to be managed "
    "automatically.",
    OBSOLETE: "Number of CSIStorageCapacity objects that exist and will be deleted "
    "automatically. Objects that exist and may need an update are not considered obsolete and "
    "therefore not included in this value.",
}


class CapacityCollector(Collector):
    """The three gauges, read from ``counts()`` (goal, current, obsolete) at each scrape."""

    def __init__(self, counts: Callable[[], tuple[int, int, int]]) -> None:
        self._counts = counts

    def describe(self) -> Iterable[GaugeMetricFamily]:
        return [GaugeMetricFamily(name, _HELP[name]) for name in (GOAL, CURRENT, OBSOLETE)]

    def collect(self) -> Iterable[GaugeMetricFamily]:
        goal, current, obsolete = self._counts()
        return [
            GaugeMetricFamily(GOAL, _HELP[GOAL], value=goal),
            GaugeMetricFamily(CURRENT, _HELP[CURRENT], value=current),
            GaugeMetricFamily(OBSOLETE, _HELP[OBSOLETE], value=obsolete),
        ]

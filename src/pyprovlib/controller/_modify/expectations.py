"""What the modify controller knows about claims that their cached objects do not say.

In the spirit of kube-controller-manager's ``ControllerExpectations``: a worker decides from the
informer cache, which lags the controller's own writes, and from what only the controller saw
(how the driver's last answer ended). All of it lives here, and nowhere else.

Invariants:

- A claim is *uncertain* from an error of the driver that leaves the outcome open (not final)
  until a final answer: meanwhile the modification goes on towards the target it started with,
  whatever the claim asks for (upstream's ``uncertainPVCs``). At start-up every claim whose
  status says InProgress or Infeasible is uncertain.
- A claim is *slow* for ``retry_interval_max`` after its modification was found infeasible:
  the same target is not tried again before (upstream's ``slowSet``).
- A claim is *modified* from the driver's success until the completion is written: a failed
  write is retried without asking the driver again, so no volume is modified twice for one
  change.
- A claim is *written* from a write of ours until the cache shows that version or a later one:
  the worker does not act on the older copy meanwhile (it looks again a little later).
- Only workers read or write this object; event handlers only enqueue keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyprovlib.kube._clock import Clock
from pyprovlib.kube._objects import resource_version

__all__ = ["ModifyExpectations"]


def _at_least(have: str, wanted: str) -> bool:
    if have.isdigit() and wanted.isdigit():
        return int(have) >= int(wanted)
    return have == wanted


class ModifyExpectations:
    """Uncertain, slow, modified and written claims, by ``namespace/name`` key."""

    def __init__(self, clock: Clock, slow_period: float) -> None:
        self._clock = clock
        self._slow_period = slow_period
        self._uncertain: set[str] = set()
        self._slow: dict[str, float] = {}
        self._modified: dict[str, str] = {}
        self._written: dict[str, str] = {}

    # -- uncertain ------------------------------------------------------------------------

    def set_uncertain(self, key: str) -> None:
        self._uncertain.add(key)

    def set_certain(self, key: str) -> None:
        self._uncertain.discard(key)

    def is_uncertain(self, key: str) -> bool:
        return key in self._uncertain

    # -- slow -----------------------------------------------------------------------------

    def add_slow(self, key: str) -> None:
        """Start the slow period of ``key`` (a running one is not extended)."""
        self._slow.setdefault(key, self._clock.monotonic())

    def remove_slow(self, key: str) -> None:
        self._slow.pop(key, None)

    def slow_remaining(self, key: str) -> float:
        """Seconds left of ``key``'s slow period; 0 when it has none (or it ended)."""
        started = self._slow.get(key)
        if started is None:
            return 0.0
        left = started + self._slow_period - self._clock.monotonic()
        if left <= 0:
            del self._slow[key]
            return 0.0
        return left

    # -- modified -------------------------------------------------------------------------

    def modified(self, key: str, target: str) -> None:
        """The driver gave the volume of ``key`` the attributes of ``target``."""
        self._modified[key] = target

    def modified_target(self, key: str) -> str | None:
        """The class the driver applied for ``key`` whose completion is not written yet."""
        return self._modified.get(key)

    def completed(self, key: str) -> None:
        self._modified.pop(key, None)

    # -- written --------------------------------------------------------------------------

    def written(self, key: str, obj: Mapping[str, Any]) -> None:
        """We wrote ``obj`` (as the server returned it) for ``key``."""
        self._written[key] = resource_version(obj)

    def seen(self, key: str, cached: Mapping[str, Any]) -> bool:
        """Whether ``cached`` (the cache's copy) shows our last write for ``key``, or a later
        version; clears the expectation when it does."""
        wanted = self._written.get(key)
        if wanted is None:
            return True
        if not _at_least(resource_version(cached), wanted):
            return False
        del self._written[key]
        return True

    # -- all ------------------------------------------------------------------------------

    def forget(self, key: str) -> None:
        """The claim is gone."""
        self._uncertain.discard(key)
        self._slow.pop(key, None)
        self._modified.pop(key, None)
        self._written.pop(key, None)

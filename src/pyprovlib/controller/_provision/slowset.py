"""Claims whose provisioning failed as infeasible, held back for a while (csi-lib-utils'
``slowset``): a claim in the set is not retried until its time is up or its StorageClass is
replaced.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyprovlib.kube._clock import Clock

__all__ = ["SlowSet"]


@dataclass(frozen=True)
class _SlowEntry:
    since: float
    class_uid: str


class SlowSet:
    """Claims whose provisioning failed as infeasible, each held for ``retry_interval_max``
    seconds from when it was added (expired entries are dropped on access)."""

    def __init__(self, retry_interval_max: float, clock: Clock) -> None:
        self.retry_interval_max = retry_interval_max
        self._clock = clock
        self._entries: dict[str, _SlowEntry] = {}

    def add(self, key: str, class_uid: str) -> None:
        """Hold ``key`` from now on."""
        self._entries[key] = _SlowEntry(self._clock.monotonic(), class_uid)

    def remove(self, key: str) -> None:
        """Stop holding ``key``."""
        self._entries.pop(key, None)

    def class_uid(self, key: str) -> str | None:
        """The StorageClass UID recorded for ``key``, if it is held."""
        self._expire(key)
        entry = self._entries.get(key)
        return entry.class_uid if entry else None

    def time_remaining(self, key: str) -> float:
        """Seconds ``key`` is still held (0 when it is not)."""
        self._expire(key)
        entry = self._entries.get(key)
        if entry is None:
            return 0.0
        return max(0.0, entry.since + self.retry_interval_max - self._clock.monotonic())

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.time_remaining(key) > 0

    def _expire(self, key: str) -> None:
        entry = self._entries.get(key)
        if entry is not None and self._clock.monotonic() >= entry.since + self.retry_interval_max:
            del self._entries[key]

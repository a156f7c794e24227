"""Exponential backoff: apimachinery's ``wait.Backoff`` and client-go's backoff manager.

:class:`Backoff` is the schedule (a frozen value, as an option); :class:`BackoffTimer` steps
through one with a clock, resetting after a quiet period, as client-go's reflector does.
"""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass

from pyprovlib._errors import InvalidOptionsError
from pyprovlib.kube._clock import Clock, RealClock

__all__ = ["REFLECTOR_BACKOFF", "Backoff", "BackoffTimer"]


@dataclass(frozen=True)
class Backoff:
    """apimachinery's ``wait.Backoff``: up to ``steps`` attempts; between them sleep
    ``duration``, multiplied by ``factor`` after each attempt (capped at ``cap``), plus up to
    ``jitter`` times the sleep at random."""

    duration: float
    factor: float = 1.0
    jitter: float = 0.0
    steps: int = 1
    cap: float | None = None

    def __post_init__(self) -> None:
        if self.duration < 0:
            raise InvalidOptionsError(f"Backoff.duration must be >= 0, got {self.duration}")
        if self.factor < 0:
            raise InvalidOptionsError(f"Backoff.factor must be >= 0, got {self.factor}")
        if self.jitter < 0:
            raise InvalidOptionsError(f"Backoff.jitter must be >= 0, got {self.jitter}")
        if self.steps < 1:
            raise InvalidOptionsError(f"Backoff.steps must be at least 1, got {self.steps}")
        if self.cap is not None and self.cap < 0:
            raise InvalidOptionsError(f"Backoff.cap must be >= 0, got {self.cap}")

    def delays(self) -> list[float]:
        """The sleeps between the attempts, without jitter (``steps - 1`` of them)."""
        out: list[float] = []
        d = self.duration
        for _ in range(self.steps - 1):
            out.append(self.capped(d))
            d *= self.factor
        return out

    def capped(self, delay: float) -> float:
        """``delay`` limited to ``cap``."""
        return delay if self.cap is None else min(delay, self.cap)


REFLECTOR_BACKOFF = Backoff(duration=0.8, factor=2.0, jitter=1.0, steps=sys.maxsize, cap=30.0)
"""client-go's reflector: 800 ms doubling to 30 s, with full jitter."""


class BackoffTimer:
    """Steps through a :class:`Backoff` (client-go's ``exponentialBackoffManager``): each
    :meth:`next` returns the next delay; after ``reset_after`` seconds without a backoff the
    schedule starts over."""

    def __init__(
        self,
        backoff: Backoff = REFLECTOR_BACKOFF,
        *,
        reset_after: float = 120.0,
        clock: Clock | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.backoff = backoff
        self.reset_after = reset_after
        self._clock = clock or RealClock()
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not cryptography
        self._current = backoff.duration
        self._last: float | None = None

    def next(self) -> float:
        """The next delay in seconds (and step the exponent)."""
        now = self._clock.monotonic()
        if self._last is not None and now - self._last > self.reset_after:
            self._current = self.backoff.duration
        self._last = now
        delay = self.backoff.capped(self._current)
        self._current = self.backoff.capped(self._current * self.backoff.factor)
        if self.backoff.jitter > 0:
            delay += self._rng.random() * self.backoff.jitter * delay
        return delay

"""A token bucket (golang.org/x/time/rate semantics) shared by the work queue's bucket rate
limiter and the client-side QPS/burst limiter."""

from __future__ import annotations

from pyprovlib.kube._clock import Clock, RealClock

__all__ = ["TokenBucket"]


class TokenBucket:
    """``qps`` tokens a second refill a bucket of ``burst`` tokens.

    :meth:`reserve` always takes a token and returns how long the caller must wait before using
    it (0 while the bucket has tokens); reservations queue up, so the waits grow linearly once
    the burst is spent, like ``rate.Limiter.Reserve().Delay()``. A ``qps`` of ``inf`` (or <= 0)
    means unlimited.
    """

    # One bucket per involved object in the event recorder's spam filter (thousands in a burst).
    __slots__ = ("_clock", "_last", "_tokens", "burst", "qps")

    def __init__(self, qps: float, burst: int, *, clock: Clock | None = None) -> None:
        if burst < 1 and 0 < qps < float("inf"):
            raise ValueError(f"burst must be at least 1 for a limited bucket, got {burst}")
        self.qps = qps
        self.burst = burst
        self._clock = clock or RealClock()
        self._tokens = float(burst)
        self._last = self._clock.monotonic()

    @property
    def unlimited(self) -> bool:
        return self.qps <= 0 or self.qps == float("inf")

    def _refill(self) -> None:
        now = self._clock.monotonic()
        elapsed = max(0.0, now - self._last)
        self._last = now
        self._tokens = min(float(self.burst), self._tokens + elapsed * self.qps)

    def reserve(self) -> float:
        """Take one token; return the seconds to wait before acting on it."""
        if self.unlimited:
            return 0.0
        self._refill()
        self._tokens -= 1.0
        return 0.0 if self._tokens >= 0 else -self._tokens / self.qps

    def tokens(self) -> float:
        """Tokens available now (negative while reservations are queued)."""
        if self.unlimited:
            return float("inf")
        self._refill()
        return self._tokens

    async def wait(self) -> None:
        """Take a token and sleep until it may be used."""
        delay = self.reserve()
        if delay > 0:
            await self._clock.sleep(delay)

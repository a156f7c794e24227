"""The work queue's rate limiters: client-go's exponential, fast-slow, bucket and max-of
limiters and the default controller limiter, driven by a fake clock."""

from __future__ import annotations

import pytest

from pyprovlib.kube._clock import FakeClock
from pyprovlib.kube._workqueue import (
    BucketRateLimiter,
    ItemExponentialFailureRateLimiter,
    ItemFastSlowRateLimiter,
    MaxOfRateLimiter,
    RateLimiter,
    default_controller_rate_limiter,
)


def test_exponential_doubles_per_failure_up_to_the_cap() -> None:
    limiter = ItemExponentialFailureRateLimiter(0.001, 1.0)
    delays = [limiter.when("a") for _ in range(12)]
    assert delays[:10] == [0.001 * 2**n for n in range(10)]
    # 2**10 ms = 1.024 s is past the cap.
    assert delays[10:] == [1.0, 1.0]
    assert limiter.num_requeues("a") == 12


def test_exponential_counts_items_separately_and_forget_resets() -> None:
    limiter = ItemExponentialFailureRateLimiter(0.005, 1000.0)
    assert limiter.when("a") == 0.005
    assert limiter.when("a") == 0.01
    assert limiter.when("b") == 0.005
    assert limiter.num_requeues("a") == 2
    assert limiter.num_requeues("b") == 1
    limiter.forget("a")
    assert limiter.num_requeues("a") == 0
    assert limiter.when("a") == 0.005
    limiter.forget("never-seen")  # forgetting an unknown item is harmless
    assert limiter.num_requeues("never-seen") == 0


def test_exponential_never_overflows_for_huge_failure_counts() -> None:
    limiter = ItemExponentialFailureRateLimiter(0.005, 1000.0)
    # Past 2**1024 a float overflows; past ~2**61 a Go duration would.
    for _ in range(1100):
        delay = limiter.when("a")
        assert 0 < delay <= 1000.0
    assert delay == 1000.0
    assert limiter.num_requeues("a") == 1100


def test_exponential_with_an_uncapped_max_falls_back_to_it_beyond_go_durations() -> None:
    limiter = ItemExponentialFailureRateLimiter(1.0, float("inf"))
    delays = [limiter.when("a") for _ in range(70)]
    assert delays[33] == 2.0**33
    # 2**63 ns is Go's longest duration (about 292 years); beyond it client-go returns maxDelay.
    assert delays[69] == float("inf")


def test_exponential_with_zero_base_is_always_zero() -> None:
    limiter = ItemExponentialFailureRateLimiter(0.0, 10.0)
    assert [limiter.when("a") for _ in range(1100)][-3:] == [0.0, 0.0, 0.0]


def test_fast_slow_switches_after_max_fast_attempts() -> None:
    limiter = ItemFastSlowRateLimiter(0.005, 10.0, 3)
    assert [limiter.when("a") for _ in range(5)] == [0.005, 0.005, 0.005, 10.0, 10.0]
    assert limiter.when("b") == 0.005
    assert limiter.num_requeues("a") == 5
    limiter.forget("a")
    assert limiter.num_requeues("a") == 0
    assert limiter.when("a") == 0.005


async def test_bucket_gives_burst_then_spaces_reservations_at_qps() -> None:
    clock = FakeClock()
    limiter = BucketRateLimiter(2.0, 3, clock=clock)
    # The bucket is shared by all items: the burst is spent across them.
    assert [limiter.when(f"item-{i}") for i in range(3)] == [0.0, 0.0, 0.0]
    assert limiter.when("x") == pytest.approx(0.5)
    assert limiter.when("y") == pytest.approx(1.0)
    await clock.advance(1.0)
    # Two tokens came back and went to the queued reservations.
    assert limiter.when("z") == pytest.approx(0.5)
    assert limiter.num_requeues("x") == 0
    limiter.forget("x")
    assert limiter.when("w") == pytest.approx(1.0)


def test_bucket_with_infinite_qps_never_delays() -> None:
    limiter = BucketRateLimiter(float("inf"), 0)
    assert all(limiter.when(i) == 0.0 for i in range(1000))


def test_max_of_takes_the_longest_delay_and_forwards_everything() -> None:
    exponential = ItemExponentialFailureRateLimiter(0.001, 1.0)
    fast_slow = ItemFastSlowRateLimiter(0.003, 5.0, 2)
    limiter = MaxOfRateLimiter(exponential, fast_slow)
    assert limiter.when("a") == 0.003  # fast-slow wins over 1 ms
    assert limiter.when("a") == 0.003  # 2 ms vs 3 ms
    assert limiter.when("a") == 5.0  # slow now
    # Both limiters counted every call.
    assert exponential.num_requeues("a") == 3
    assert fast_slow.num_requeues("a") == 3
    assert limiter.num_requeues("a") == 3
    limiter.forget("a")
    assert exponential.num_requeues("a") == 0
    assert fast_slow.num_requeues("a") == 0


def test_max_of_num_requeues_is_the_largest_count() -> None:
    counting = ItemFastSlowRateLimiter(0.0, 0.0, 1)
    limiter = MaxOfRateLimiter(BucketRateLimiter(float("inf"), 0), counting)
    limiter.when("a")
    limiter.when("a")
    # The bucket reports 0; the per-item limiter's count wins.
    assert limiter.num_requeues("a") == 2


def test_max_of_needs_a_limiter() -> None:
    with pytest.raises(ValueError, match="at least one"):
        MaxOfRateLimiter()


async def test_default_controller_rate_limiter_matches_client_go() -> None:
    clock = FakeClock()
    limiter = default_controller_rate_limiter(clock=clock)
    # 100 first failures of distinct items: the 5 ms per-item backoff dominates.
    assert {limiter.when(f"item-{i}") for i in range(100)} == {0.005}
    # The 101st retry waits for a token at 10 qps.
    assert limiter.when("item-100") == pytest.approx(0.1)
    assert limiter.when("item-101") == pytest.approx(0.2)
    # Per-item growth still applies to a repeatedly failing item.
    await clock.advance(1000.0)
    for _ in range(15):
        delay = limiter.when("hot")
        await clock.advance(delay)
    assert delay == pytest.approx(0.005 * 2**14)
    delays = [limiter.when("hot") for _ in range(5)]
    # 0.005 * 2**18 s would be 1310.72 s: capped at max_delay.
    assert delays == pytest.approx([163.84, 327.68, 655.36, 1000.0, 1000.0])
    assert limiter.num_requeues("hot") == 20
    limiter.forget("hot")
    assert limiter.num_requeues("hot") == 0


def test_default_controller_rate_limiter_arguments_change_it() -> None:
    limiter = default_controller_rate_limiter(
        base_delay=1.0, max_delay=3.0, qps=1.0, burst=1, clock=FakeClock()
    )
    assert limiter.when("a") == 1.0
    assert limiter.when("b") == 1.0  # the bucket's second token is 1 s away too
    assert limiter.when("a") == 2.0
    assert limiter.when("a") == 3.0  # bucket at 3 s, exponential capped at 3 s
    assert limiter.when("a") == 4.0  # the bucket now dominates


def test_every_limiter_satisfies_the_protocol() -> None:
    limiters: list[object] = [
        ItemExponentialFailureRateLimiter(0.1, 1.0),
        ItemFastSlowRateLimiter(0.1, 1.0, 1),
        BucketRateLimiter(1.0, 1),
        default_controller_rate_limiter(),
    ]
    assert all(isinstance(limiter, RateLimiter) for limiter in limiters)

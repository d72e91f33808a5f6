"""Token buckets and per-tenant limiters under an injected clock (no sleeps)."""
from __future__ import annotations

import math

import pytest

from backend.policy.rate_limiter import TenantLimiter, TokenBucket
from backend.policy.tenants import limits_from_dict


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_bucket_refills_at_its_rate_up_to_capacity():
    clock = FakeClock()
    bucket = TokenBucket(rate=2.0, capacity=4.0, clock=clock)
    bucket.take(4)
    assert bucket.wait_s(1) == pytest.approx(0.5)
    clock.now += 0.5
    assert bucket.wait_s(1) == 0
    clock.now += 100
    assert bucket.level == 4.0  # never above capacity
    assert math.isinf(bucket.wait_s(5))  # more than it can ever hold


def test_give_back_is_capped():
    clock = FakeClock()
    bucket = TokenBucket(rate=1.0, capacity=10.0, clock=clock)
    bucket.take(6)
    bucket.give_back(100)
    assert bucket.level == 10.0


def test_unlimited_bucket_never_waits():
    bucket = TokenBucket(rate=math.inf, capacity=math.inf, clock=FakeClock())
    bucket.take(10**9)
    assert bucket.wait_s(10**9) == 0


def _limiter(clock, **limits):
    return TenantLimiter(limits_from_dict({"tenants": {"t": limits}}).for_tenant("t"), clock)


def test_request_rate_refusal_says_when_to_retry():
    clock = FakeClock()
    limiter = _limiter(clock, requests_per_s=2, request_burst=2)
    for _ in range(2):
        assert limiter.check(1, 10) is None
        limiter.acquire(1, 10)
    refusal = limiter.check(1, 10)
    assert refusal.limit == "requests_per_s" and refusal.retry_after_s == pytest.approx(0.5)
    clock.now += 0.5
    assert limiter.check(1, 10) is None


def test_token_rate_counts_prompt_plus_max_tokens_and_returns_unused():
    clock = FakeClock()
    limiter = _limiter(clock, tokens_per_s=100, token_burst=100)
    limiter.acquire(1, 80)  # prompt 20 + max_tokens 60
    refusal = limiter.check(1, 50)
    assert refusal.limit == "tokens_per_s" and refusal.retry_after_s == pytest.approx(0.3)
    limiter.release(unused_tokens=40)  # generated 20 of 60
    assert limiter.check(1, 50) is None
    assert limiter.check(1, 101).retry_after_s is None  # larger than the burst: never


def test_concurrency_cap():
    limiter = _limiter(FakeClock(), max_concurrent=2)
    limiter.acquire(2, 2)
    refusal = limiter.check(1, 1)
    assert refusal.limit == "max_concurrent" and refusal.retry_after_s > 0
    limiter.release(0)
    assert limiter.check(1, 1) is None
    assert limiter.check(3, 3).retry_after_s is None

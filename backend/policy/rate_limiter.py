"""Per-tenant rate limits: token buckets on requests/s and on tokens/s, and a cap on concurrent requests.

A request reserves 1 from its tenant's request bucket and prompt tokens + max_tokens from its token bucket at
admission; when it ends, the tokens it did not generate go back to the token bucket. The clock is injected
(seconds, monotonic) so tests need no sleeps. Not thread-safe: the admission controller holds the lock.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from backend.policy.tenants import TenantLimits

Clock = Callable[[], float]
# Retry hint when a concurrency cap is full: requests end at unknown times; a short engine step is the scale.
CONCURRENCY_RETRY_S = 0.1


class TokenBucket:
    """Holds up to `capacity` units and refills at `rate` units per second (rate inf: never limits)."""

    def __init__(self, rate: float, capacity: float, clock: Clock) -> None:
        if not rate > 0 or not capacity >= 1:
            raise ValueError(f"a token bucket needs rate > 0 and capacity >= 1, got {rate}, {capacity}")
        self.rate = rate
        self.capacity = capacity
        self.clock = clock
        self._level = capacity
        self._stamp = clock()

    @property
    def unlimited(self) -> bool:
        return math.isinf(self.rate)

    @property
    def level(self) -> float:
        self._refill()
        return self._level

    def _refill(self) -> None:
        now = self.clock()
        if not self.unlimited:
            self._level = min(self.capacity, self._level + (now - self._stamp) * self.rate)
        self._stamp = now

    def wait_s(self, amount: float) -> float:
        """Seconds until `amount` can be taken (0: now; inf: never, more than the bucket holds)."""
        if self.unlimited:
            return 0.0
        if amount > self.capacity:
            return math.inf
        missing = amount - self.level
        return 0.0 if missing <= 0 else missing / self.rate

    def take(self, amount: float) -> None:
        """Take `amount` (the caller checked wait_s first)."""
        if not self.unlimited:
            self._refill()
            self._level -= amount

    def give_back(self, amount: float) -> None:
        if not self.unlimited:
            self._refill()
            self._level = min(self.capacity, self._level + amount)


@dataclass(frozen=True)
class Refusal:
    """Why a request is refused: which limit, and when a retry may succeed (None: never, as it is)."""

    limit: str  # "requests_per_s", "tokens_per_s", "max_concurrent", "max_queued_requests", ...
    message: str
    retry_after_s: float | None


class TenantLimiter:
    """One tenant's buckets and in-flight count."""

    def __init__(self, limits: TenantLimits, clock: Clock) -> None:
        lim = limits.limits
        self.limits = limits
        self.requests = TokenBucket(lim.requests_per_s, lim.request_capacity, clock)
        self.tokens = TokenBucket(lim.tokens_per_s, lim.token_capacity, clock)
        self.in_flight = 0

    def check(self, requests: int, tokens: int) -> Refusal | None:
        """None if `requests` requests costing `tokens` tokens fit now; the refusal otherwise (nothing taken)."""
        lim, name = self.limits.limits, self.limits.tenant
        if lim.max_concurrent is not None and self.in_flight + requests > lim.max_concurrent:
            return Refusal("max_concurrent", f"tenant {name!r} has {self.in_flight} requests in flight, its "
                           f"max_concurrent is {lim.max_concurrent}", None if requests > lim.max_concurrent else CONCURRENCY_RETRY_S)
        wait = self.requests.wait_s(requests)
        if wait > 0:
            return Refusal("requests_per_s", f"tenant {name!r} is over its rate of {lim.requests_per_s:g} "
                           f"requests/s (burst {lim.request_capacity:g})", _finite(wait))
        wait = self.tokens.wait_s(tokens)
        if wait > 0:
            return Refusal("tokens_per_s", f"tenant {name!r} is over its rate of {lim.tokens_per_s:g} tokens/s "
                           f"(burst {lim.token_capacity:g}; this request reserves {tokens} tokens: prompt + "
                           "max_tokens)", _finite(wait))
        return None

    def acquire(self, requests: int, tokens: int) -> None:
        self.requests.take(requests)
        self.tokens.take(tokens)
        self.in_flight += requests

    def release(self, unused_tokens: int) -> None:
        """One request ended; `unused_tokens` of its reservation were never generated."""
        self.in_flight -= 1
        self.tokens.give_back(max(0, unused_tokens))


def _finite(wait_s: float) -> float | None:
    return None if math.isinf(wait_s) else wait_s

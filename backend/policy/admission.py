"""Admission control: per-tenant rate limits and concurrency caps, plus global caps on queued requests and tokens.

A Triton request (one or more rows) is admitted whole or refused at once: a refusal names the limit and gives a
retry-after hint, so nothing waits forever in a queue it cannot leave. Each admitted row gets a Ticket; the row is
"queued" until its first token, and "in flight" until it ends, when its unused tokens go back to the bucket.
Lower tiers may fill only `queue_share` of the global queue caps, so under overload they are refused first.

Thread-safe (Triton's execute thread admits, the engine thread starts and finishes); no Triton import.
"""
from __future__ import annotations

import math
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Sequence

from backend.policy.rate_limiter import Clock, Refusal, TenantLimiter
from backend.policy.tenants import LimitsConfig, TenantLimits

QUEUE_RETRY_S = 0.25  # hint when a global queue cap is full: about one prefill of a long prompt on CPU


@dataclass(frozen=True)
class RowCost:
    prompt_tokens: int
    max_tokens: int

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.max_tokens


@dataclass
class Ticket:
    """One admitted row: what it reserved, and where it is (queued until its first token)."""

    tenant: TenantLimits
    cost: RowCost
    queued: bool = True
    done: bool = False


@dataclass(frozen=True)
class Admission:
    tenant: TenantLimits
    tickets: tuple[Ticket, ...] = ()
    refusal: Refusal | None = None

    @property
    def admitted(self) -> bool:
        return self.refusal is None

    @property
    def permanent(self) -> bool:
        """Refused and would be refused again however long the client waits (too big for a limit)."""
        return self.refusal is not None and self.refusal.retry_after_s is None

    @property
    def retry_after_ms(self) -> int | None:
        if self.refusal is None or self.refusal.retry_after_s is None:
            return None
        return max(1, math.ceil(self.refusal.retry_after_s * 1000))

    def error_message(self) -> str:
        refusal = self.refusal
        if refusal is None:
            return ""
        if self.permanent:
            return f"request refused: {refusal.message} (limit {refusal.limit}; too large to ever be admitted)"
        return f"request refused: {refusal.message} (limit {refusal.limit}); retry_after_ms={self.retry_after_ms}"


@dataclass
class AdmissionSnapshot:
    """For metrics: bucket levels per tenant, queued rows per priority level."""

    buckets: dict[str, tuple[float, float]] = field(default_factory=dict)  # tenant -> (requests, tokens) levels
    queued_by_priority: dict[int, int] = field(default_factory=dict)


class AdmissionController:
    def __init__(self, limits: LimitsConfig, clock: Clock = time.monotonic) -> None:
        self.limits = limits
        self.clock = clock
        self._lock = threading.Lock()
        self._tenants: dict[str, TenantLimiter] = {}
        self.queued_requests = 0
        self.queued_tokens = 0
        self._queued_by_priority: Counter[int] = Counter()

    def tenant(self, tenant_id: str | None) -> TenantLimits:
        return self.limits.for_tenant(tenant_id)

    def _limiter(self, tenant: TenantLimits) -> TenantLimiter:
        limiter = self._tenants.get(tenant.tenant)
        if limiter is None:
            limiter = self._tenants[tenant.tenant] = TenantLimiter(tenant, self.clock)
        return limiter

    def admit(self, tenant_id: str | None, costs: Sequence[RowCost]) -> Admission:
        tenant = self.tenant(tenant_id)
        tokens = sum(c.tokens for c in costs)
        with self._lock:
            limiter = self._limiter(tenant)
            refusal = self._queue_refusal(tenant, len(costs), tokens) or limiter.check(len(costs), tokens)
            if refusal is not None:
                return Admission(tenant, refusal=refusal)
            limiter.acquire(len(costs), tokens)
            self.queued_requests += len(costs)
            self.queued_tokens += tokens
            self._queued_by_priority[tenant.priority] += len(costs)
        return Admission(tenant, tickets=tuple(Ticket(tenant, c) for c in costs))

    def _queue_refusal(self, tenant: TenantLimits, requests: int, tokens: int) -> Refusal | None:
        share = tenant.limits.queue_share
        for limit, cap, queued, n in (("max_queued_requests", self.limits.max_queued_requests, self.queued_requests,
                                       requests),
                                      ("max_queued_tokens", self.limits.max_queued_tokens, self.queued_tokens, tokens)):
            if cap is None:
                continue
            allowed = max(1, int(cap * share))
            if queued + n > allowed:
                scope = "" if share == 1 else f" (tier {tenant.tier} may use {share:g} of it: {allowed})"
                return Refusal(limit, f"the server queue is full: {queued} queued + {n} > {limit} {cap}{scope}",
                               None if n > allowed else QUEUE_RETRY_S)
        return None

    def started(self, ticket: Ticket) -> None:
        """The row produced its first token (or ended): it leaves the queue."""
        with self._lock:
            self._dequeue(ticket)

    def finished(self, ticket: Ticket, generated_tokens: int) -> None:
        """The row ended (any way): free its concurrency slot and return the tokens it did not use."""
        with self._lock:
            if ticket.done:
                return
            ticket.done = True
            self._dequeue(ticket)
            self._limiter(ticket.tenant).release(ticket.cost.max_tokens - generated_tokens)

    def _dequeue(self, ticket: Ticket) -> None:
        if not ticket.queued:
            return
        ticket.queued = False
        self.queued_requests -= 1
        self.queued_tokens -= ticket.cost.tokens
        self._queued_by_priority[ticket.tenant.priority] -= 1

    def snapshot(self) -> AdmissionSnapshot:
        with self._lock:
            buckets = {name: (lim.requests.level, lim.tokens.level) for name, lim in self._tenants.items()}
            return AdmissionSnapshot(buckets, dict(self._queued_by_priority))


class Lease:
    """One admitted row as its output sink sees it: the ticket to release, and the row's deadline."""

    def __init__(self, controller: AdmissionController, ticket: Ticket, timeout_ms: int | None,
                 clock: Clock = time.monotonic) -> None:
        self.controller = controller
        self.ticket = ticket
        self.timeout_ms = timeout_ms
        self.clock = clock
        self.deadline = None if timeout_ms is None else clock() + timeout_ms / 1000.0
        self.timed_out = False

    def expired(self) -> bool:
        """True once the deadline passed (sticky: the row is then ended as timed out)."""
        if self.deadline is not None and not self.timed_out and self.clock() >= self.deadline:
            self.timed_out = True
        return self.timed_out

    def timeout_message(self) -> str:
        return f"request timed out: its deadline (timeout_ms={self.timeout_ms}) passed; its KV blocks were freed"

    def on_output(self, has_tokens: bool, finished: bool, generated_tokens: int) -> None:
        if has_tokens or finished:
            self.controller.started(self.ticket)
        if finished:
            self.controller.finished(self.ticket, generated_tokens)

    def on_fail(self) -> None:
        self.controller.finished(self.ticket, 0)

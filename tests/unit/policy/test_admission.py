"""Admission: tenant limits, global queue caps with tier shares, tickets released once."""
from __future__ import annotations

from backend.policy.admission import AdmissionController, Lease, RowCost
from backend.policy.tenants import limits_from_dict
from tests.unit.policy.test_rate_limiter import FakeClock

LIMITS = {
    "global": {"max_queued_requests": 4, "max_queued_tokens": 1000},
    "tenants": {"heavy": {"tier": "batch", "requests_per_s": 2, "request_burst": 2},
                "light": {"tier": "premium"}},
}


def _controller():
    return AdmissionController(limits_from_dict(LIMITS), FakeClock())


def test_over_limit_tenant_refused_others_admitted():
    ctl = _controller()
    for _ in range(2):
        admission = ctl.admit("heavy", [RowCost(5, 5)])
        ctl.started(admission.tickets[0])  # generating: out of the queue
    refused = ctl.admit("heavy", [RowCost(5, 5)])
    assert not refused.admitted and refused.refusal.limit == "requests_per_s"
    assert refused.retry_after_ms == 500
    assert "retry_after_ms=500" in refused.error_message() and "'heavy'" in refused.error_message()
    assert ctl.admit("light", [RowCost(5, 5)]).admitted


def test_lower_tier_refused_first_when_the_queue_fills():
    ctl = _controller()
    ctl.admit("heavy", [RowCost(1, 1)] * 2)  # batch tier: half of the queue (2 of 4)
    refused = ctl.admit("default", [RowCost(1, 1)] * 3)  # standard tier: the whole queue, 2 + 3 > 4
    assert refused.refusal.limit == "max_queued_requests"
    ctl.admit("light", [RowCost(1, 1)])
    heavy = ctl.admit("heavy", [RowCost(1, 1)])
    assert heavy.refusal.limit == "max_queued_requests" and "tier batch may use 0.5" in heavy.error_message()
    assert ctl.admit("light", [RowCost(1, 1)]).admitted  # premium still fits: 4 of 4


def test_queued_tokens_cap_and_release():
    ctl = _controller()
    first = ctl.admit("light", [RowCost(400, 400)])
    refused = ctl.admit("light", [RowCost(100, 200)])
    assert refused.refusal.limit == "max_queued_tokens" and refused.retry_after_ms == 250
    ctl.started(first.tickets[0])  # first token: out of the queue
    assert ctl.admit("light", [RowCost(100, 200)]).admitted
    assert ctl.admit("light", [RowCost(1000, 1)]).permanent  # more than the whole cap


def test_finish_releases_once_and_returns_unused_tokens():
    ctl = AdmissionController(limits_from_dict({"tenants": {"t": {"tokens_per_s": 10, "token_burst": 100,
                                                                    "max_concurrent": 1}}}), FakeClock())
    (ticket,) = ctl.admit("t", [RowCost(10, 90)]).tickets
    assert ctl.admit("t", [RowCost(1, 1)]).refusal.limit == "max_concurrent"
    ctl.finished(ticket, generated_tokens=10)
    ctl.finished(ticket, generated_tokens=10)  # idempotent
    assert ctl.queued_requests == 0 and ctl.queued_tokens == 0
    assert ctl.snapshot().buckets["t"][1] == 80  # 100 - 100 reserved + 80 unused
    assert ctl.admit("t", [RowCost(10, 70)]).admitted


def test_snapshot_counts_queued_per_priority():
    ctl = _controller()
    ctl.admit("heavy", [RowCost(1, 1)])
    ctl.admit("light", [RowCost(1, 1)] * 2)
    assert ctl.snapshot().queued_by_priority == {2: 2, 0: 1}


def test_lease_deadline_and_release():
    clock = FakeClock()
    ctl = AdmissionController(limits_from_dict({}), clock)
    (ticket,) = ctl.admit(None, [RowCost(3, 5)]).tickets
    lease = Lease(ctl, ticket, timeout_ms=200, clock=clock)
    assert not lease.expired()
    lease.on_output(has_tokens=True, finished=False, generated_tokens=1)
    assert ctl.queued_requests == 0 and not ticket.done
    clock.now += 0.2
    assert lease.expired() and "timeout_ms=200" in lease.timeout_message()
    lease.on_output(has_tokens=False, finished=True, generated_tokens=2)
    assert ticket.done
    assert not Lease(ctl, ticket, timeout_ms=None, clock=clock).expired()

"""Admission metrics through the Python backend's metric API (Triton's metrics port):

- tritonllm_admission_total{tenant, outcome=admitted|refused, reason}: counter, per Triton request (credentials
  that do not allow the request: tenant "", reason "unauthenticated");
- tritonllm_rate_limit_bucket{tenant, bucket=requests|tokens}: gauge, the bucket's current level;
- tritonllm_queue_depth{priority}: gauge, admitted rows waiting for their first token, per priority level.

pb_utils is passed in (it exists only inside the Python backend's stub), keeping this importable anywhere.
Label sets are created on first use; tenants are the limits file's (unknown ids count as the default tenant).
"""
from __future__ import annotations

import math
import threading
from collections import Counter

from backend.policy.admission import Admission, AdmissionSnapshot


class TenantMetrics:
    def __init__(self, pb_utils, model: str, version: str) -> None:
        self._base = {"model": model, "version": version}
        gauge, counter = pb_utils.MetricFamily.GAUGE, pb_utils.MetricFamily.COUNTER
        self._admissions = pb_utils.MetricFamily(name="tritonllm_admission_total", kind=counter,
                                                 description="Requests admitted or refused, per tenant and reason")
        self._buckets = pb_utils.MetricFamily(name="tritonllm_rate_limit_bucket", kind=gauge,
                                              description="Current level of a tenant's token bucket")
        self._queue = pb_utils.MetricFamily(name="tritonllm_queue_depth", kind=gauge,
                                            description="Admitted requests waiting for their first token")
        self._metrics: dict[tuple, object] = {}
        # Admissions counted by execute() and flushed to Triton by update(), on the engine thread: every metric call
        # then comes from that one thread (concurrent metric IPC from two threads corrupted tritonserver's heap).
        self._pending: Counter[tuple[str, str, str]] = Counter()
        self._lock = threading.Lock()

    def _metric(self, family, **labels: str):
        key = (id(family), tuple(sorted(labels.items())))
        metric = self._metrics.get(key)
        if metric is None:
            metric = self._metrics[key] = family.Metric(labels={**self._base, **labels})
        return metric

    def observe(self, admission: Admission) -> None:
        """Count one admission decision (any thread); published at the next update()."""
        reason = "" if admission.admitted else admission.refusal.limit
        outcome = "admitted" if admission.admitted else "refused"
        with self._lock:
            self._pending[(admission.tenant.tenant, outcome, reason)] += 1

    def observe_unauthenticated(self) -> None:
        """Count a request refused for its credentials (no tenant: it is not known who sent it)."""
        with self._lock:
            self._pending[("", "refused", "unauthenticated")] += 1

    def update(self, snapshot: AdmissionSnapshot) -> None:
        """Publish counts and levels: call from one thread only (the engine loop's stats callback)."""
        with self._lock:
            pending, self._pending = self._pending, Counter()
        for (tenant, outcome, reason), count in pending.items():
            self._metric(self._admissions, tenant=tenant, outcome=outcome, reason=reason).increment(count)
        for tenant, levels in snapshot.buckets.items():
            for bucket, level in zip(("requests", "tokens"), levels):
                # An unlimited bucket is reported as -1 (Prometheus gauges take +Inf, most dashboards do not).
                value = -1.0 if math.isinf(level) else float(level)
                self._metric(self._buckets, tenant=tenant, bucket=bucket).set(value)
        for priority, depth in snapshot.queued_by_priority.items():
            self._metric(self._queue, priority=str(priority)).set(float(depth))

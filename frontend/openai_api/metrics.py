"""The OpenAI API's own Prometheus metrics (GET /metrics on its port; Triton's and the engine's stay on :8002).
Labels are the route and the status only: never a key, a tenant credential or request content."""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class FrontMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("tritonllm_openai_requests", "OpenAI API requests by route and HTTP status",
                                ["route", "status"], registry=self.registry)
        self.in_flight = Gauge("tritonllm_openai_in_flight", "OpenAI API requests being served", ["route"],
                               registry=self.registry)
        self.latency = Histogram("tritonllm_openai_request_seconds", "Time to the response's last byte",
                                 ["route"], buckets=_LATENCY_BUCKETS, registry=self.registry)

    @contextmanager
    def track(self, route: str) -> Iterator[None]:
        start = time.perf_counter()
        self.in_flight.labels(route).inc()
        try:
            yield
        finally:
            self.in_flight.labels(route).dec()
            self.latency.labels(route).observe(time.perf_counter() - start)

    def count(self, route: str, status: int) -> None:
        self.requests.labels(route, str(status)).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

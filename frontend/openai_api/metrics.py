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


class MetricsMiddleware:
    """Counts /v1 requests by route and status and times them to the last byte (a streamed answer included);
    plain ASGI, so streamed chunks pass straight through."""

    def __init__(self, app, metrics: FrontMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        route, status = route_label(scope["path"]), [500]

        async def send_status(message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        with self.metrics.track(route):
            try:
                await self.app(scope, receive, send_status)
            finally:
                self.metrics.count(route, status[0])


def route_label(path: str) -> str:
    """A metric label from a path: the known routes, else one bucket (paths come from clients)."""
    if path in ("/v1/completions", "/v1/chat/completions", "/v1/models"):
        return path
    return "/v1/models/{model}" if path.startswith("/v1/models/") else "other"

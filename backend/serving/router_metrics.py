"""The canary router's per-version metrics, measured on the responses it forwards.

While several versions of the tensorrt_llm model are loaded, that model publishes no metrics (the 2.51 Python
backend crashes the server when a model with several loaded versions uses the metric API: docs/canary.md), so
the figures a canary is judged by come from the router, which sees every response of every version:

- tritonllm_router_requests_total{model, served_version, outcome=ok|error}: counter;
- tritonllm_router_inflight_requests{model, served_version}: gauge, forwarded requests not finished yet;
- tritonllm_router_time_to_first_token_seconds{model, served_version}: histogram, streamed requests, from routing
  to the first response carrying tokens;
- tritonllm_router_inter_token_latency_seconds{model, served_version}: histogram, per streamed single-sequence
  request, the mean time between its tokens after the first response.

pb_utils is passed in (it exists only inside the stub); StreamTiming is plain Python, unit-tested anywhere.
Callers serialise the metric calls (the router calls them from its one thread per instance).
"""
from __future__ import annotations

from dataclasses import dataclass

from backend.serving.router_forwarding import Outcome
from backend.serving.latency_buckets import LATENCY_BUCKETS

REQUESTS = "tritonllm_router_requests_total"
INFLIGHT = "tritonllm_router_inflight_requests"
TTFT = "tritonllm_router_time_to_first_token_seconds"
ITL = "tritonllm_router_inter_token_latency_seconds"


@dataclass
class StreamTiming:
    """Token arrival times of one forwarded request (monotonic seconds)."""

    start: float
    first: float | None = None
    last: float | None = None
    first_tokens: int = 0  # tokens in the first response that had any
    tokens: int = 0

    def on_tokens(self, count: int, now: float) -> None:
        if count <= 0:
            return
        if self.first is None:
            self.first, self.first_tokens = now, count
        self.last = now
        self.tokens += count

    @property
    def ttft_s(self) -> float | None:
        return None if self.first is None else self.first - self.start

    @property
    def itl_s(self) -> float | None:
        """Mean seconds per token after the first response; None with no later token."""
        later = self.tokens - self.first_tokens
        if self.first is None or later <= 0:
            return None
        return (self.last - self.first) / later


class RouterMetrics:
    def __init__(self, pb_utils, model: str) -> None:
        kind = pb_utils.MetricFamily
        self._model = model
        self._families = {
            REQUESTS: kind(name=REQUESTS, kind=kind.COUNTER,
                           description="Requests routed, by served version and outcome (ok, error)"),
            INFLIGHT: kind(name=INFLIGHT, kind=kind.GAUGE, description="Forwarded requests not finished, by version"),
            TTFT: kind(name=TTFT, kind=kind.HISTOGRAM,
                       description="Routing to first token of streamed requests, by served version"),
            ITL: kind(name=ITL, kind=kind.HISTOGRAM,
                      description="Mean time between tokens of a streamed request, by served version"),
        }
        self._metrics: dict[tuple, object] = {}

    def _metric(self, family: str, version: int, **labels: str):
        key = (family, version, tuple(sorted(labels.items())))
        if key not in self._metrics:
            extra = {"buckets": LATENCY_BUCKETS} if family in (TTFT, ITL) else {}
            self._metrics[key] = self._families[family].Metric(
                labels={"model": self._model, "served_version": str(version), **labels}, **extra)
        return self._metrics[key]

    def started(self, version: int) -> None:
        self._metric(INFLIGHT, version).increment(1)

    def finished(self, version: int, outcome: Outcome, timing: StreamTiming | None) -> None:
        """One forwarded request ended; not counted when the version was gone (it is routed again)."""
        self._metric(INFLIGHT, version).increment(-1)
        if outcome is not Outcome.GONE:
            self._metric(REQUESTS, version, outcome=outcome.value).increment(1)
        if timing is not None and timing.ttft_s is not None:
            self._metric(TTFT, version).observe(timing.ttft_s)
            if timing.itl_s is not None:
                self._metric(ITL, version).observe(timing.itl_s)

    def close(self) -> None:
        """Metrics go before their families (Triton warns otherwise)."""
        self._metrics.clear()
        self._families.clear()

"""backend/serving/router_metrics.py: per-version timing of forwarded streams and the metrics published from it."""
from __future__ import annotations

import pytest

from backend.serving.router_forwarding import Outcome
from backend.serving.router_metrics import INFLIGHT, ITL, REQUESTS, TTFT, RouterMetrics, StreamTiming


def test_stream_timing_ttft_and_mean_gap_after_the_first_response():
    timing = StreamTiming(start=10.0)
    assert timing.ttft_s is None and timing.itl_s is None
    timing.on_tokens(0, 10.1)  # a response without tokens does not count
    timing.on_tokens(2, 10.5)
    assert timing.ttft_s == pytest.approx(0.5) and timing.itl_s is None
    timing.on_tokens(1, 10.7)
    timing.on_tokens(3, 11.1)
    assert timing.tokens == 6
    assert timing.itl_s == pytest.approx(0.6 / 4)  # 4 tokens after the first response, over 0.6 s


class _Metric:
    def __init__(self, labels, buckets=None):
        self.labels, self.buckets, self.value, self.observed = labels, buckets, 0.0, []

    def increment(self, v):
        self.value += v

    def observe(self, v):
        self.observed.append(v)


class _Family:
    COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
    made: dict = {}

    def __init__(self, name, kind, description):
        self.name, self.kind, self.metrics = name, kind, []
        _Family.made[name] = self

    def Metric(self, labels, buckets=None):  # noqa: N802 -- pb_utils's name
        metric = _Metric(labels, buckets)
        self.metrics.append(metric)
        return metric


class _PbUtils:
    MetricFamily = _Family


def test_router_metrics_per_version():
    m = RouterMetrics(_PbUtils, "tensorrt_llm")
    kinds = {name: family.kind for name, family in _Family.made.items()}
    assert kinds == {REQUESTS: "counter", INFLIGHT: "gauge", TTFT: "histogram", ITL: "histogram"}
    m.started(2)
    m.started(2)
    timing = StreamTiming(start=0.0)
    timing.on_tokens(1, 0.25)
    timing.on_tokens(1, 0.35)
    m.finished(2, Outcome.OK, timing)
    m.finished(2, Outcome.GONE, None)  # routed again elsewhere: in-flight drops, nothing counted
    (inflight,) = _Family.made[INFLIGHT].metrics
    assert inflight.value == 0 and inflight.labels == {"model": "tensorrt_llm", "served_version": "2"}
    (ok,) = _Family.made[REQUESTS].metrics
    assert ok.value == 1 and ok.labels["outcome"] == "ok"
    assert _Family.made[TTFT].metrics[0].observed == [pytest.approx(0.25)]
    assert _Family.made[ITL].metrics[0].observed == [pytest.approx(0.1)]
    assert _Family.made[TTFT].metrics[0].buckets  # histograms get bucket bounds
    m.close()

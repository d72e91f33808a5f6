"""ensembles/canary_compare.py: per-version stats from Prometheus text, and the promote / hold / rollback verdict."""
from __future__ import annotations

import pytest

from ensembles.canary_compare import Thresholds, VersionStats, histogram_quantile, parse_metrics, verdict, version_stats

METRICS = """\
# HELP tritonllm_router_requests_total Requests routed
# TYPE tritonllm_router_requests_total counter
tritonllm_router_requests_total{model="tensorrt_llm",outcome="ok",served_version="1"} 900
tritonllm_router_requests_total{model="tensorrt_llm",outcome="error",served_version="1"} 9
tritonllm_router_requests_total{model="tensorrt_llm",outcome="ok",served_version="2"} 200
tritonllm_router_time_to_first_token_seconds_bucket{model="tensorrt_llm",served_version="2",le="0.1"} 100
tritonllm_router_time_to_first_token_seconds_bucket{model="tensorrt_llm",served_version="2",le="0.2"} 190
tritonllm_router_time_to_first_token_seconds_bucket{model="tensorrt_llm",served_version="2",le="+Inf"} 200
tritonllm_router_inter_token_latency_seconds_sum{model="tensorrt_llm",served_version="2"} 0.5
tritonllm_router_inter_token_latency_seconds_count{model="tensorrt_llm",served_version="2"} 10
"""


def test_version_stats_from_metrics_text():
    stats = version_stats(parse_metrics(METRICS), 2)
    assert (stats.requests, stats.errors, stats.error_rate) == (200, 0, 0.0)
    assert stats.ttft_p50_s == pytest.approx(0.1)
    assert stats.ttft_p95_s == pytest.approx(0.2)  # rank 190 is the 0.2 bucket's top
    assert stats.tokens_per_s == pytest.approx(20.0)
    one = version_stats(parse_metrics(METRICS), 1)
    assert (one.requests, one.errors) == (909, 9) and one.ttft_p50_s is None and one.tokens_per_s is None


def test_histogram_quantile_interpolates_like_prometheus():
    # rank 15 of 30: 5 of the 20 observations into (1, 2]
    assert histogram_quantile(0.5, [(1.0, 10), (2.0, 30), (float("inf"), 30)]) == pytest.approx(1.25)
    assert histogram_quantile(0.99, [(1.0, 10), (float("inf"), 20)]) == 1.0
    assert histogram_quantile(0.5, [(1.0, 0), (float("inf"), 0)]) is None


def _stats(version, requests=500, errors=0, p50=0.1, p95=0.2, tps=50.0):
    return VersionStats(version, requests, errors, p50, p95, tps)


def test_verdicts():
    limits = Thresholds()
    assert verdict(_stats(1), _stats(2), limits).decision == "promote"
    assert verdict(_stats(1), _stats(2, errors=50), limits).decision == "rollback"
    slow = verdict(_stats(1), _stats(2, p95=0.5), limits)
    assert slow.decision == "rollback" and "TTFT p95 ratio 2.50" in slow.reasons[0]
    assert verdict(_stats(1), _stats(2, requests=10), limits).decision == "hold"
    assert verdict(_stats(1), _stats(2, tps=10.0), limits).decision == "hold"
    assert verdict(_stats(1), _stats(2, p50=0.2), limits).decision == "hold"


def test_thresholds_file(tmp_path):
    path = tmp_path / "canary.toml"
    path.write_text("[canary]\nmin_requests = 10\nmax_ttft_p95_ratio = 2.0\n")
    assert Thresholds.load(path) == Thresholds(min_requests=10, max_ttft_p95_ratio=2.0)
    path.write_text("[canary]\nmax_error_rte = 0.1\n")
    with pytest.raises(ValueError, match="unknown keys \\['max_error_rte'\\]"):
        Thresholds.load(path)
    path.write_text("[canary]\nmax_error_rate = 2.0\n")
    with pytest.raises(ValueError, match=r"max_error_rate must be in \[0, 1\]"):
        Thresholds.load(path)

"""The tensorrt_llm model's Prometheus metrics, through the Python backend's metric API (served on Triton's
metrics port). Names and labels are tensorrtllm_backend's, so dashboards built for it work unchanged; the
time-to-first-token / inter-token-latency histograms and the prefix-cache hit rate are ours.

pb_utils is passed in (it exists only inside the Python backend's stub), keeping this importable anywhere.
"""
from __future__ import annotations

from backend.engine.interface import RequestOutput
from backend.engine.stats import EngineStats
from backend.serving.latency_buckets import LATENCY_BUCKETS

TOKEN_LEN_BUCKETS = [10.0, 50.0, 100.0, 500.0, 1000.0]  # the anchor's nv_llm_*_token_len buckets

# (family, description, label key, {label value: EngineStats attribute})
_GAUGES = [
    ("nv_trt_llm_request_metrics", "TRT LLM request metrics", "request_type",
     {"active": "active_requests", "max": "max_requests", "scheduled": "scheduled_requests",
      "context": "context_requests", "waiting": "waiting_requests"}),
    ("nv_trt_llm_kv_cache_block_metrics", "TRT LLM KV cache block metrics", "kv_cache_block_type",
     {"max": "max_blocks", "free": "free_blocks", "used": "used_blocks", "tokens_per": "tokens_per_block",
      "reused": "reused_blocks", "fraction": "used_fraction"}),
    ("nv_trt_llm_inflight_batcher_metrics", "TRT LLM inflight batcher metrics", "inflight_batcher_specific_metric",
     {"total_context_tokens": "total_context_tokens", "generation_requests": "generation_requests",
      "paused_requests": "paused_requests"}),
    ("nv_trt_llm_general_metrics", "General TRT LLM metrics", "general_type",
     {"timestamp": "timestamp_us", "iteration_counter": "iteration_counter"}),
    ("tritonllm_prefix_cache", "Prefix cache: hit rate over admitted requests' full prompt blocks, cached blocks",
     "prefix_cache_metric", {"hit_rate": "prefix_cache_hit_rate", "cached_blocks": "cached_blocks"}),
]


class TritonMetrics:
    def __init__(self, pb_utils, model: str, version: str) -> None:
        base = {"model": model, "version": version}
        self._gauges = []  # (metric, EngineStats attribute)
        self._families = []  # kept alive: a family must outlive its metrics
        for name, description, key, values in _GAUGES:
            family = pb_utils.MetricFamily(name=name, description=description, kind=pb_utils.MetricFamily.GAUGE)
            self._families.append(family)
            for label, attr in values.items():
                self._gauges.append((family.Metric(labels={**base, key: label}), attr))
        self._input_len = self._histogram(pb_utils, "nv_llm_input_token_len", "Input token length", base,
                                          TOKEN_LEN_BUCKETS)
        self._output_len = self._histogram(pb_utils, "nv_llm_output_token_len", "Output token length", base,
                                           TOKEN_LEN_BUCKETS)
        self._ttft = self._histogram(pb_utils, "tritonllm_time_to_first_token_seconds",
                                     "Arrival to first generated token", base, LATENCY_BUCKETS)
        self._itl = self._histogram(pb_utils, "tritonllm_inter_token_latency_seconds",
                                    "Mean time between generated tokens, per request", base, LATENCY_BUCKETS)

    def _histogram(self, pb_utils, name: str, description: str, labels: dict, buckets: list[float]):
        family = pb_utils.MetricFamily(name=name, description=description, kind=pb_utils.MetricFamily.HISTOGRAM)
        self._families.append(family)
        return family.Metric(labels=labels, buckets=buckets)

    def update(self, stats: EngineStats) -> None:
        for metric, attr in self._gauges:
            metric.set(float(getattr(stats, attr)))

    def observe_finished(self, out: RequestOutput) -> None:
        """Per-request histograms, once a request ends (cancelled ones included)."""
        self._input_len.observe(float(out.num_input_tokens))
        self._output_len.observe(float(out.num_output_tokens))
        perf = out.perf
        if perf is None or not perf.first_token_time_ns:
            return
        self._ttft.observe((perf.first_token_time_ns - perf.arrival_time_ns) / 1e9)
        if out.num_output_tokens > 1:
            self._itl.observe((perf.last_token_time_ns - perf.first_token_time_ns) / 1e9 / (out.num_output_tokens - 1))


class NoMetrics:
    """Stands in for TritonMetrics and TenantMetrics where the model publishes none (ServingConfig.publish_metrics
    false: several versions loaded at once, where the 2.51 Python backend's metric API crashes the server)."""

    def update(self, *_) -> None:
        pass

    def observe_finished(self, _out: RequestOutput) -> None:
        pass

    def observe(self, _admission) -> None:
        pass

    def observe_unauthenticated(self) -> None:
        pass

"""Compare the canary with the stable version from the metrics endpoint, and a verdict: promote, hold or rollback.

Per version (the `served_version` label of the router's metrics, backend/serving/router_metrics.py: while several versions
are loaded the tensorrt_llm model publishes none):
    error rate   tritonllm_router_requests_total{outcome="error"} / all its requests
    TTFT p50/p95 from the tritonllm_router_time_to_first_token_seconds histogram (linear within a bucket, as
                 Prometheus' histogram_quantile)
    tokens/s     decode tokens per second per stream: 1 / mean inter-token latency
                 (tritonllm_router_inter_token_latency_seconds)
Counters are cumulative since the version was loaded; thresholds come from a TOML file (docs/canary.md).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields
from pathlib import Path

import tomllib

from backend.serving.router_metrics import ITL, TTFT
from backend.serving.router_metrics import REQUESTS as ROUTED

_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][\w:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def parse_metrics(text: str) -> list[Sample]:
    samples = []
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match and not line.startswith("#"):
            labels = dict(_LABEL.findall(match.group("labels") or ""))
            samples.append(Sample(match.group("name"), labels, float(match.group("value"))))
    return samples


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """q-quantile from cumulative (upper bound, count) buckets, +Inf included; None without observations."""
    buckets = sorted(buckets)
    total = buckets[-1][1] if buckets else 0.0
    if total <= 0:
        return None
    rank, lower, below = q * total, 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if math.isinf(upper):
                return lower  # beyond the last finite bound: its bound is the best estimate
            return lower + (upper - lower) * (rank - below) / (count - below) if count > below else upper
        lower, below = upper, count
    return lower


@dataclass(frozen=True)
class VersionStats:
    version: int
    requests: int
    errors: int
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    tokens_per_s: float | None

    @property
    def error_rate(self) -> float | None:
        return self.errors / self.requests if self.requests else None


def version_stats(samples: list[Sample], version: int, model: str = "tensorrt_llm") -> VersionStats:
    def pick(name: str, **labels: str) -> list[Sample]:
        return [s for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]

    v = str(version)
    ok = sum(s.value for s in pick(ROUTED, model=model, served_version=v, outcome="ok"))
    errors = sum(s.value for s in pick(ROUTED, model=model, served_version=v, outcome="error"))
    buckets = [(float(s.labels["le"]), s.value) for s in pick(TTFT + "_bucket", model=model, served_version=v)]
    itl_sum = sum(s.value for s in pick(ITL + "_sum", model=model, served_version=v))
    itl_count = sum(s.value for s in pick(ITL + "_count", model=model, served_version=v))
    return VersionStats(version, int(ok + errors), int(errors), histogram_quantile(0.5, buckets),
                        histogram_quantile(0.95, buckets), itl_count / itl_sum if itl_sum > 0 else None)


@dataclass(frozen=True)
class Thresholds:
    min_requests: int = 100  # fewer canary requests: hold (not enough evidence)
    max_error_rate: float = 0.01  # canary above: rollback
    max_error_rate_increase: float = 0.005  # canary minus stable above: rollback
    max_ttft_p95_ratio: float = 1.5  # canary / stable above: rollback
    max_ttft_p50_ratio: float = 1.25  # canary / stable above: hold
    min_tokens_per_s_ratio: float = 0.8  # canary / stable below: hold

    def __post_init__(self) -> None:
        if self.min_requests < 0:
            raise ValueError(f"min_requests must be >= 0, got {self.min_requests}")
        for name in ("max_error_rate", "max_error_rate_increase"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        for name in ("max_ttft_p95_ratio", "max_ttft_p50_ratio", "min_tokens_per_s_ratio"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")

    @classmethod
    def load(cls, path: Path) -> "Thresholds":
        """The [canary] table of a TOML file; unknown keys are an error (a typo would silently keep a default)."""
        try:
            data = tomllib.loads(Path(path).read_text()).get("canary", {})
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ValueError(f"{path}: {exc}") from exc
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{path}: unknown keys {unknown} in [canary]; known: {sorted(known)}")
        return cls(**data)


@dataclass(frozen=True)
class Verdict:
    decision: str  # promote | hold | rollback
    reasons: tuple[str, ...]


def _ratio(canary: float | None, stable: float | None) -> float | None:
    return canary / stable if canary is not None and stable else None


def verdict(stable: VersionStats, canary: VersionStats, limits: Thresholds) -> Verdict:
    rollback, hold = [], []
    rate, base = canary.error_rate, stable.error_rate or 0.0
    if rate is not None and rate > limits.max_error_rate:
        rollback.append(f"canary error rate {rate:.4f} > {limits.max_error_rate}")
    if rate is not None and rate - base > limits.max_error_rate_increase:
        rollback.append(f"canary error rate {rate:.4f} exceeds stable's {base:.4f} by more than "
                        f"{limits.max_error_rate_increase}")
    p95 = _ratio(canary.ttft_p95_s, stable.ttft_p95_s)
    if p95 is not None and p95 > limits.max_ttft_p95_ratio:
        rollback.append(f"TTFT p95 ratio {p95:.2f} > {limits.max_ttft_p95_ratio}")
    if canary.requests < limits.min_requests:
        hold.append(f"only {canary.requests} canary requests (< {limits.min_requests})")
    p50 = _ratio(canary.ttft_p50_s, stable.ttft_p50_s)
    if p50 is not None and p50 > limits.max_ttft_p50_ratio:
        hold.append(f"TTFT p50 ratio {p50:.2f} > {limits.max_ttft_p50_ratio}")
    tps = _ratio(canary.tokens_per_s, stable.tokens_per_s)
    if tps is not None and tps < limits.min_tokens_per_s_ratio:
        hold.append(f"tokens/s ratio {tps:.2f} < {limits.min_tokens_per_s_ratio}")
    if rollback:
        return Verdict("rollback", tuple(rollback + hold))
    if hold:
        return Verdict("hold", tuple(hold))
    return Verdict("promote", ("canary within every threshold",))

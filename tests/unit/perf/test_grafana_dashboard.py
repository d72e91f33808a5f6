"""perf/grafana/tritonllm_dashboard.json parses, and every metric it queries is one that is exported: ours by the
code (backend/serving/{triton,tenant,router}_metrics.py), with label values the code sets;
Triton's own by name (tests/integration/test_perf_tools.py checks those against a real server's /metrics)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from backend.serving import router_metrics
from backend.serving.triton_metrics import _GAUGES

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "perf" / "grafana" / "tritonllm_dashboard.json"
EXPORTERS = [ROOT / "backend" / "serving" / "triton_metrics.py", ROOT / "backend" / "serving" / "tenant_metrics.py",
             ROOT / "backend" / "serving" / "router_metrics.py"]
# Triton server's own metric families the dashboard uses (Triton's metrics documentation; 2.51 on CPU).
TRITON_METRICS = {
    "nv_inference_request_success", "nv_inference_request_failure", "nv_inference_count", "nv_inference_exec_count",
    "nv_inference_request_duration_us", "nv_inference_queue_duration_us", "nv_inference_compute_input_duration_us",
    "nv_inference_compute_infer_duration_us", "nv_inference_compute_output_duration_us",
    "nv_inference_pending_request_count", "nv_cpu_utilization", "nv_cpu_memory_total_bytes",
    "nv_cpu_memory_used_bytes",
}
METRIC = re.compile(r"\b((?:nv|tritonllm)_[a-z_]+)")
SELECTOR = re.compile(r"\b((?:nv|tritonllm)_[a-z_]+)\{([^}]*)\}")
MATCHER = re.compile(r'(\w+)\s*(=~|=|!=|!~)\s*"([^"]*)"')


def exported_by_code() -> set[str]:
    """Metric family names the code creates, histograms with Prometheus' _bucket/_sum/_count series."""
    names = set()
    for path in EXPORTERS:
        names |= set(re.findall(r'"((?:nv|tritonllm)_[a-z_]+)"', path.read_text()))
    histograms = set(re.findall(r'_histogram\(pb_utils, "([a-z_]+)"', EXPORTERS[0].read_text()))
    assert histograms, "no histograms found in backend/serving/triton_metrics.py: update this test's pattern"
    histograms |= {router_metrics.TTFT, router_metrics.ITL}
    return names | {h + suffix for h in histograms for suffix in ("_bucket", "_sum", "_count")}


def exprs() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    targets = [t for p in dashboard["panels"] for t in p.get("targets", [])]
    assert targets, "the dashboard has no queries"
    return [t["expr"] for t in targets]


def dashboard_metrics() -> set[str]:
    return {m for e in exprs() for m in METRIC.findall(e)}


def test_dashboard_is_valid_grafana_json():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["title"] and dashboard["uid"] and dashboard["schemaVersion"] >= 30
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in dashboard["panels"]:
        assert panel["type"] == "row" or panel.get("targets"), f"panel {panel['title']!r} has no query"


def test_every_queried_metric_is_exported():
    known = exported_by_code() | TRITON_METRICS
    unknown = dashboard_metrics() - known
    assert not unknown, f"the dashboard queries metrics nothing exports: {sorted(unknown)}"


def test_every_exported_family_of_ours_is_on_the_dashboard():
    ours = {re.sub(r"_(bucket|sum|count)$", "", m) for m in exported_by_code()}
    shown = {re.sub(r"_(bucket|sum|count)$", "", m) for m in dashboard_metrics()}
    assert ours - shown == set(), f"exported but not on the dashboard: {sorted(ours - shown)}"


@pytest.mark.parametrize("family, key, values", [(f, k, v) for f, _, k, v in _GAUGES])
def test_gauge_label_values_match_the_code(family, key, values):
    """A selector like nv_trt_llm_request_metrics{request_type=~"active|waiting"} names only label values the
    backend sets, under the backend's label key."""
    for expr in exprs():
        for name, matchers in SELECTOR.findall(expr):
            if name != family:
                continue
            for label, op, value in MATCHER.findall(matchers):
                if label in ("model", "version"):
                    continue
                assert label == key, f"{family} has no label {label!r} (it is {key!r}): {expr}"
                wanted = value.split("|") if op == "=~" else [value]
                assert set(wanted) <= set(values), f"{family}{{{key}}} has no value in {wanted}: {expr}"

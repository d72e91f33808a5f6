"""The benchmarking tools against the real server: perf_analyzer (as installed by `make perf-tools`) over gRPC
streaming, to the ensemble and to tensorrt_llm directly, its CSV and export parsed by perf/perf_analyzer/sweep.py;
a bounded headless locust run of perf/locust/grpc_streaming_locustfile.py; and the Triton metrics the Grafana
dashboard queries present on the server's metrics port."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration import metrics
from tests.unit.perf.test_grafana_dashboard import TRITON_METRICS, dashboard_metrics

ROOT = Path(__file__).resolve().parents[2]
PERF_ANALYZER = ROOT / "perf" / "tools" / "perf_analyzer"


@pytest.fixture(scope="module")
def perf_analyzer() -> Path:
    probe = subprocess.run([str(PERF_ANALYZER), "--version"], capture_output=True, text=True)
    assert probe.returncode == 0, f"perf_analyzer does not run (install it: make perf-tools): {probe.stderr[-500:]}"
    return PERF_ANALYZER


def sweep(server, target: str, out: Path, requests: int) -> dict:
    cmd = [sys.executable, str(ROOT / "perf" / "perf_analyzer" / "sweep.py"), "--url", server.grpc_url,
           "--target", target, "--concurrency", "2", "--request-count", str(requests), "--max-tokens", "16",
           "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    print(proc.stdout)
    [point] = json.loads((out / "sweep.json").read_text())
    return point


@pytest.mark.parametrize("target", ["ensemble", "tensorrt_llm"])
def test_perf_analyzer_streams_and_its_output_parses(server, perf_analyzer, target, tmp_path):
    point = sweep(server, target, tmp_path, requests=8)
    assert point["requests"] >= 8  # perf_analyzer may finish requests it had in flight
    assert point["throughput_req_s"] > 0 and point["output_tok_s"] > 0
    assert 0 < point["ttft_p50_ms"] <= point["latency_p50_ms"]
    log = (tmp_path / f"{target}_concurrency_2.log").read_text()
    assert "error" not in log.lower(), log[-2000:]
    with open(tmp_path / f"{target}_concurrency_2.csv") as f:
        row = next(csv.DictReader(f))
    assert row["Concurrency"] == "2" and float(row["Inferences/Second"]) > 0


def test_dashboard_triton_metrics_are_served(server):
    """Triton's own metric families the dashboard queries exist on this server's metrics port (2.51, CPU)."""
    text = metrics.scrape(server.opts.metrics_port)
    served = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}
    wanted = dashboard_metrics() & TRITON_METRICS
    assert wanted and wanted <= served, f"not served: {sorted(wanted - served)}"


def test_locust_grpc_streaming_bounded_run_has_no_failures(server, tmp_path):
    """4 users streaming for 10 s (moderate load): zero failures, and TTFT / ITL / tokens-per-second recorded for
    every request."""
    locustfile = ROOT / "perf" / "locust" / "grpc_streaming_locustfile.py"
    cmd = [sys.executable, "-m", "locust", "-f", str(locustfile), "--headless", "-u", "4", "-r", "4", "-t", "10s",
           "--host", server.grpc_url, "--csv", str(tmp_path / "run"), "--html", str(tmp_path / "run.html"),
           "--only-summary"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**os.environ, "LOCUST_MAX_TOKENS": "16"})
    assert proc.returncode == 0, proc.stderr[-3000:]  # locust exits 1 when any failure was recorded
    with open(tmp_path / "run_stats.csv") as f:
        rows = {row["Type"]: row for row in csv.DictReader(f) if row["Name"] == "ensemble"}
    assert set(rows) == {"GRPC_STREAM", "TTFT", "ITL", "TOKENS_PER_S"}, (rows.keys(), proc.stderr[-2000:])
    requests = int(rows["GRPC_STREAM"]["Request Count"])
    print(f"locust: {requests} requests, TTFT median {rows['TTFT']['Median Response Time']} ms, "
          f"ITL median {rows['ITL']['Median Response Time']} ms, "
          f"tokens/s median {rows['TOKENS_PER_S']['Median Response Time']}")
    assert requests >= 4
    assert all(int(r["Failure Count"]) == 0 for r in rows.values())
    assert all(int(rows[kind]["Request Count"]) == requests for kind in ("TTFT", "ITL", "TOKENS_PER_S"))
    assert float(rows["TOKENS_PER_S"]["Average Response Time"]) > 0
    assert (tmp_path / "run.html").stat().st_size > 0

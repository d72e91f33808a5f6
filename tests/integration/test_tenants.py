"""Tenants through the real tritonserver: rate limits refuse with UNAVAILABLE + retry_after_ms while others are
served, a heavy tenant cannot starve a light one, deadlines end requests and free their blocks, prefix-cache
salting by tenant, and the admin key guarding model load/unload. Own server: limits file (every tenant with an API
key), admin key, explicit model control, the credential headers forwarded. Each tenant authenticates with its key."""
from __future__ import annotations

import csv
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from backend.policy.api_keys import key_hash, new_key
from ensembles.render import RepoSpec, render
from ensembles.server import ADMIN_HEADER, GRPC_ADMIN_HEADER, ServerOptions, TritonServer
from tests.integration import metrics, tenant_client
from tests.integration.conftest import _free_ports, stopped_cleanly
from tests.integration.test_generation import LONG_PROMPT

ADMIN_KEY = "test-admin-key"
BLOCKS = "nv_trt_llm_kv_cache_block_metrics"
MAX_PROMPT_BYTES = 4096
LIMITS = """
[global]
max_queued_requests = 64
priority_aging_s = 4          # test_aging_...: a standard request overtakes a premium flood within seconds

[tiers.top]                   # far above the others: aging never reorders it within a test
priority = 50

[tenants.bursty]              # 3 requests at once, then one every 10 s
requests_per_s = 0.1
request_burst = 3

[tenants.other]

[tenants.heavy]
tier = "batch"
max_concurrent = 4

[tenants.light]
tier = "top"

[tenants.flood]
tier = "premium"

[tenants.late]

[tenants.salted-a]
salt_prefix_cache = true

[tenants.salted-b]
salt_prefix_cache = true

[tenants.locust-ok]

[tenants.locust-over]
requests_per_s = 1
request_burst = 2
"""
# Light tenant's time to first token while the heavy one saturates its share: the bound we state.
LIGHT_TTFT_BOUND_S = 1.0  # measured here: median 0.04 s, max 0.05 s (idle: 0.014 s)
TENANTS = ("bursty", "other", "heavy", "light", "flood", "late", "salted-a", "salted-b", "locust-ok", "locust-over")
KEYS = {tenant: new_key() for tenant in TENANTS}


def _limits_with_keys() -> str:
    """LIMITS with each tenant's key digest in its table (right under the table's header)."""
    text = LIMITS
    for tenant in TENANTS:
        header = f"[tenants.{tenant}]"
        text = text.replace(header, f'{header}\napi_key_sha256 = ["{key_hash(KEYS[tenant])}"]')
    return text


def generate(url: str, prompt: str, max_tokens: int, tenant: str | None = None, **kwargs):
    """tenant_client.generate as `tenant`, authenticated by its API key."""
    return tenant_client.generate(url, prompt, max_tokens, api_key=KEYS[tenant] if tenant else None, **kwargs)


@pytest.fixture(scope="module")
def tserver(demo, tmp_path_factory) -> TritonServer:
    root = tmp_path_factory.mktemp("tenants")
    limits = root / "limits.toml"
    limits.write_text(_limits_with_keys())
    spec = RepoSpec(engine_dir=demo.engine_dir, tokenizer_dir=demo.tokenizer_dir, max_batch_size=8,
                    max_input_len=512, max_seq_len=1024, max_num_tokens=1024, cancellation_check_period_ms=20,
                    limits_file=limits, max_prompt_bytes=MAX_PROMPT_BYTES)
    repo = render(spec, root / "model_repository")
    http, grpc, port = _free_ports(3)
    opts = ServerOptions(repo, http, grpc, port, admin_key=ADMIN_KEY,
                         extra_args=("--model-control-mode=explicit", "--load-model=*"))
    srv = TritonServer(opts, log_path=root / "tritonserver.log")
    srv.start(ready_timeout_s=300, models=("ensemble", "tensorrt_llm", "preprocessing", "postprocessing"))
    yield srv
    srv.stop()
    stopped_cleanly(root / "tritonserver.log")


def test_burst_over_the_limit_is_refused_while_others_are_served(tserver):
    with ThreadPoolExecutor(8) as pool:
        bursty = [pool.submit(generate, tserver.grpc_url, f"def burst_{i}(", 4, tenant="bursty") for i in range(6)]
        others = [pool.submit(generate, tserver.grpc_url, f"def other_{i}(", 4, tenant="other") for i in range(4)]
        bursty, others = [f.result() for f in bursty], [f.result() for f in others]
    assert all(o.ok and o.texts for o in others), [o.error for o in others]
    served = [o for o in bursty if o.ok]
    refused = [o for o in bursty if not o.ok]
    assert 3 <= len(served) <= 4 and all(o.texts for o in served)  # the burst (+1 if a refill landed)
    assert len(refused) >= 2
    print("gRPC refusal:", refused[0].error)
    for o in refused:
        assert "tenant 'bursty' is over its rate of 0.1 requests/s" in o.error, o.error
        assert "limit requests_per_s" in o.error and "retry_after_ms=" in o.error
        assert 0 < int(o.error.rsplit("retry_after_ms=", 1)[1].split()[0].rstrip(")")) <= 10_000


def _bearer(tenant: str) -> str:
    return f"Bearer {KEYS[tenant]}"


def test_http_tenant_parameter_is_refused_too(tserver):
    """HTTP /generate: Triton 2.51 forwards no header there, so the key is a body field (it becomes a parameter)."""
    url = f"http://{tserver.http_url}/v2/models/ensemble/generate"
    body = {"text_input": "def ", "max_tokens": 2, "authorization": _bearer("bursty")}
    for _ in range(4):  # the gRPC test above spent the burst; refill is 1 per 10 s
        resp = requests.post(url, json=body, timeout=60)
        if resp.status_code != 200:
            break
    # Triton 2.51's generate endpoint answers every model error with 400; the message tells a refusal apart.
    assert resp.status_code in (400, 503) and "request refused: tenant 'bursty'" in resp.json()["error"], resp.text
    assert "retry_after_ms=" in resp.json()["error"]
    assert requests.post(url, json={**body, "authorization": _bearer("other")}, timeout=60).status_code == 200
    bad = requests.post(url, json={**body, "tenant_id": "../../etc/passwd"}, timeout=60)
    assert bad.status_code == 400 and "tenant id" in bad.json()["error"]


def test_admission_metrics_per_tenant_and_reason(tserver):
    text = metrics.scrape(tserver.opts.metrics_port)
    assert metrics.value(text, "tritonllm_admission_total", tenant="bursty", outcome="refused",
                         reason="requests_per_s") >= 2
    assert metrics.value(text, "tritonllm_admission_total", tenant="other", outcome="admitted") >= 4
    level = metrics.wait_until(tserver.opts.metrics_port, "tritonllm_rate_limit_bucket", lambda v: v < 3,
                               tenant="bursty", bucket="requests")
    assert level is not None and 0 <= level < 3
    assert metrics.value(text, "tritonllm_queue_depth", priority="1") is not None


def test_heavy_tenant_cannot_starve_a_light_one(tserver):
    """The heavy (batch tier, max_concurrent 4) tenant floods with long generations; the light (top-tier) tenant's
    time to first token stays under LIGHT_TTFT_BOUND_S, and the heavy tenant's excess is refused, not queued."""
    idle = [generate(tserver.grpc_url, f"def light_idle_{i}(", 8, tenant="light", stream=True).ttft_s
            for i in range(3)]
    with ThreadPoolExecutor(16) as pool:
        heavy = [pool.submit(generate, tserver.grpc_url, f"def heavy_{i}(x):\n", 300, tenant="heavy", stream=True)
                 for i in range(12)]
        # The heavy tenant's admitted requests (its cap: 4) are generating.
        running = metrics.wait_until(tserver.opts.metrics_port, "nv_trt_llm_request_metrics", lambda v: v >= 4,
                                     request_type="active")
        assert running is not None and running >= 4, running
        light = [generate(tserver.grpc_url, f"def light_{i}(", 8, tenant="light", stream=True) for i in range(5)]
        heavy = [f.result() for f in heavy]
    assert all(o.ok for o in light), [o.error for o in light]
    ttfts = [o.ttft_s for o in light]
    print(f"light TTFT idle {statistics.median(idle):.3f} s, under heavy load median "
          f"{statistics.median(ttfts):.3f} s, max {max(ttfts):.3f} s")
    assert max(ttfts) < LIGHT_TTFT_BOUND_S, ttfts
    assert sum(o.ok for o in heavy) >= 4
    refused = [o.error for o in heavy if not o.ok]
    assert refused and all("max_concurrent is 4" in e and "retry_after_ms=" in e for e in refused), refused


def test_queued_premium_request_is_scheduled_before_queued_batch_ones(tserver):
    """The running batch (8) is full of standard-tier generations that end one after another; two batch-tier
    requests and then a top-tier one (priority 50: aging at 4 s a level cannot reorder it) queue behind them: the
    top-tier one is scheduled first."""
    first_scheduled = ("first_scheduled_time_ns",)
    perf = {"return_perf_metrics": np.array([[True]])}
    with ThreadPoolExecutor(12) as pool:
        # Long enough to keep the batch full while the others queue on a fast machine too (120 + 4i tokens ended
        # before the batch-tier requests were seen waiting on a Zen 5 EPYC), and ending 40 steps apart, so that no
        # two end in one step even when their admissions spread over a few steps (two slots at once would schedule
        # the premium request and a batch-tier one in the same step).
        fillers = [pool.submit(generate, tserver.grpc_url, f"def filler_{i}(x):\n", 600 + 40 * i, tenant="other",
                               min_tokens=np.array([[600 + 40 * i]], dtype=np.int32)) for i in range(8)]
        active = metrics.wait_until(tserver.opts.metrics_port, "nv_trt_llm_request_metrics", lambda v: v >= 8,
                                    request_type="active")
        assert active == 8, active
        batch = [pool.submit(generate, tserver.grpc_url, f"def batch_{i}(", 4, tenant="heavy",
                             outputs=first_scheduled, **perf) for i in range(2)]
        # Both batch-tier requests are queued (the running batch is full) before the premium one is sent.
        waiting = metrics.wait_until(tserver.opts.metrics_port, "nv_trt_llm_request_metrics", lambda v: v >= 2,
                                     request_type="waiting")
        assert waiting is not None and waiting >= 2, waiting
        premium = generate(tserver.grpc_url, "def premium(", 4, tenant="light", outputs=first_scheduled, **perf)
        batch = [f.result() for f in batch]
        assert all(f.result().ok for f in fillers)
    assert premium.ok and all(o.ok for o in batch), [premium.error] + [o.error for o in batch]
    scheduled = [int(o.outputs["first_scheduled_time_ns"].reshape(-1)[0]) for o in [premium] + batch]
    assert scheduled[0] < min(scheduled[1:]), scheduled


def test_aging_serves_a_lower_tier_while_a_higher_tier_floods(tserver):
    """The soak's starvation (perf/SOAK.md): 20 premium loops keep the batch (8) full and premium requests queued.
    Strict priority would schedule the standard-tier request only after the flood; with priority_aging_s = 4 it is
    scheduled while the flood goes on, ahead of premium requests that arrived before it was scheduled."""
    perf = {"return_perf_metrics": np.array([[True]])}
    times = ("arrival_time_ns", "first_scheduled_time_ns")
    done, flood = threading.Event(), []

    def loop(i: int) -> None:
        deadline = time.monotonic() + 120
        while not done.is_set() and time.monotonic() < deadline:
            out = generate(tserver.grpc_url, f"def flood_{i}(x):\n", 48, tenant="flood", outputs=times,
                           min_tokens=np.array([[48]], dtype=np.int32), **perf)
            assert out.ok, out.error
            flood.append([int(out.outputs[n].reshape(-1)[0]) for n in times])

    with ThreadPoolExecutor(20) as pool:
        loops = [pool.submit(loop, i) for i in range(20)]
        waiting = metrics.wait_until(tserver.opts.metrics_port, "nv_trt_llm_request_metrics", lambda v: v >= 6,
                                     request_type="waiting")
        assert waiting is not None and waiting >= 6, waiting
        late = generate(tserver.grpc_url, "def late(", 4, tenant="late", outputs=times, **perf)
        done.set()
        for f in loops:
            f.result()
    assert late.ok, late.error
    late_scheduled = int(late.outputs["first_scheduled_time_ns"].reshape(-1)[0])
    overtaken = [a for a, scheduled in flood if a < late_scheduled < scheduled]
    waited_s = (late_scheduled - int(late.outputs["arrival_time_ns"].reshape(-1)[0])) / 1e9
    print(f"aging: the standard request waited {waited_s:.1f} s; {len(overtaken)} earlier premium ones after it")
    assert overtaken, ("no premium request that arrived before the standard one was scheduled after it", waited_s)


def test_deadline_ends_the_request_and_frees_its_blocks(tserver):
    port = tserver.opts.metrics_port
    idle = metrics.value(metrics.scrape(port), BLOCKS, kv_cache_block_type="max")
    assert metrics.wait_for(port, BLOCKS, idle, kv_cache_block_type="free") == idle
    start = time.monotonic()
    out = generate(tserver.grpc_url, "def slow(x):\n", 900, tenant="other", stream=True,
                   parameters={"timeout_ms": 800})
    elapsed = time.monotonic() - start
    assert not out.ok and "request timed out: its deadline (timeout_ms=800) passed" in out.error, out.error
    assert elapsed < 10, elapsed  # 900 tokens would take far longer on CPU
    assert metrics.wait_for(port, BLOCKS, idle, kv_cache_block_type="free") == idle
    bad = generate(tserver.grpc_url, "def ", 2, tenant="other", parameters={"timeout_ms": -5})
    assert "timeout_ms must be an integer number of milliseconds" in bad.error


def _reused(tserver, tenant: str, prompt: str) -> int:
    out = generate(tserver.grpc_url, prompt, 2, tenant=tenant, outputs=("kv_cache_reused_blocks",),
                   return_perf_metrics=np.array([[True]]))
    assert out.ok, out.error
    return int(out.outputs["kv_cache_reused_blocks"].reshape(-1)[0])


def test_salted_tenants_share_no_cached_blocks(tserver):
    prefix = f"# {uuid.uuid4().hex}\n" + LONG_PROMPT * 2  # ~190 tokens: several full blocks of 32
    assert _reused(tserver, "salted-a", prefix + "a(") == 0
    assert _reused(tserver, "salted-b", prefix + "b(") == 0  # same prefix, other salt: no hit
    assert _reused(tserver, "salted-a", prefix + "c(") >= 4  # its own cache still works
    assert _reused(tserver, "other", prefix + "d(") == 0  # unsalted: first time unsalted
    assert _reused(tserver, "light", prefix + "e(") >= 4  # unsalted tenants share


def test_prompt_over_the_byte_limit_is_invalid_arg(tserver):
    out = generate(tserver.grpc_url, "x" * (MAX_PROMPT_BYTES + 1), 2, tenant="other")
    assert f"more than the limit ({MAX_PROMPT_BYTES})" in out.error


def test_repository_control_needs_the_admin_key(tserver):
    http = f"http://{tserver.http_url}/v2/repository/models/postprocessing"
    refused = requests.post(f"{http}/load", timeout=60)
    assert refused.status_code == 403, (refused.status_code, refused.text)
    client = grpcclient.InferenceServerClient(tserver.grpc_url)
    with pytest.raises(InferenceServerException, match="This protocol is restricted"):
        client.unload_model("postprocessing")
    with pytest.raises(InferenceServerException, match="This protocol is restricted"):
        client.get_model_repository_index(headers={GRPC_ADMIN_HEADER: "wrong-key"})
    index = client.get_model_repository_index(headers={GRPC_ADMIN_HEADER: ADMIN_KEY}, as_json=True)
    assert {m["name"] for m in index["models"]} >= {"ensemble", "tensorrt_llm"}
    assert requests.post(f"{http}/load", headers={ADMIN_HEADER: ADMIN_KEY}, timeout=120).status_code == 200
    assert client.is_model_ready("postprocessing")
    assert generate(tserver.grpc_url, "def ", 2, tenant="other").ok  # still serving


def test_locust_run_refuses_only_the_over_limit_tenant(tserver, tmp_path):
    """perf/locust/tenants_locustfile.py, headless and bounded (4 users, 12 s), against this server."""
    locustfile = Path(__file__).resolve().parents[2] / "perf" / "locust" / "tenants_locustfile.py"
    cmd = [sys.executable, "-m", "locust", "-f", str(locustfile), "--headless", "-u", "4", "-r", "4", "-t", "12s",
           "--host", f"http://{tserver.http_url}", "--csv", str(tmp_path / "run"), "--only-summary"]
    env = {**os.environ, "TENANT_OK_KEY": KEYS["locust-ok"], "TENANT_OVER_KEY": KEYS["locust-over"]}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)  # exit 1: failures recorded
    with open(tmp_path / "run_stats.csv") as f:
        rows = {row["Name"]: row for row in csv.DictReader(f)}
    ok, over = rows.get("generate [locust-ok]"), rows.get("generate [locust-over]")
    assert ok and over, (rows.keys(), proc.stderr[-2000:])
    print(f"locust: locust-ok {ok['Request Count']} requests, {ok['Failure Count']} failed; "
          f"locust-over {over['Request Count']} requests, {over['Failure Count']} failed")
    assert int(ok["Request Count"]) >= 5 and int(ok["Failure Count"]) == 0
    assert int(over["Failure Count"]) >= int(over["Request Count"]) // 2 > 0
    with open(tmp_path / "run_failures.csv") as f:
        failures = list(csv.DictReader(f))
    assert failures and all(r["Name"] == "generate [locust-over]" for r in failures), failures
    assert all("refused: requests_per_s" in r["Error"] for r in failures), failures

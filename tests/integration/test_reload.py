"""Loading the ensemble again while its models serve (explicit model control), metrics on.

Triton 2.51 loads a second copy of each composing model and unloads the first; both copies share their Prometheus
metrics (same names and labels), and the first copy's deleting them corrupted the heap: at the stop two model
processes aborted and the stop waited out its 30 s exit timeout (backend/serving/metric_owners.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import pytest
import tritonclient.grpc as grpcclient

from backend.policy.api_keys import key_hash, new_key
from ensembles.canary_render import render_canary
from ensembles.render import RepoSpec, render
from ensembles.server import GRPC_ADMIN_HEADER, ServerOptions, TritonServer
from tests.integration import metrics
from tests.integration.conftest import _free_ports, model_state, stopped_cleanly
from tests.integration.launcher import wait_for
from tests.integration.tenant_client import generate

ADMIN_KEY = "reload-admin-key"
KEY = new_key()
ADMISSIONS = "tritonllm_admission_total"
ROUTED = "tritonllm_router_requests_total"


@dataclass
class Served:
    srv: TritonServer
    canary: bool  # a canary repository: the router between the ensemble and tensorrt_llm


@pytest.fixture(scope="module", params=["plain", "canary"])
def server(request, demo, tmp_path_factory) -> Served:
    root = tmp_path_factory.mktemp(f"reload-{request.param}")
    limits = root / "limits.toml"
    limits.write_text(f'[tenants.acme]\napi_key_sha256 = ["{key_hash(KEY)}"]\n')
    spec = RepoSpec(engine_dir=demo.engine_dir, tokenizer_dir=demo.tokenizer_dir, max_batch_size=4,
                    max_input_len=256, max_seq_len=512, max_num_tokens=512, limits_file=limits,
                    router_instance_count=2)
    # canary: the router publishes its metrics (the engine none there: docs/canary.md), and is loaded again too
    repo = (render_canary if request.param == "canary" else render)(spec, root / "model_repository")
    srv = TritonServer(ServerOptions(repo, *_free_ports(3), model_control_mode="explicit", admin_key=ADMIN_KEY),
                       log_path=root / "tritonserver.log")
    srv.start(ready_timeout_s=300, models=("ensemble", "tensorrt_llm"))
    yield Served(srv, canary=request.param == "canary")
    srv.stop()
    stopped_cleanly(root / "tritonserver.log")  # no model process aborted, every model unloaded in time


def _served(server: Served) -> float:
    """The tenant's admitted requests (the engine's counter), or in a canary repository the router's count."""
    text = metrics.scrape(server.srv.opts.metrics_port)
    if server.canary:
        return metrics.value(text, ROUTED, served_version="1", outcome="ok") or 0.0
    return metrics.value(text, ADMISSIONS, tenant="acme", outcome="admitted") or 0.0


def test_the_ensemble_loads_again_twice_and_its_metrics_go_on(server):
    client = grpcclient.InferenceServerClient(server.srv.grpc_url)
    for reload in range(3):
        served = _served(server)
        assert generate(server.srv.grpc_url, "def ", 4, api_key=KEY, stream=True).ok
        # published within a step or two; a reloaded copy goes on counting (the metric is shared)
        assert wait_for(lambda: _served(server) >= served + 1, timeout_s=10), (reload, _served(server))
        if reload == 2:
            break
        client.unload_model("ensemble", headers={GRPC_ADMIN_HEADER: ADMIN_KEY})
        unloaded = wait_for(lambda: model_state(client, "ensemble", ADMIN_KEY) == "UNAVAILABLE", timeout_s=20)
        assert unloaded, model_state(client, "ensemble", ADMIN_KEY)
        client.load_model("ensemble", headers={GRPC_ADMIN_HEADER: ADMIN_KEY})  # a new copy of every composing model
        assert client.is_model_ready("ensemble") and client.is_model_ready("tensorrt_llm")

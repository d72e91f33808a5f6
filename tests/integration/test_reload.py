"""Loading the ensemble again while its models serve (explicit model control), metrics on.

Triton 2.51 loads a second copy of each composing model and unloads the first; both copies share their Prometheus
metrics (same names and labels), and the first copy's deleting them corrupted the heap: at the stop two model
processes aborted and the stop waited out its 30 s exit timeout (backend/serving/metric_owners.py).
"""
from __future__ import annotations

import pytest
import tritonclient.grpc as grpcclient

from backend.policy.api_keys import key_hash, new_key
from ensembles.render import RepoSpec, render
from ensembles.server import GRPC_ADMIN_HEADER, ServerOptions, TritonServer
from tests.integration import metrics
from tests.integration.conftest import _free_ports, stopped_cleanly
from tests.integration.launcher import wait_for
from tests.integration.tenant_client import generate

ADMIN_KEY = "reload-admin-key"
KEY = new_key()
ADMISSIONS = "tritonllm_admission_total"


@pytest.fixture(scope="module")
def server(demo, tmp_path_factory) -> TritonServer:
    root = tmp_path_factory.mktemp("reload")
    limits = root / "limits.toml"
    limits.write_text(f'[tenants.acme]\napi_key_sha256 = ["{key_hash(KEY)}"]\n')
    spec = RepoSpec(engine_dir=demo.engine_dir, tokenizer_dir=demo.tokenizer_dir, max_batch_size=4,
                    max_input_len=256, max_seq_len=512, max_num_tokens=512, limits_file=limits)
    srv = TritonServer(ServerOptions(render(spec, root / "model_repository"), *_free_ports(3),
                                     model_control_mode="explicit", admin_key=ADMIN_KEY),
                       log_path=root / "tritonserver.log")
    srv.start(ready_timeout_s=300, models=("ensemble", "tensorrt_llm"))
    yield srv
    srv.stop()
    stopped_cleanly(root / "tritonserver.log")  # no model process aborted, every model unloaded in time


def _state(client) -> str:
    index = client.get_model_repository_index(headers={GRPC_ADMIN_HEADER: ADMIN_KEY}, as_json=True)
    return next((m.get("state", "") for m in index["models"] if m["name"] == "ensemble"), "")


def _admitted(port: int) -> float:
    return metrics.value(metrics.scrape(port), ADMISSIONS, tenant="acme", outcome="admitted") or 0.0


def test_the_ensemble_loads_again_twice_and_its_metrics_go_on(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    port = server.opts.metrics_port
    for reload in range(3):
        admitted = _admitted(port)
        assert generate(server.grpc_url, "def ", 4, api_key=KEY, stream=True).ok
        # published by the engine thread within a step or two; a reloaded copy goes on counting (shared metric)
        assert wait_for(lambda: _admitted(port) >= admitted + 1, timeout_s=10), (reload, _admitted(port))
        if reload == 2:
            break
        client.unload_model("ensemble", headers={GRPC_ADMIN_HEADER: ADMIN_KEY})
        assert wait_for(lambda: _state(client) == "UNAVAILABLE", timeout_s=20), _state(client)
        client.load_model("ensemble", headers={GRPC_ADMIN_HEADER: ADMIN_KEY})  # a new copy of every composing model
        assert client.is_model_ready("ensemble") and client.is_model_ready("tensorrt_llm")

"""One real serving stack per test session (tritonserver + the front: KServe v2 HTTP proxy and OpenAI API, as
`make serve` runs them), serving the demo model's ensemble; HF transformers as the oracle."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from ensembles import artifacts
from ensembles.render import RepoSpec, render
from ensembles.server import GRPC_ADMIN_HEADER, ServerOptions, TritonServer
from ensembles.server import free_ports as _free_ports  # noqa: F401 (other test modules import it from here)
from ensembles.stack import FrontOptions, ServingStack

# Limits the server is rendered with; tests check the errors at these limits.
MAX_INPUT_LEN = 512
MAX_SEQ_LEN = 1024
ALL_MODELS = ("ensemble", "tensorrt_llm", "preprocessing", "postprocessing", "tensorrt_llm_bls")


def stopped_cleanly(log_path: Path) -> str:
    """The server's log after its stop(), checked: no model process crashed or aborted, and every model unloaded in
    time (a request left in flight, say, makes the stop wait out Triton's 30 s exit timeout)."""
    log = Path(log_path).read_text(errors="replace")
    for sign in ("Segmentation fault", "Traceback", "Signal (6)", "Exit timeout expired"):
        assert sign not in log, (sign, log[-4000:])
    return log


def model_state(client, model: str, admin_key: str) -> str:
    """`model`'s state in the repository index (READY, UNLOADING, UNAVAILABLE...; "" when absent), asked over a
    tritonclient gRPC client with the server's admin key."""
    index = client.get_model_repository_index(headers={GRPC_ADMIN_HEADER: admin_key}, as_json=True)
    return next((m.get("state", "") for m in index["models"] if m["name"] == model), "")


def pytest_collection_modifyitems(items):
    for item in items:
        if "integration" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def demo() -> artifacts.ModelArtifacts:
    """The trained demo model; TRITONLLM_TEST_HF=<HF checkpoint dir> serves another one (e.g. a quick tiny one)."""
    override = os.environ.get("TRITONLLM_TEST_HF")
    return artifacts.from_hf(Path(override)) if override else artifacts.demo()


@pytest.fixture(scope="session")
def hf(demo):
    """(model, tokenizer) of the same checkpoint, float32: the correctness oracle."""
    tok = AutoTokenizer.from_pretrained(str(demo.tokenizer_dir))
    model = AutoModelForCausalLM.from_pretrained(str(demo.tokenizer_dir), dtype=torch.float32).eval()
    return model, tok


@pytest.fixture(scope="session")
def server(demo, tmp_path_factory) -> ServingStack:
    """`http_url` is the front's public HTTP (Triton's own HTTP listens on loopback behind it), `grpc_url` Triton's
    gRPC, `openai_url` the OpenAI API's base URL (http://host:port/v1)."""
    root = tmp_path_factory.mktemp("triton")
    spec = RepoSpec(engine_dir=demo.engine_dir, tokenizer_dir=demo.tokenizer_dir, max_batch_size=24,
                    max_input_len=MAX_INPUT_LEN, max_seq_len=MAX_SEQ_LEN, max_num_tokens=1024,
                    cancellation_check_period_ms=20)
    repo = render(spec, root / "model_repository")
    http, grpc, metrics, front_http, openai = _free_ports(5)
    front = FrontOptions(http_port=front_http, openai_port=openai, tokenizer_dir=demo.tokenizer_dir)
    srv = ServingStack(ServerOptions(repo, http, grpc, metrics), front, log_dir=root)
    srv.start(ready_timeout_s=300, models=ALL_MODELS)
    yield srv
    srv.stop()
    log = Path(root / "tritonserver.log").read_text(errors="replace")
    assert "Segmentation fault" not in log and "Traceback" not in log, log[-4000:]
    front_log = Path(root / "front.log").read_text(errors="replace")
    assert "Traceback" not in front_log, front_log[-4000:]


@pytest.fixture(scope="session")
def unary_server(demo, tmp_path_factory) -> TritonServer:
    """The same repository rendered with decoupled_mode false: KServe unary inference (one response per request)."""
    root = tmp_path_factory.mktemp("triton-unary")
    spec = RepoSpec(engine_dir=demo.engine_dir, tokenizer_dir=demo.tokenizer_dir, max_batch_size=24,
                    max_input_len=MAX_INPUT_LEN, max_seq_len=MAX_SEQ_LEN, max_num_tokens=1024,
                    cancellation_check_period_ms=20, decoupled_mode=False)
    http, grpc, metrics = _free_ports(3)
    srv = TritonServer(ServerOptions(render(spec, root / "model_repository"), http, grpc, metrics),
                       log_path=root / "tritonserver.log")
    srv.start(ready_timeout_s=300, models=ALL_MODELS)
    yield srv
    srv.stop()
    log = Path(root / "tritonserver.log").read_text(errors="replace")
    assert "Segmentation fault" not in log and "Traceback" not in log, log[-4000:]

"""A repository rendered with decoupled_mode false (one response per request): metrics, prefix caching,
cancellation of a direct request, and canary routing work as in the decoupled one."""
from __future__ import annotations

import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from ensembles.canary_render import render_canary
from ensembles.render import RepoSpec
from ensembles.server import ServerOptions, TritonServer
from tests.integration import anchor_calls as anchor
from tests.integration import metrics
from tests.integration.conftest import _free_ports
from tests.integration.oracle import hf_greedy, hf_text

BLOCKS = "nv_trt_llm_kv_cache_block_metrics"
LONG = "import os\nimport sys\n\n\ndef walk(top, topdown=True, onerror=None, followlinks=False):\n" * 3


def test_metrics_and_prefix_cache(unary_server, hf):
    body = {"text_input": np.array([[LONG]], dtype=object), "max_tokens": np.array([[8]], dtype=np.int32),
            "return_perf_metrics": np.array([[True]])}
    first = anchor.infer(unary_server.http_url, "ensemble", body)
    second = anchor.infer(unary_server.http_url, "ensemble", body)
    assert anchor.text_of(first) == anchor.text_of(second) == hf_text(hf, LONG, 8)
    assert int(second.as_numpy("kv_cache_reused_blocks")[0][0]) > 0  # the prompt's full blocks came from the cache
    text = metrics.scrape(unary_server.opts.metrics_port)
    assert metrics.value(text, "nv_llm_output_token_len_count", model="tensorrt_llm") >= 2
    assert metrics.value(text, "nv_trt_llm_general_metrics", general_type="iteration_counter") > 0


def test_a_cancelled_direct_request_frees_its_blocks(unary_server, hf):
    """gRPC ModelInfer cancelled by its client (client timeout) mid-generation: the engine drops the request."""
    port = unary_server.opts.metrics_port
    idle = metrics.value(metrics.scrape(port), BLOCKS, kv_cache_block_type="max")
    tokens_before = metrics.value(metrics.scrape(port), "nv_llm_output_token_len_sum", model="tensorrt_llm") or 0.0
    prompt_ids, _ = hf_greedy(hf, "def ", 1)
    inputs = anchor.direct_inputs(prompt_ids, 900, False, 2**20 % 8192, 0)  # an end_id greedy decoding never meets
    client = grpcclient.InferenceServerClient(unary_server.grpc_url)
    start = time.monotonic()
    with pytest.raises(Exception, match="Deadline Exceeded|DEADLINE_EXCEEDED"):
        # 1 s: the demo model's 900 tokens take ~3 s here, and faster engines made a 3 s deadline race the request
        client.infer("tensorrt_llm", [anchor.tensor(grpcclient, k, v) for k, v in inputs.items()], client_timeout=1)
    client.close()
    assert metrics.wait_for(port, "nv_trt_llm_request_metrics", 0.0, timeout_s=60, request_type="active") == 0.0
    assert metrics.wait_for(port, BLOCKS, idle, kv_cache_block_type="free") == idle
    # It ended early: far fewer than its 900 tokens (the histogram's sum counts each finished request's tokens).
    assert time.monotonic() - start < 60
    total = metrics.wait_until(port, "nv_llm_output_token_len_sum", lambda v: v > tokens_before, 30,
                               model="tensorrt_llm")
    assert total is not None and 0 < total - tokens_before < 900, (tokens_before, total)


@pytest.fixture(scope="module")
def unary_canary(demo, tmp_path_factory):
    root = tmp_path_factory.mktemp("canary-unary")
    spec = RepoSpec(engine_dir=demo.engine_dir, tokenizer_dir=demo.tokenizer_dir, max_batch_size=8,
                    max_input_len=256, max_seq_len=512, max_num_tokens=512, decoupled_mode=False,
                    router_instance_count=2)  # one request at a time; each instance adds ~1.2 s to the stop
    srv = TritonServer(ServerOptions(render_canary(spec, root / "repo"), *_free_ports(3),
                                     model_control_mode="explicit"), log_path=root / "tritonserver.log")
    srv.start(ready_timeout_s=300, models=("ensemble", "router", "tensorrt_llm", "tensorrt_llm_bls"))
    yield srv
    srv.stop()


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_canary_router_serves_unary_requests(unary_canary, hf, model):
    inputs = {"text_input": np.array([["def "]], dtype=object), "max_tokens": np.array([[12]], dtype=np.int32),
              "num_return_sequences": np.array([[2]], dtype=np.int32)}
    result = anchor.infer(unary_canary.http_url, model, inputs)
    assert [t.decode() for t in result.as_numpy("text_output")] == [hf_text(hf, "def ", 12)] * 2

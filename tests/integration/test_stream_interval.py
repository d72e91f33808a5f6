"""stream_interval (vLLM's --stream-interval) through the real tritonserver: with 4, a streamed row's first token
goes out alone and every later response but the last holds at least 4 tokens, on tensorrt_llm directly, through the
ensemble and through tensorrt_llm_bls; the tokens and text are HF greedy's all the same."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from client import GenerationRequest, GrpcLLMClient
from ensembles.render import RepoSpec, render
from ensembles.server import ServerOptions, TritonServer
from tests.integration.conftest import _free_ports
from tests.integration.oracle import hf_greedy, hf_text
from tests.integration.trtllm_direct import generate_ids

INTERVAL = 4
PROMPT, MAX_TOKENS = "class Stack(object):\n    def ", 33


@pytest.fixture(scope="module")
def interval_server(demo, tmp_path_factory):
    root = tmp_path_factory.mktemp("stream-interval")
    spec = RepoSpec(engine_dir=demo.engine_dir, tokenizer_dir=demo.tokenizer_dir, max_batch_size=8,
                    max_input_len=256, max_seq_len=512, max_num_tokens=256, stream_interval=INTERVAL,
                    bls_instance_count=1)
    http, grpc, metrics = _free_ports(3)
    srv = TritonServer(ServerOptions(render(spec, root / "model_repository"), http, grpc, metrics),
                       log_path=root / "tritonserver.log")
    srv.start(ready_timeout_s=300,
              models=("ensemble", "tensorrt_llm", "preprocessing", "postprocessing", "tensorrt_llm_bls"))
    yield srv
    srv.stop()
    log = Path(root / "tritonserver.log").read_text(errors="replace")
    assert "Segmentation fault" not in log and "Traceback" not in log, log[-4000:]


def test_direct_streams_send_the_first_token_alone_then_at_least_interval_tokens(interval_server, hf):
    prompt_ids, expected = hf_greedy(hf, PROMPT, MAX_TOKENS)
    assert len(expected) > 2 * INTERVAL, "the oracle stopped early: pick a prompt that generates longer"
    chunks = [c for c in generate_ids(interval_server.grpc_url, prompt_ids, MAX_TOKENS, True,
                                      end_id=hf[1].eos_token_id) if c]
    assert [t for c in chunks for t in c] == expected
    assert len(chunks[0]) == 1  # the first token is not held: time to first token is unchanged
    assert all(len(c) >= INTERVAL for c in chunks[1:-1]), [len(c) for c in chunks]
    assert len(chunks) <= 1 + math.ceil((len(expected) - 1) / INTERVAL)


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_streamed_text_is_whole_and_comes_in_fewer_responses(interval_server, hf, model):
    expected = hf_text(hf, PROMPT, MAX_TOKENS)
    n_tokens = len(hf_greedy(hf, PROMPT, MAX_TOKENS)[1])
    req = GenerationRequest(prompt=PROMPT, max_tokens=MAX_TOKENS, stream=True, return_num_output_tokens=True)
    chunks = list(GrpcLLMClient(interval_server.grpc_url, model=model).generate(req))
    assert "".join(c.text for c in chunks) == expected
    counted = [c.num_output_tokens for c in chunks if c.num_output_tokens]
    assert sum(counted) == n_tokens and counted[0] == 1, counted
    assert all(n >= INTERVAL for n in counted[1:-1]), counted

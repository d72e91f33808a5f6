"""Clients written for tensorrtllm_backend's inflight_batcher_llm work unchanged (issue 13): the calls its
end_to_end_grpc_client.py, inflight_batcher_llm_client.py and L0 end_to_end_test.py make (tests/integration/
anchor_calls.py), with their default inputs, read the way they read responses, against a decoupled repository and
one rendered with decoupled_mode false. Greedy text is identical on every path and equal to HF transformers."""
from __future__ import annotations

import json
import threading

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient

from tests.integration import anchor_calls as anchor
from tests.integration import metrics
from tests.integration.oracle import hf_greedy, hf_text

# Prompts in the L0 data set's form (text + " " + instruction); output length int(words * 1.3) as the L0 test.
_ARTICLES = [
    "The city council approved a new budget on Tuesday that adds two bus lines and repairs the old bridge.",
    "Scientists said the comet would pass close to the Earth next month, visible before dawn in the south.",
]
PROMPTS = [f"{text} Summarize the following news article:" for text in _ARTICLES]
OUTPUT_LENS = [int(len(text.split()) * 1.3) for text in _ARTICLES]


@pytest.fixture(params=["decoupled", "unary"])
def srv(request):
    return request.getfixturevalue("server" if request.param == "decoupled" else "unary_server")


def _decoupled(srv) -> bool:
    return requests.get(f"http://{srv.http_url}/v2/models/tensorrt_llm/config", timeout=10).json()[
        "model_transaction_policy"]["decoupled"]


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
@pytest.mark.parametrize("streaming", [False, True])
def test_end_to_end_grpc_client(srv, hf, model, streaming):
    """end_to_end_grpc_client.py: the gRPC stream in both modes (streaming only where decoupled); text read as
    text_output[0].decode(), appended when streaming; every perf output read as [0][0] in every response."""
    if streaming and not _decoupled(srv):
        pytest.skip("streaming needs the decoupled repository (refused there: test_streaming_on_unary_is_invalid_arg)")
    prompt, n = PROMPTS[0], OUTPUT_LENS[0]
    inputs = anchor.e2e_inputs(prompt, n, streaming, return_perf_metrics=np.array([[True]]))
    results = anchor.grpc_stream(srv.grpc_url, model, inputs, outputs=["text_output", *anchor.PERF_OUTPUTS])
    texts = [anchor.text_of(r) for r in results]
    for r in results:
        assert r.as_numpy("text_output").shape == (1,)
        perf = {name: r.as_numpy(name)[0][0] for name in anchor.PERF_OUTPUTS}
        assert perf["arrival_time_ns"] > 0 and perf["first_scheduled_time_ns"] > 0 and perf["first_token_time_ns"] > 0
        assert perf["acceptance_rate"] == 0.0 and perf["total_draft_tokens"] == 0
    expected = hf_text(hf, prompt, n)
    # As the anchor: exclude_input_in_output false puts the prompt before a non-streamed output only.
    assert "".join(texts) == (expected if streaming else prompt + expected)
    if streaming:
        assert len(results) > 1


@pytest.mark.parametrize("streaming", [False, True])
def test_inflight_batcher_llm_client(srv, hf, streaming):
    """inflight_batcher_llm_client.py against tensorrt_llm: runtime_top_k 1 / runtime_top_p 0.0; unary
    async_infer with the Streaming request parameter when not streaming, the gRPC stream when streaming."""
    decoupled = _decoupled(srv)
    if streaming != decoupled:
        pytest.skip("the client streams against the decoupled model and infers unary against the other")
    tok = hf[1]
    prompt_ids, expected = hf_greedy(hf, PROMPTS[1], 16)
    inputs = anchor.direct_inputs(prompt_ids, 16, streaming, tok.eos_token_id, tok.eos_token_id)
    if streaming:
        results = anchor.grpc_stream(srv.grpc_url, "tensorrt_llm", inputs)
        tokens = list(prompt_ids)  # the client starts from the prompt and appends output_ids[0][0] of each response
        for r in results:
            tokens.extend(r.as_numpy("output_ids")[0][0][: r.as_numpy("sequence_length")[0][0]].tolist())
        assert tokens == prompt_ids + expected
    else:
        result = anchor.infer(srv.grpc_url, "tensorrt_llm", inputs, protocol="grpc", parameters={"Streaming": False})
        tokens = result.as_numpy("output_ids")[0][0][: result.as_numpy("sequence_length")[0][0]].tolist()
        # The instance parameter exclude_input_in_output is true here, as the anchor's L0 renders it.
        assert tokens == expected


@pytest.mark.parametrize("i", range(len(PROMPTS)))
def test_l0_hand_made_chain_equals_ensemble_and_bls(unary_server, hf, i):
    """end_to_end_test.py (run by the anchor's L0 against decoupled_mode false): preprocessing -> tensorrt_llm
    (with preprocessing's DECODER_INPUT_ID) -> postprocessing, unary over HTTP, equals the ensemble and the BLS."""
    url = unary_server.http_url
    output, pre = anchor.chain(url, PROMPTS[i], OUTPUT_LENS[i])
    assert pre["DECODER_INPUT_ID"].shape == (1, 0)  # a decoder-only model has no decoder input
    ensemble = anchor.l0_ensemble(url, "ensemble", PROMPTS[i], OUTPUT_LENS[i])
    bls = anchor.l0_ensemble(url, "tensorrt_llm_bls", PROMPTS[i], OUTPUT_LENS[i])
    assert output.shape == ensemble.shape == bls.shape == (1,)
    assert output == ensemble and output == bls
    assert output[0].decode() == hf_text(hf, PROMPTS[i], OUTPUT_LENS[i])  # tensorrt_llm excludes the input by default


def test_hand_made_chain_over_the_grpc_stream(server, hf):
    """The same chain against the decoupled repository: tensorrt_llm over the gRPC stream."""
    url = server.grpc_url
    pre = anchor.infer(url, "preprocessing", {"QUERY": np.array([[PROMPTS[0]]], dtype=object),
                                              "REQUEST_OUTPUT_LEN": np.array([[12]], dtype=np.int32)}, protocol="grpc")
    (llm,) = anchor.grpc_stream(url, "tensorrt_llm", {
        "input_ids": pre.as_numpy("INPUT_ID"), "decoder_input_ids": pre.as_numpy("DECODER_INPUT_ID"),
        "input_lengths": pre.as_numpy("REQUEST_INPUT_LEN"), "request_output_len": pre.as_numpy("REQUEST_OUTPUT_LEN"),
        "end_id": pre.as_numpy("OUT_END_ID"), "pad_id": pre.as_numpy("OUT_PAD_ID")})
    post = anchor.infer(url, "postprocessing", {"TOKENS_BATCH": llm.as_numpy("output_ids"),
                                                "SEQUENCE_LENGTH": llm.as_numpy("sequence_length")}, protocol="grpc")
    assert post.as_numpy("OUTPUT").shape == (1,)
    assert post.as_numpy("OUTPUT")[0].decode() == hf_text(hf, PROMPTS[0], 12)


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_http_infer_generate_and_generate_stream(srv, hf, model):
    expected = hf_text(hf, PROMPTS[1], 20)
    body = {"text_input": PROMPTS[1], "max_tokens": 20}
    gen = requests.post(f"http://{srv.http_url}/v2/models/{model}/generate", json=body, timeout=120)
    assert gen.status_code == 200 and gen.json()["text_output"] == expected, gen.text
    if _decoupled(srv):
        body["stream"] = True
        sse = requests.post(f"http://{srv.http_url}/v2/models/{model}/generate_stream", json=body, timeout=120)
        chunks = [json.loads(line[5:]) for line in sse.text.splitlines() if line.startswith("data:")]
        assert len(chunks) > 1 and "".join(c["text_output"] for c in chunks if "text_output" in c) == expected
    else:
        for protocol, url in (("http", srv.http_url), ("grpc", srv.grpc_url)):
            result = anchor.infer(url, model, {"text_input": np.array([[PROMPTS[1]]], dtype=object),
                                               "max_tokens": np.array([[20]], dtype=np.int32)}, protocol=protocol)
            assert result.as_numpy("text_output").shape == (1,) and anchor.text_of(result) == expected


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_several_returned_sequences(srv, hf, model):
    """num_return_sequences 3: decoupled, three responses with sequence_index; unary, one response whose
    text_output holds the three ([3]); greedy, all three equal HF."""
    expected = hf_text(hf, PROMPTS[0], 10)
    inputs = {"text_input": np.array([[PROMPTS[0]]], dtype=object), "max_tokens": np.array([[10]], dtype=np.int32),
              "num_return_sequences": np.array([[3]], dtype=np.int32)}
    if _decoupled(srv):
        results = anchor.grpc_stream(srv.grpc_url, model, inputs)
        assert sorted(anchor.index_of(r, "sequence_index") for r in results) == [0, 1, 2]
        assert [anchor.text_of(r) for r in results] == [expected] * 3
    else:
        result = anchor.infer(srv.http_url, model, inputs)
        assert [t.decode() for t in result.as_numpy("text_output")] == [expected] * 3
        assert result.as_numpy("sequence_index") is None


def test_streaming_on_unary_is_invalid_arg(unary_server):
    inputs = anchor.e2e_inputs(PROMPTS[0], 8, streaming=True)
    for model in ("ensemble", "tensorrt_llm_bls"):
        resp = requests.post(f"http://{unary_server.http_url}/v2/models/{model}/generate",
                             json={"text_input": PROMPTS[0], "max_tokens": 8, "stream": True}, timeout=60)
        assert resp.status_code == 400 and "streaming needs the decoupled model" in resp.json()["error"], resp.text
    with pytest.raises(Exception, match="streaming needs the decoupled model"):
        anchor.grpc_stream(unary_server.grpc_url, "ensemble", inputs)


def test_streamed_token_counts_are_per_response(server, hf):
    """return_num_output_tokens: each streamed response counts its own tokens (they sum to the total), as the
    anchor (TensorRT-LLM PR 5445) and vllm_backend; a non-streamed response counts them all."""
    prompt_ids, expected = hf_greedy(hf, PROMPTS[0], 16)
    flags = {"return_num_output_tokens": np.array([[True]]), "return_num_input_tokens": np.array([[True]]),
             "exclude_input_in_output": np.array([[True]])}
    streamed = anchor.grpc_stream(server.grpc_url, "ensemble", anchor.e2e_inputs(PROMPTS[0], 16, True, **flags))
    counts = [int(r.as_numpy("num_output_tokens")[0][0]) for r in streamed]
    ids = [[t for t in r.as_numpy("output_token_ids")[0].tolist() if t >= 0] for r in streamed]
    assert sum(counts) == len(expected) and counts == [len(i) for i in ids] and counts[0] == 1  # first alone
    assert {int(r.as_numpy("num_input_tokens")[0][0]) for r in streamed} == {len(prompt_ids)}
    (whole,) = anchor.grpc_stream(server.grpc_url, "ensemble", anchor.e2e_inputs(PROMPTS[0], 16, False, **flags))
    assert int(whole.as_numpy("num_output_tokens")[0][0]) == len(expected)


def test_min_length_is_min_tokens(srv, hf):
    """genai-perf 0.0.16's --output-tokens-mean-deterministic sends min_length (min_tokens' old name)."""
    _, plain = hf_greedy(hf, "def ", 24)
    end_id = plain[2]  # greedy would stop at its third token with this end_id
    body = {"text_input": "def ", "max_tokens": 12, "end_id": end_id, "min_length": 12,
            "return_num_output_tokens": True, "exclude_input_in_output": True}
    resp = requests.post(f"http://{srv.http_url}/v2/models/ensemble/generate", json=body, timeout=60)
    assert resp.status_code == 200, resp.text
    assert resp.json()["num_output_tokens"] == 12
    body["min_tokens"] = 5
    resp = requests.post(f"http://{srv.http_url}/v2/models/ensemble/generate", json=body, timeout=60)
    assert resp.status_code == 400 and "min_length" in resp.json()["error"]


@pytest.mark.parametrize("name, value", [("decoder_text_input", "x"), ("prompt_vocab_size", 4),
                                         ("prompt_table_extra_id", 1)])
def test_declared_inputs_not_implemented_are_refused_naming_them(srv, name, value):
    resp = requests.post(f"http://{srv.http_url}/v2/models/ensemble/generate",
                         json={"text_input": "def ", "max_tokens": 4, name: value}, timeout=60)
    assert resp.status_code == 400 and name in resp.json()["error"], resp.text


def test_top_p_zero_and_top_k_zero_mean_filter_off(srv, hf):
    """In TensorRT-LLM a zero top_k or top_p turns that filter off: with both zero, decoding is greedy."""
    body = {"text_input": "import os\n", "max_tokens": 16, "top_k": 0, "top_p": 0.0}
    resp = requests.post(f"http://{srv.http_url}/v2/models/ensemble/generate", json=body, timeout=60)
    assert resp.status_code == 200 and resp.json()["text_output"] == hf_text(hf, "import os\n", 16), resp.text


def test_a_cancelled_bls_stream_stops_its_engine_request(server):
    """The BLS model stops tensorrt_llm's request (by its request_key) when its client cancels."""
    port = server.opts.metrics_port
    blocks = "nv_trt_llm_kv_cache_block_metrics"
    idle = metrics.value(metrics.scrape(port), blocks, kv_cache_block_type="max")
    assert metrics.wait_for(port, blocks, idle, kv_cache_block_type="free") == idle
    tokens_before = metrics.value(metrics.scrape(port), "nv_llm_output_token_len_sum", model="tensorrt_llm")
    got = threading.Semaphore(0)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: got.release())
    inputs = anchor.e2e_inputs("def cancelled(x):\n", 900, True, end_id=np.array([[8191]], dtype=np.int32))
    client.async_stream_infer("tensorrt_llm_bls", [anchor.tensor(grpcclient, k, v) for k, v in inputs.items()])
    try:
        for _ in range(5):  # tokens are streaming
            assert got.acquire(timeout=120)
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()
    assert metrics.wait_for(port, "nv_trt_llm_request_metrics", 0.0, timeout_s=60, request_type="active") == 0.0
    assert metrics.wait_for(port, blocks, idle, kv_cache_block_type="free") == idle
    # It ended early: the tokens it generated (counted when it finished, published a moment after the request left
    # the engine: waited for; read once, it was the old sum in one CI run) are far fewer than its 900.
    total = metrics.wait_until(port, "nv_llm_output_token_len_sum", lambda v: v >= tokens_before + 5, 30,
                               model="tensorrt_llm")
    assert total is not None and 5 <= total - tokens_before < 900, (tokens_before, total)


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("streaming", [False, True])
def test_output_shapes_are_the_anchors(srv, n, streaming):
    """Every numeric output has the batch dim first ([1, 1] scalars, [1, beams] / [1, beams, T] per sequence);
    text_output is 1-D; sequence_index only with several sequences (decoupled), batch_index never for one row."""
    decoupled = _decoupled(srv)
    if streaming and not decoupled:
        pytest.skip("streaming needs the decoupled repository")
    flags = {name: np.array([[True]]) for name in ("return_log_probs", "return_perf_metrics",
                                                   "return_num_input_tokens", "return_num_output_tokens")}
    inputs = anchor.e2e_inputs("def ", 6, streaming, num_return_sequences=np.array([[n]], dtype=np.int32),
                               top_k=np.array([[40]], dtype=np.int32), seed=np.array([[3]], dtype=np.uint64), **flags)
    results = anchor.grpc_stream(srv.grpc_url, "ensemble", inputs)
    beams = n if not decoupled else 1  # unary: the sequences stacked in one response
    for r in results:
        assert r.as_numpy("text_output").shape == (beams,)
        assert r.as_numpy("cum_log_probs").shape == (1, beams)
        assert r.as_numpy("output_log_probs").shape[:2] == (1, beams)
        for name in (*anchor.PERF_OUTPUTS, "num_input_tokens", "num_output_tokens"):
            assert r.as_numpy(name).shape == (1, 1), name
        assert r.as_numpy("batch_index") is None
        assert (r.as_numpy("sequence_index") is not None) == (decoupled and n > 1)
    assert len(results) >= (n if decoupled else 1)

"""The in-flight batcher's capabilities through the real server: prefix caching and perf metrics, cancellation,
stop words, seeded sampling across batch compositions, Prometheus metrics with the anchor's names."""
from __future__ import annotations

import threading
import uuid

import numpy as np
import tritonclient.grpc as grpcclient

from client import GenerationRequest, GrpcLLMClient
from tests.integration import metrics
from tests.integration.oracle import hf_greedy
from tests.integration.test_generation import LONG_PROMPT
from tests.integration.trtllm_direct import stream_infer, tensor

BLOCKS = "nv_trt_llm_kv_cache_block_metrics"


def _ensemble(server, prompt: str, max_tokens: int, **extra) -> dict[str, np.ndarray]:
    inputs = {"text_input": np.array([[prompt.encode()]], dtype=object),
              "max_tokens": np.array([[max_tokens]], dtype=np.int32), **extra}
    (result,) = stream_infer(server.grpc_url, "ensemble", [tensor(k, v) for k, v in inputs.items()])
    return {name: result.as_numpy(name) for name in
            ("text_output", "kv_cache_reused_blocks", "kv_cache_alloc_new_blocks", "kv_cache_alloc_total_blocks",
             "arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns")}


def test_repeated_long_prefix_reports_reused_blocks(server):
    prefix = f"# session {uuid.uuid4().hex}\n" + LONG_PROMPT * 2  # unique: nothing cached yet
    perf = np.array([[True]])
    first = _ensemble(server, prefix + "def first(", 4, return_perf_metrics=perf)
    second = _ensemble(server, prefix + "class Second(", 4, return_perf_metrics=perf)
    assert int(first["kv_cache_reused_blocks"][0, 0]) == 0
    reused = int(second["kv_cache_reused_blocks"][0, 0])
    assert reused >= 4, reused  # ~190 shared tokens: at least 4 full blocks of 32
    assert int(second["kv_cache_alloc_total_blocks"][0, 0]) == reused + int(second["kv_cache_alloc_new_blocks"][0, 0])
    times = [int(second[k][0, 0]) for k in ("arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns",
                                            "last_token_time_ns")]
    assert times == sorted(times) and times[0] > 0


def test_metrics_have_the_anchor_names(server):
    list(GrpcLLMClient(server.grpc_url).generate(GenerationRequest(prompt="def ", max_tokens=4)))
    text = metrics.scrape(server.opts.metrics_port)
    for family, key, label in [
        ("nv_trt_llm_request_metrics", "request_type", "active"),
        ("nv_trt_llm_request_metrics", "request_type", "waiting"),
        (BLOCKS, "kv_cache_block_type", "free"),
        (BLOCKS, "kv_cache_block_type", "reused"),
        ("nv_trt_llm_general_metrics", "general_type", "iteration_counter"),
        ("tritonllm_prefix_cache", "prefix_cache_metric", "hit_rate"),
    ]:
        assert metrics.value(text, family, **{key: label}) is not None, (family, label)
    for histogram in ("nv_llm_input_token_len", "nv_llm_output_token_len", "tritonllm_time_to_first_token_seconds",
                      "tritonllm_inter_token_latency_seconds"):
        assert metrics.value(text, histogram + "_count", model="tensorrt_llm") >= 1, histogram
    assert metrics.value(text, "nv_trt_llm_general_metrics", general_type="iteration_counter") > 0


def test_cancelling_50_streams_returns_free_blocks_to_idle(server, hf):
    port = server.opts.metrics_port
    idle = metrics.value(metrics.scrape(port), BLOCKS, kv_cache_block_type="max")
    assert metrics.wait_for(port, BLOCKS, idle, kv_cache_block_type="free") == idle
    got_tokens = threading.Semaphore(0)
    clients = []
    try:
        for i in range(50):  # more than the running batch holds: some are running, the rest queued
            client = grpcclient.InferenceServerClient(server.grpc_url)
            clients.append(client)
            client.start_stream(callback=lambda result, error: got_tokens.release())
            req = GenerationRequest(prompt=f"def cancelled_{i}(x):\n", max_tokens=400, stream=True)
            client.async_stream_infer("ensemble", req.to_infer_inputs())
        for _ in range(40):  # tokens are streaming
            assert got_tokens.acquire(timeout=120)
        assert metrics.wait_until(port, BLOCKS, lambda free: free < idle, kv_cache_block_type="free") < idle
    finally:
        for client in clients:  # every client cancels mid-generation (or while queued)
            client.stop_stream(cancel_requests=True)
            client.close()
    assert metrics.wait_for(port, BLOCKS, idle, kv_cache_block_type="free") == idle
    assert metrics.wait_for(port, "nv_trt_llm_request_metrics", 0.0, request_type="active") == 0.0
    assert metrics.wait_for(port, "nv_trt_llm_request_metrics", 0.0, request_type="waiting") == 0.0
    _, expected = hf_greedy(hf, "def ", 8)  # and the server serves on
    assert "".join(c.text for c in GrpcLLMClient(server.grpc_url).generate(
        GenerationRequest(prompt="def ", max_tokens=8))) == hf[1].decode(expected, skip_special_tokens=True)


def test_output_with_stop_words_ends_before_the_stop_sequence(server, hf):
    tok = hf[1]
    prompt = "import os\n"
    _, ids = hf_greedy(hf, prompt, 40)
    # A generated token whose text tokenizes back to itself alone: the stop word is then exactly that token.
    index = next(i for i in range(3, len(ids)) if tok.encode(tok.decode([ids[i]]), add_special_tokens=False) == [ids[i]])
    word = tok.decode([ids[index]])
    first = ids.index(ids[index])
    expected = tok.decode(ids[:first], skip_special_tokens=True)
    grpc = GrpcLLMClient(server.grpc_url)
    for stream in (False, True):
        req = GenerationRequest(prompt=prompt, max_tokens=40, stream=stream, stop_words=[word])
        assert "".join(c.text for c in grpc.generate(req)) == expected


def test_seeded_sampling_is_reproducible_across_batch_compositions(server):
    req = GenerationRequest(prompt="class ", max_tokens=24, top_k=40, top_p=0.9, temperature=0.8, seed=99)
    alone = "".join(c.text for c in GrpcLLMClient(server.grpc_url).generate(req))
    results: list[str] = []

    def run(r: GenerationRequest) -> None:
        results.append("".join(c.text for c in GrpcLLMClient(server.grpc_url).generate(r)))

    crowd = [GenerationRequest(prompt=f"x{i} = ", max_tokens=16 + i, top_k=40, seed=i) for i in range(8)]
    threads = [threading.Thread(target=run, args=(r,)) for r in crowd + [req]]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert alone in results


def test_num_return_sequences_returns_each_sequence_once(server):
    inputs = {"text_input": np.array([[b"def "]], dtype=object), "max_tokens": np.array([[12]], dtype=np.int32),
              "num_return_sequences": np.array([[3]], dtype=np.int32), "top_k": np.array([[40]], dtype=np.int32),
              "seed": np.array([[5]], dtype=np.uint64)}
    results = stream_infer(server.grpc_url, "ensemble", [tensor(k, v) for k, v in inputs.items()])
    by_index = {int(r.as_numpy("sequence_index")[0, 0]): r.as_numpy("text_output")[0] for r in results
                if r.as_numpy("text_output") is not None}
    assert sorted(by_index) == [0, 1, 2]
    again = stream_infer(server.grpc_url, "ensemble", [tensor(k, v) for k, v in inputs.items()])
    assert {int(r.as_numpy("sequence_index")[0, 0]): r.as_numpy("text_output")[0] for r in again
            if r.as_numpy("text_output") is not None} == by_index  # seeds seed, seed + 1, seed + 2: reproducible
    assert len(set(by_index.values())) > 1  # different seeds, different samples

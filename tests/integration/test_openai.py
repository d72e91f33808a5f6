"""The OpenAI-compatible API with the official openai SDK (sync and async), against the session's serving stack
(the front before the real tritonserver, as `make serve` runs them)."""
from __future__ import annotations

import asyncio
import http.client
import json
import urllib.parse

import openai
import pytest
import requests

from client import GenerationRequest, GrpcLLMClient
from tests.integration import metrics
from tests.integration.oracle import hf_greedy

BLOCKS = "nv_trt_llm_kv_cache_block_metrics"
ITERATIONS = "nv_trt_llm_general_metrics"
PROMPT = "def fibonacci(n):"


@pytest.fixture(scope="module")
def oai(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.openai_url, api_key="unused", max_retries=0, timeout=120)


def _ensemble(server, prompt: str, max_tokens: int, **options) -> tuple[str, int | None, int | None]:
    """The ensemble's own answer over gRPC: (text, num_input_tokens, num_output_tokens)."""
    req = GenerationRequest(prompt, max_tokens, return_num_input_tokens=True, return_num_output_tokens=True,
                            **options)
    (chunk,) = list(GrpcLLMClient(server.grpc_url).generate(req))
    return chunk.text, chunk.num_input_tokens, chunk.num_output_tokens


def test_greedy_completion_equals_the_ensemble_and_usage_is_exact(server, hf, oai):
    text, n_in, n_out = _ensemble(server, PROMPT, 24)
    r = oai.completions.create(model="ensemble", prompt=PROMPT, max_tokens=24, temperature=0)
    prompt_ids, out_ids = hf_greedy(hf, PROMPT, 24)
    assert r.choices[0].text == text == hf[1].decode(out_ids, skip_special_tokens=True)
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (n_in, n_out) == (len(prompt_ids), len(out_ids))
    assert r.usage.total_tokens == n_in + n_out
    assert r.choices[0].finish_reason == "length" and r.object == "text_completion" and r.model == "ensemble"


def test_streamed_completion_concatenates_to_the_non_streamed_text(oai):
    whole = oai.completions.create(model="ensemble", prompt=PROMPT, max_tokens=24, temperature=0)
    stream = oai.completions.create(model="ensemble", prompt=PROMPT, max_tokens=24, temperature=0, stream=True,
                                    stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.model_dump() == whole.usage.model_dump()


def test_echo_prepends_the_prompt(oai):
    r = oai.completions.create(model="ensemble", prompt=PROMPT, max_tokens=6, temperature=0, echo=True)
    plain = oai.completions.create(model="ensemble", prompt=PROMPT, max_tokens=6, temperature=0)
    assert r.choices[0].text == PROMPT + plain.choices[0].text


def test_chat_renders_the_template_sync_and_async_streamed(server, hf, oai):
    messages = [{"role": "system", "content": "answer in code"}, {"role": "user", "content": "sort a list"}]
    rendered = hf[1].apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    text, n_in, n_out = _ensemble(server, rendered, 16)
    r = oai.chat.completions.create(model="ensemble", messages=messages, max_completion_tokens=16, temperature=0)
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content == text
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (n_in, n_out)
    assert n_in == len(hf[1].encode(rendered, add_special_tokens=False))

    async def streamed() -> tuple[str, list]:
        client = openai.AsyncOpenAI(base_url=server.openai_url, api_key="unused", max_retries=0)
        stream = await client.chat.completions.create(model="ensemble", messages=messages, max_tokens=16,
                                                      temperature=0, stream=True,
                                                      stream_options={"include_usage": True})
        chunks = [c async for c in stream]
        await client.close()
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), chunks

    joined, chunks = asyncio.run(streamed())
    assert joined == text
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[-1].usage.completion_tokens == n_out


def test_async_completion_non_streamed(server, oai):
    async def run():
        client = openai.AsyncOpenAI(base_url=server.openai_url, api_key="unused", max_retries=0)
        try:
            return await asyncio.gather(*(client.completions.create(model="ensemble", prompt=PROMPT, max_tokens=12,
                                                                    temperature=0) for _ in range(3)))
        finally:
            await client.close()

    texts = {r.choices[0].text for r in asyncio.run(run())}
    assert texts == {oai.completions.create(model="ensemble", prompt=PROMPT, max_tokens=12, temperature=0)
                     .choices[0].text}


def test_n_sequences_with_a_seed_are_reproducible(oai):
    def run():
        return oai.completions.create(model="ensemble", prompt=PROMPT, max_tokens=12, n=3, temperature=1.0, seed=7)

    first, again = run(), run()
    assert sorted(c.index for c in first.choices) == [0, 1, 2]
    assert [c.text for c in first.choices] == [c.text for c in again.choices]
    assert len({c.text for c in first.choices}) > 1  # seed, seed+1, seed+2: different samples
    assert first.usage.completion_tokens == 36  # every sequence ran to max_tokens
    other = oai.completions.create(model="ensemble", prompt=PROMPT, max_tokens=12, n=3, temperature=1.0, seed=8)
    assert [c.text for c in other.choices] != [c.text for c in first.choices]
    chat = oai.chat.completions.create(model="ensemble", messages=[{"role": "user", "content": "hi"}], n=2,
                                       max_tokens=8, temperature=1.0, seed=3)
    assert sorted(c.index for c in chat.choices) == [0, 1] and chat.usage.completion_tokens == 16


def test_stop_string_ends_the_text_before_it(hf, oai):
    full = oai.completions.create(model="ensemble", prompt="import os\n", max_tokens=40, temperature=0).choices[0].text
    tok = hf[1]
    ids = tok.encode(full, add_special_tokens=False)
    # A token whose text tokenizes back to itself alone, a few tokens in: the stop string is exactly that token.
    index = next(i for i in range(3, len(ids)) if tok.encode(tok.decode([ids[i]]), add_special_tokens=False) == [ids[i]])
    stop = tok.decode([ids[index]])
    r = oai.completions.create(model="ensemble", prompt="import os\n", max_tokens=40, temperature=0, stop=[stop])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == full[: full.index(stop)] and stop not in r.choices[0].text
    streamed = oai.completions.create(model="ensemble", prompt="import os\n", max_tokens=40, temperature=0,
                                      stop=stop, stream=True)
    chunks = list(streamed)
    assert "".join(c.choices[0].text for c in chunks) == r.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_logprobs_and_top_alternatives(oai):
    r = oai.completions.create(model="ensemble", prompt=PROMPT, max_tokens=8, temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == r.usage.completion_tokens == 8
    assert "".join(lp.tokens) == r.choices[0].text and lp.text_offset[0] == 0
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert len(top) == 3 and top[token] == value == max(top.values())  # greedy: the sampled is the top one
    chat = oai.chat.completions.create(model="ensemble", messages=[{"role": "user", "content": "hi"}], max_tokens=6,
                                       temperature=0, logprobs=True, top_logprobs=5)
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens
    for entry in content:
        assert len(entry.top_logprobs) == 5 and entry.top_logprobs[0].logprob == pytest.approx(entry.logprob)
        assert entry.bytes == list(entry.token.encode("utf-8")) and entry.logprob <= 0
    sampled = oai.completions.create(model="ensemble", prompt=PROMPT, max_tokens=8, temperature=1.0, seed=5,
                                     logprobs=0)
    assert all(v <= 0 for v in sampled.choices[0].logprobs.token_logprobs)


def test_bad_parameters_get_400_naming_them(oai):
    cases = [({"temperature": 3}, "temperature"), ({"top_p": 0}, "top_p"), ({"n": 0}, "n"),
             ({"max_tokens": 0}, "max_tokens"), ({"presence_penalty": 9}, "presence_penalty"),
             ({"logprobs": 9}, "logprobs"), ({"extra_body": {"top_k": -5}}, "top_k"),
             ({"extra_body": {"min_tokens": 99}}, "min_tokens"), ({"extra_body": {"colour": 1}}, "colour"),
             ({"extra_body": {"use_beam_search": True}}, "use_beam_search"), ({"stop": [""]}, "stop"),
             ({"n": 2, "temperature": 0}, "n"), ({"max_tokens": "many"}, "max_tokens")]
    for kwargs, param in cases:
        with pytest.raises(openai.BadRequestError) as err:
            oai.completions.create(model="ensemble", prompt=PROMPT, **{"max_tokens": 4, **kwargs})
        assert err.value.status_code == 400 and err.value.param == param, (kwargs, err.value)
    with pytest.raises(openai.BadRequestError) as err:
        oai.chat.completions.create(model="ensemble", messages=[{"role": "user", "content": "x"}], top_logprobs=2)
    assert err.value.param == "top_logprobs"
    with pytest.raises(openai.BadRequestError) as err:
        oai.chat.completions.create(model="ensemble", messages=[{"role": "user", "content": "x"}],
                                    tools=[{"type": "function", "function": {"name": "f"}}])
    assert err.value.param == "tools" and err.value.code == "unsupported_parameter"


def test_engine_limits_come_back_as_400(oai):
    with pytest.raises(openai.BadRequestError, match=r"max_tokens \(100000\) exceeds"):
        oai.completions.create(model="ensemble", prompt=PROMPT, max_tokens=100_000)


def test_unknown_model_is_404_and_bad_json_400(server, oai):
    with pytest.raises(openai.NotFoundError) as err:
        oai.completions.create(model="gpt-9", prompt=PROMPT, max_tokens=4)
    assert err.value.code == "model_not_found" and err.value.param == "model"
    resp = requests.post(f"{server.openai_url}/completions", data=b'{"prompt": "x", ', timeout=30,
                         headers={"Content-Type": "application/json"})
    assert resp.status_code == 400 and "malformed JSON" in resp.json()["error"]["message"]
    nested = b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    resp = requests.post(f"{server.openai_url}/completions", data=nested, timeout=30)
    assert resp.status_code == 400 and "nested" in resp.json()["error"]["message"]


def test_models_health_and_metrics_routes(server, oai):
    assert [m.id for m in oai.models.list()] == ["ensemble"]
    assert oai.models.retrieve("ensemble").owned_by == "tritonllm"
    root = server.openai_url.rsplit("/v1", 1)[0]
    assert requests.get(f"{root}/health", timeout=10).status_code == 200
    text = requests.get(f"{root}/metrics", timeout=10).text
    assert 'tritonllm_openai_requests_total{route="/v1/completions",status="200"}' in text


def test_disconnect_mid_stream_cancels_the_request_and_frees_its_kv_blocks(server, oai):
    port = server.opts.metrics_port
    idle = metrics.value(metrics.scrape(port), BLOCKS, kv_cache_block_type="max")
    assert metrics.wait_for(port, BLOCKS, idle, kv_cache_block_type="free") == idle
    streams = [oai.chat.completions.create(model="ensemble", messages=[{"role": "user", "content": f"task {i}"}],
                                           max_tokens=900, temperature=0, stream=True) for i in range(4)]
    for stream in streams:
        for _, chunk in zip(range(5), stream):  # tokens are flowing
            pass
    assert metrics.wait_until(port, BLOCKS, lambda free: free < idle, kv_cache_block_type="free") < idle
    closed_at = metrics.value(metrics.scrape(port), ITERATIONS, general_type="iteration_counter")
    for stream in streams:
        stream.close()  # the client goes away mid-generation
    assert metrics.wait_for(port, BLOCKS, idle, kv_cache_block_type="free") == idle
    assert metrics.wait_for(port, "nv_trt_llm_request_metrics", 0.0, request_type="active") == 0.0
    # Cancelled, not run to the end: the engine stopped within a few steps of the close, not ~900 steps later.
    steps = metrics.value(metrics.scrape(port), ITERATIONS, general_type="iteration_counter") - closed_at
    assert steps < 300, steps


def test_disconnect_while_waiting_for_a_non_streamed_answer_cancels_it(server):
    port = server.opts.metrics_port
    idle = metrics.value(metrics.scrape(port), BLOCKS, kv_cache_block_type="max")
    assert metrics.wait_for(port, BLOCKS, idle, kv_cache_block_type="free") == idle
    body = {"model": "ensemble", "prompt": "def long_answer(x):\n", "max_tokens": 900, "min_tokens": 900,
            "temperature": 0}
    url = urllib.parse.urlsplit(f"{server.openai_url}/completions")
    client = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    client.request("POST", url.path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    # The client goes away once the answer is being generated, not after a fixed wait that a fast machine outlasts
    # (a 3 s read timeout: 900 tokens took less on a Zen 5 EPYC).
    assert metrics.wait_until(port, "nv_trt_llm_request_metrics", lambda v: v >= 1, request_type="active") == 1
    started_at = metrics.value(metrics.scrape(port), ITERATIONS, general_type="iteration_counter")
    client.close()
    closed_at = metrics.value(metrics.scrape(port), ITERATIONS, general_type="iteration_counter")
    assert closed_at - started_at < 600, "the answer was nearly done before its client went away"
    free = metrics.wait_for(port, BLOCKS, idle, kv_cache_block_type="free")
    # Seen once on the Zen 5 EPYC, not reproduced in 50 runs: 767 of 768 free after 30 s; say what was in flight.
    assert free == idle, [line for line in metrics.scrape(port).splitlines() if "_request_metrics{" in line]
    assert metrics.wait_for(port, "nv_trt_llm_request_metrics", 0.0, request_type="active") == 0.0
    steps = metrics.value(metrics.scrape(port), ITERATIONS, general_type="iteration_counter") - closed_at
    assert steps < 300, steps  # stopped, not generated to its 900 tokens

"""Hostile requests found by probing the served stack (2026-11-26), each sent as a client would, to the real
tritonserver behind the front: every one is refused at once with a message naming the problem, and the server
serves the next request exactly.

Before the fixes: lone-surrogate escapes and a "²" header or timeout got 500s (or a Python traceback with server
paths over gRPC), reserved chat_template_kwargs a 500, a 6 MB list of wrong-typed prompts held the front's event
loop (every stream) for 18 s, 1,000 prompts x n=4 queued 4,000 sequences ahead of everyone, and /generate with
stream true generated every token before answering HTTP 200 with an error."""
from __future__ import annotations

import json
import threading
import time

import openai
import pytest
import requests

from client import GenerationRequest, HttpLLMClient
from tests.integration.conftest import MAX_SEQ_LEN
from tests.integration.oracle import hf_text
from tests.integration.tenant_client import generate


def _still_serves(server, hf) -> None:
    assert HttpLLMClient(server.http_url).generate(GenerationRequest("def ", 8)) == hf_text(hf, "def ", 8)


def _post(url: str, body: bytes, headers: dict | None = None) -> requests.Response:
    return requests.post(url, data=body, headers={"Content-Type": "application/json", **(headers or {})},
                         timeout=120)


@pytest.mark.parametrize("front, path, body", [
    ("kserve", "/v2/models/ensemble/generate", b'{"text_input": "\\ud800x", "max_tokens": 4}'),
    ("kserve", "/v2/models/ensemble/generate_stream", b'{"text_input": "a", "max_tokens": 4, "\\udfff": 1}'),
    ("openai", "/completions", b'{"model": "ensemble", "prompt": "\\ud800", "max_tokens": 4}'),
    ("openai", "/completions", b'{"model": "ensemble", "prompt": "def ", "max_tokens": 4, "stop": "\\udfff"}'),
    ("openai", "/chat/completions", b'{"model": "ensemble", "messages": [{"role": "user", "content": "\\ud800"}]}'),
])
def test_a_lone_surrogate_escape_is_refused_naming_it(server, hf, front, path, body):
    base = f"http://{server.http_url}" if front == "kserve" else server.openai_url
    resp = _post(base + path, body)
    assert resp.status_code == 400, (resp.status_code, resp.text[:300])
    assert "lone surrogate" in resp.text, resp.text[:300]
    _still_serves(server, hf)


def test_a_paired_surrogate_escape_is_a_character(server):
    resp = _post(f"http://{server.http_url}/v2/models/ensemble/generate",
                 b'{"text_input": "\\ud83d\\ude00 def ", "max_tokens": 2}')
    assert resp.status_code == 200, resp.text[:300]


def test_a_non_ascii_digit_in_the_binary_header_is_a_400(server):
    resp = _post(f"http://{server.http_url}/v2/models/ensemble/infer", b'{"inputs": []}',
                 {"Inference-Header-Content-Length": "\u00b2".encode("latin-1").decode("latin-1")})
    assert resp.status_code == 400 and "must be an integer" in resp.text, resp.text[:300]


@pytest.mark.parametrize("how", ["grpc", "http"])
def test_a_non_ascii_digit_timeout_is_invalid_arg_without_a_traceback(server, hf, how):
    if how == "grpc":
        error = generate(server.grpc_url, "def ", 4, parameters={"timeout_ms": "\u00b2"}).error
    else:
        resp = _post(f"http://{server.http_url}/v2/models/ensemble/generate",
                     json.dumps({"text_input": "def ", "max_tokens": 4, "timeout_ms": "\u00b2"}).encode())
        assert resp.status_code == 400
        error = resp.json()["error"]
    assert "timeout_ms must be an integer number of milliseconds" in error, error
    assert "Traceback" not in error and ".py" not in error, error
    _still_serves(server, hf)


@pytest.mark.parametrize("body", [{"stream": True}, {"num_return_sequences": 2, "temperature": 1.0},
                                  {"stream": [[True]]}])
def test_generate_refuses_at_once_what_needs_several_responses(server, body):
    started = time.monotonic()
    resp = _post(f"http://{server.http_url}/v2/models/ensemble/generate",
                 json.dumps({"text_input": "def ", "max_tokens": 1000, **body}).encode())
    assert resp.status_code == 400 and "use /generate_stream" in resp.json()["error"], resp.text[:300]
    assert time.monotonic() - started < 5  # not after generating 1,000 tokens


@pytest.fixture(scope="module")
def oai(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.openai_url, api_key="unused", max_retries=0, timeout=120)


@pytest.mark.parametrize("key", ["tokenize", "messages", "conversation", "chat_template"])
def test_reserved_chat_template_kwargs_are_refused_naming_them(server, hf, oai, key):
    with pytest.raises(openai.BadRequestError, match=f"chat_template_kwargs may not set '{key}'"):
        oai.chat.completions.create(model="ensemble", messages=[{"role": "user", "content": "hi"}], max_tokens=2,
                                    extra_body={"chat_template_kwargs": {key: True}})
    _still_serves(server, hf)


def test_too_many_sequences_in_one_completion_request_are_refused(server, oai):
    with pytest.raises(openai.BadRequestError, match="at most 64 per request"):
        oai.completions.create(model="ensemble", prompt=["def "] * 1000, n=4, temperature=1.0, max_tokens=16)
    got = oai.completions.create(model="ensemble", prompt=["def "] * 16, n=4, temperature=1.0, max_tokens=2)
    assert len(got.choices) == 64


def test_a_huge_list_of_wrong_items_is_refused_without_stalling_other_streams(server, oai):
    """6 MB of integers where prompt strings go: refused before pydantic builds an error per element, while a
    stream in flight keeps receiving tokens."""
    gaps, arrivals, first, done = [], [], threading.Event(), threading.Event()
    long = MAX_SEQ_LEN - 24  # as many tokens as the server holds: the stream must outlast the refused request

    def stream() -> None:
        last = time.monotonic()
        for _ in oai.completions.create(model="ensemble", prompt="def ", max_tokens=long, stream=True,
                                        extra_body={"min_tokens": long}):
            now = time.monotonic()
            gaps.append(now - last)
            arrivals.append(now)
            last = now
            first.set()
        done.set()

    worker = threading.Thread(target=stream)
    worker.start()
    assert first.wait(60)  # the stream is generating (not a fixed wait, which a fast machine's stream outruns)
    started = time.monotonic()
    resp = _post(f"{server.openai_url}/completions",
                 b'{"model": "ensemble", "max_tokens": 4, "prompt": [' + b"0," * 3_000_000 + b'0]}')
    refused_at = time.monotonic()
    worker.join(120)
    assert resp.status_code == 400 and "holds 3000001 items" in resp.text, resp.text[:300]
    assert refused_at - started < 5, refused_at - started
    assert done.is_set() and max(gaps) < 5, max(gaps)
    assert arrivals[-1] > refused_at, "the stream ended before the refused request did: nothing ran beside it"

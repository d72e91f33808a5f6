"""OpenAI request -> engine: defaults (OpenAI samples, the ensemble is greedy unless told), validation naming the
field, unsupported fields refused unless harmless, Triton error texts -> status codes, API keys -> tenants."""
from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from backend.policy.api_keys import Credentials, key_hash
from frontend.openai_api.auth import Authenticator
from frontend.openai_api.errors import OpenAIError, from_triton
from frontend.openai_api.params import GenerationParams, generation_params
from frontend.openai_api.protocol import ChatCompletionRequest, CompletionRequest, refuse_unsupported


def _params(**body) -> GenerationParams:
    req = CompletionRequest.model_validate({"prompt": "x", **body})
    refuse_unsupported(req)
    return generation_params(req, 16 if req.max_tokens is None else req.max_tokens, logprobs=req.logprobs is not None,
                             top_logprobs=req.logprobs or 0)


def test_openai_defaults_sample_and_are_always_sent():
    inputs = _params().inputs("hi", stream=False)
    assert inputs["temperature"].tolist() == [[1.0]] and inputs["top_p"].tolist() == [[1.0]]
    assert inputs["max_tokens"].dtype == np.int32 and inputs["max_tokens"].tolist() == [[16]]
    assert inputs["text_input"].tolist() == [[b"hi"]] and inputs["exclude_input_in_output"].tolist() == [[True]]
    assert "seed" not in inputs and "num_return_sequences" not in inputs and "stop_words" not in inputs


def test_fields_map_to_the_ensemble_inputs():
    p = _params(max_tokens=8, temperature=0, top_k=-1, seed=-1, stop="\n", n=1, logprobs=2,
                repetition_penalty=1.2, ignore_eos=True, presence_penalty=0.5)
    inputs = p.inputs("hi", stream=True)
    assert p.top_k == 0 and p.seed is None and p.min_tokens == 8  # -1 means unset; ignore_eos: exact length
    assert inputs["stop_words"].tolist() == [[b"\n"]] and inputs["num_top_log_probs"].tolist() == [[2]]
    assert inputs["return_log_probs"].tolist() == [[True]] and inputs["stream"].tolist() == [[True]]
    assert inputs["repetition_penalty"].dtype == np.float32 and inputs["presence_penalty"].tolist() == [[0.5]]
    assert "output_token_ids" in p.outputs() and "top_log_probs" in p.outputs()
    seeded = _params(seed=2**64 - 1, n=3, temperature=0.7).inputs("hi", stream=False)
    assert seeded["seed"].dtype == np.uint64 and seeded["num_return_sequences"].tolist() == [[3]]


@pytest.mark.parametrize("body, param, message", [
    ({"temperature": 2.5}, "temperature", "temperature must be in [0, 2]"),
    ({"top_p": 0.0}, "top_p", "top_p must be in (0, 1]"),
    ({"top_k": -2}, "top_k", "top_k must be 0 (disable)"),
    ({"seed": -5}, "seed", "seed must be in"),
    ({"n": 17}, "n", "n must be in [1, 16]"),
    ({"n": 2, "temperature": 0}, "n", "n must be 1 when using greedy sampling"),
    ({"stop": ["a", ""]}, "stop", "stop cannot contain an empty string"),
    ({"stop": [str(i) for i in range(65)]}, "stop", "at most 64"),
    ({"max_tokens": 4, "min_tokens": 5}, "min_tokens", "min_tokens must be in [0, max_tokens=4]"),
    ({"frequency_penalty": -3}, "frequency_penalty", "frequency_penalty must be in [-2, 2]"),
    ({"repetition_penalty": 0}, "repetition_penalty", "greater than zero"),
    ({"max_tokens": 0}, "max_tokens", "max_tokens must be in [1,"),
    ({"logit_bias": {"5": 10}}, "logit_bias", "`logit_bias` is not supported"),
    ({"best_of": 3}, "best_of", "not supported"),
    ({"suffix": "x"}, "suffix", "not supported"),
    ({"colour": "blue"}, "colour", "unknown field `colour`"),
])
def test_bad_values_are_400_naming_the_field(body, param, message):
    with pytest.raises(OpenAIError) as err:
        _params(**body)
    assert err.value.status == 400 and err.value.param == param and message in err.value.message


def test_harmless_values_of_unsupported_fields_pass():
    _params(logit_bias={}, best_of=1, response_format={"type": "text"}, store=False, skip_special_tokens=True)


def test_chat_request_shape():
    req = ChatCompletionRequest.model_validate({"messages": [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]})
    assert req.messages[0].text() == "a\nb" and req.add_generation_prompt
    with pytest.raises(ValidationError):
        ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "x"}}]}]})
    with pytest.raises(ValidationError):
        ChatCompletionRequest.model_validate({"messages": []})
    tools = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "x"}],
                                                  "tools": [{"type": "function"}]})
    with pytest.raises(OpenAIError, match="`tools` is not supported"):
        refuse_unsupported(tools)


@pytest.mark.parametrize("message, status, headers", [
    ("in ensemble 'ensemble', request refused: tenant 'a' is over its rate (limit requests_per_s); "
     "retry_after_ms=1500", 429, {"retry-after-ms": "1500", "Retry-After": "2"}),
    ("request refused: the server's queue is full (limit max_queued_requests); retry_after_ms=250", 503,
     {"retry-after-ms": "250", "Retry-After": "1"}),
    ("Request for unknown model: 'ensemble' is not found", 503, {"Retry-After": "1"}),
    ("request timed out: its deadline (timeout_ms=5) passed; its KV blocks were freed", 504,
     {"x-should-retry": "false"}),
    ("request refused: 900 tokens > token_burst 100 (limit tokens_per_s; too large to ever be admitted)", 400,
     {"x-should-retry": "false"}),
    ("unauthenticated: the API key presented is not valid", 401, {"WWW-Authenticate": "Bearer"}),
    ("max_tokens (9) exceeds max_output_len (8)", 400, {}),
])
def test_triton_messages_map_to_statuses(message, status, headers):
    err = from_triton(message)
    assert err.status == status and err.headers == headers and not err.message.startswith("in ensemble")


def test_api_keys_decide_the_tenant():
    auth = Authenticator(Credentials(tenant_keys={"acme": (key_hash("tllm_a"),), "beta": (key_hash("tllm_b"),)}))
    assert auth.identify("Bearer tllm_a", None) == ("acme", "tllm_a")
    assert auth.identify("bearer tllm_b", "beta") == ("beta", "tllm_b")
    assert auth.upstream_headers("acme", "tllm_a") == {"authorization": "Bearer tllm_a", "x-tenant-id": "acme"}
    for authorization, claim in (("Bearer wrong", None), (None, None), ("Basic tllm_a", None), ("Bearer tllm_a", "beta")):
        with pytest.raises(OpenAIError) as err:
            auth.identify(authorization, claim)
        assert err.value.status == 401 and "tllm_a" not in err.value.message


def test_without_keys_requests_are_anonymous_and_claims_refused():
    auth = Authenticator(None)
    assert auth.identify("Bearer whatever-the-sdk-sends", None) == (None, None)
    assert auth.upstream_headers(None, None) == {}
    with pytest.raises(OpenAIError) as err:
        auth.identify(None, "acme")
    assert err.value.status == 401
    with pytest.raises(OpenAIError) as err:
        auth.identify(None, "../etc")
    assert err.value.status == 400

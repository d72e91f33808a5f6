"""One request never harms another (issue 11 items 2, 3, 4 and the model-side parts of 9), against the real server:
extreme sampling values neither abort the engine loop nor answer wrongly, non-finite values are refused naming the
field, a `stop` can only come from the request's owner, and malformed inputs get a clear INVALID_ARG."""
from __future__ import annotations

import math
import queue
import threading
from functools import partial

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from client import GenerationRequest, GrpcLLMClient
from tests.integration import anchor_calls as anchor
from tests.integration.oracle import hf_greedy, hf_text
from tests.integration.trtllm_direct import stream_infer, tensor

VICTIM = ("def walk(top, topdown=True):\n    ", 32)


def _victim(server, hf, done: threading.Event, result: dict) -> threading.Thread:
    def run() -> None:
        try:
            req = GenerationRequest(prompt=VICTIM[0], max_tokens=VICTIM[1], stream=True)
            result["text"] = "".join(c.text for c in GrpcLLMClient(server.grpc_url).generate(req))
        except Exception as exc:  # noqa: BLE001 -- reported by the test
            result["error"] = exc
        finally:
            done.set()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


POISON = [  # sent over gRPC with numpy floats, so NaN and infinities reach the server as they are
    {"temperature": 1e-45, "top_k": 40},
    {"repetition_penalty": 1e-45, "top_k": 40},
    {"presence_penalty": 3e38, "frequency_penalty": -3e38, "top_p": 0.9},
]
REFUSED = [
    ({"presence_penalty": math.nan, "top_k": 40}, "presence_penalty must be a finite number"),
    ({"frequency_penalty": -math.inf, "top_p": 0.9}, "frequency_penalty must be a finite number"),
    ({"temperature": math.inf}, "temperature must be a finite number"),
    ({"presence_penalty": math.inf}, "presence_penalty must be a finite number"),
    ({"repetition_penalty": math.nan}, "repetition_penalty must be a finite number"),
    ({"top_p": math.nan}, "top_p must be a finite number"),
]


def _ensemble_inputs(prompt: str, max_tokens: int, **options) -> dict[str, np.ndarray]:
    inputs = {"text_input": np.array([[prompt]], dtype=object), "max_tokens": np.array([[max_tokens]], dtype=np.int32)}
    for name, value in options.items():
        inputs[name] = np.array([[value]], dtype=np.int32 if isinstance(value, int) else np.float32)
    return inputs


@pytest.mark.parametrize("options", POISON)
def test_extreme_values_neither_fail_others_nor_themselves(server, hf, options):
    done, result = threading.Event(), {}
    victim = _victim(server, hf, done, result)
    for _ in range(3):
        got = stream_infer(server.grpc_url, "ensemble", [tensor(k, v) for k, v in
                                                          _ensemble_inputs("def f(x):", 8, **options).items()])
        assert got and all(r.as_numpy("text_output") is not None for r in got if r.as_numpy("text_output") is not None)
    victim.join(300)
    assert "error" not in result, result.get("error")
    assert result["text"] == hf_text(hf, *VICTIM)


@pytest.mark.parametrize("options, message", REFUSED)
def test_non_finite_values_are_refused_and_others_go_on(server, hf, options, message):
    done, result = threading.Event(), {}
    victim = _victim(server, hf, done, result)
    with pytest.raises(InferenceServerException) as info:
        stream_infer(server.grpc_url, "ensemble", [tensor(k, v) for k, v in
                                                    _ensemble_inputs("def f(x):", 32, **options).items()])
    assert message in info.value.message()
    victim.join(300)
    assert result.get("text") == hf_text(hf, *VICTIM), result


def test_http_penalty_overflowing_fp32_is_refused(server):
    body = {"text_input": "def f(x):", "max_tokens": 32, "presence_penalty": 1e39}
    resp = requests.post(f"http://{server.http_url}/v2/models/ensemble/generate", json=body, timeout=60)
    # The front refuses it before Triton parses it (Triton's own HTTP would make it +inf; gRPC clients reach the
    # model's check: test_non_finite_values_are_refused_and_others_go_on).
    assert resp.status_code == 400 and "presence_penalty is out of range for FP32" in resp.json()["error"], resp.text


def _direct_stream(url: str, prompt_ids: list[int], max_tokens: int, request_id: str, end_id: int):
    """A streaming tensorrt_llm request; returns (results queue, client) so the test can act while it runs."""
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=partial(anchor._enqueue, results))
    inputs = anchor.direct_inputs(prompt_ids, max_tokens, True, end_id, end_id, exclude_input_in_output=np.array([[True]]))
    client.async_stream_infer("tensorrt_llm", [anchor.tensor(grpcclient, k, v) for k, v in inputs.items()],
                              request_id=request_id, enable_empty_final_response=True)
    return results, client


def _drain(results: queue.Queue) -> tuple[list[int], int | None]:
    tokens, key = [], None
    while True:
        result, error = results.get(timeout=120)
        assert error is None, error
        ids = result.as_numpy("output_ids")
        if ids is not None:
            tokens.extend(ids[0][0].tolist())
            key = int(result.as_numpy("request_key")[0][0])
        if result.get_response().parameters["triton_final_response"].bool_param:
            return tokens, key


def _stop_inputs(**extra) -> list:
    """The anchor client's stop request: input_ids [1, 1], input_lengths 0, request_output_len 0, stop true."""
    inputs = {"input_ids": np.zeros((1, 1), dtype=np.int32), "input_lengths": np.zeros((1, 1), dtype=np.int32),
              "request_output_len": np.zeros((1, 1), dtype=np.int32), "stop": np.array([[True]]), **extra}
    return [tensor(k, v) for k, v in inputs.items()]


def _stop_as(url: str, request_id: str, **extra) -> InferenceServerException | None:
    client = grpcclient.InferenceServerClient(url)
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=partial(anchor._enqueue, results))
    client.async_stream_infer("tensorrt_llm", _stop_inputs(**extra), request_id=request_id,
                              enable_empty_final_response=True)
    _, error = results.get(timeout=60)
    client.stop_stream()
    client.close()
    return error


def test_stop_under_another_clients_request_id_does_not_end_its_stream(server, hf):
    prompt_ids, expected = hf_greedy(hf, VICTIM[0], 200)
    results, client = _direct_stream(server.grpc_url, prompt_ids, 200, "victim-42", hf[1].eos_token_id)
    try:
        first, error = results.get(timeout=120)
        assert error is None
        error = _stop_as(server.grpc_url, "victim-42")  # the attacker knows (or guesses) the request id only
        assert error is not None and "stop needs request_key" in error.message()
        tokens, _ = _drain(results)
    finally:
        client.stop_stream()
        client.close()
    assert first.as_numpy("output_ids")[0][0].tolist() + tokens == expected


def test_the_owner_stops_its_request_with_its_request_key(server, hf):
    prompt_ids, natural = hf_greedy(hf, VICTIM[0], 400)
    assert len(natural) > 100
    results, client = _direct_stream(server.grpc_url, prompt_ids, 400, "owner-1", hf[1].eos_token_id)
    try:
        first, error = results.get(timeout=120)
        assert error is None
        key = first.as_numpy("request_key")
        assert _stop_as(server.grpc_url, "", request_key=key.astype(np.uint64)) is None
        tokens, _ = _drain(results)
    finally:
        client.stop_stream()
        client.close()
    assert len(tokens) + 1 < len(natural)  # ended early, with a normal final response


BAD_HTTP = [
    ({"text_input": "def ", "top_k": 1, "temperature": 0.5}, "max_tokens (REQUEST_OUTPUT_LEN) is required"),
    ({"text_input": "def ", "max_tokens": 4, "stop_words": ["x" * 1_000_000]}, "stop_words is 1000000 bytes"),
    ({"text_input": "def ", "max_tokens": 4, "bad_words": ["ab"] * 3000}, "bad_words is 6000 bytes"),
    ({"text_input": "def ", "max_tokens": 4, "pad_id": 10**6}, "pad_id [1000000] are outside the vocabulary"),
    ({"text_input": "def ", "max_tokens": 4, "end_id": 2**31 - 1}, "end_id [2147483647] are outside the vocabulary"),
    ({"text_input": "def ", "max_tokens": 4, "end_id": -5}, "end_id [-5] are outside the vocabulary"),
]


@pytest.mark.parametrize("body, message", BAD_HTTP)
def test_malformed_requests_are_invalid_arg(server, body, message):
    for endpoint in ("generate", "generate_stream"):
        resp = requests.post(f"http://{server.http_url}/v2/models/ensemble/{endpoint}", json=body, timeout=60)
        assert resp.status_code == 400 and message in resp.text, resp.text


def test_missing_max_tokens_is_an_error_over_grpc(server):
    inputs = {"text_input": np.array([[b"def "]], dtype=object), "top_k": np.array([[1]], dtype=np.int32),
              "temperature": np.array([[0.5]], dtype=np.float32)}
    with pytest.raises(InferenceServerException, match=r"max_tokens \(REQUEST_OUTPUT_LEN\) is required"):
        stream_infer(server.grpc_url, "ensemble", [tensor(k, v) for k, v in inputs.items()])


@pytest.mark.parametrize("tokens, lengths, message", [
    ([[[5, -3]]], [[2]], "TOKENS_BATCH holds token ids outside"),
    ([[[5, 10**9]]], [[2]], "TOKENS_BATCH holds token ids outside"),
    ([[[5, 6]]], [[3]], "SEQUENCE_LENGTH values must be in [0, 2]"),
    ([[[5, 6]]], [[1, 1]], "SEQUENCE_LENGTH must have shape [1, 1]"),
])
def test_postprocessing_refuses_bad_ids_without_server_paths(server, tokens, lengths, message):
    with pytest.raises(InferenceServerException) as info:
        anchor.infer(server.http_url, "postprocessing", {"TOKENS_BATCH": np.array(tokens, dtype=np.int32),
                                                         "SEQUENCE_LENGTH": np.array(lengths, dtype=np.int32)})
    assert message in info.value.message() and "/" not in info.value.message(), info.value.message()
    assert info.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")

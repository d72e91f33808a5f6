"""Unit tests of the client package that need no server: request validation, the tensors and
JSON bodies built for the ensemble, response and SSE parsing, the CLI."""

from __future__ import annotations

import json
import math
import queue
import time
from dataclasses import fields
from typing import Any, Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

from client import GenerationError, GenerationRequest, GrpcLLMClient, HttpLLMClient, TextChunk
from client.cli import build_parser, main, print_chunks, request_from_args
from client.grpc_client import is_final_response, next_result
from client.http_client import error_message
from client.request import OPTIONS, UINT64_MAX
from client.response import chunk_from_outputs
from client.sse import parse_sse, parse_sse_json

# --- GenerationRequest validation -------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"prompt": ""}, "prompt"),
        ({"prompt": b"hi"}, "prompt"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": -3}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"max_tokens": 1.5}, "max_tokens"),
        ({"max_tokens": 2**31}, "max_tokens"),
        ({"stream": "yes"}, "stream"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": math.nan}, "temperature"),
        ({"temperature": "1"}, "temperature"),
        ({"top_k": -1}, "top_k"),
        ({"top_k": 2.0}, "top_k"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_p": -0.1}, "top_p"),
        ({"seed": -1}, "seed"),
        ({"seed": UINT64_MAX + 1}, "seed"),
        ({"end_id": -1}, "end_id"),
        ({"pad_id": -1}, "pad_id"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"presence_penalty": math.inf}, "presence_penalty"),
        ({"frequency_penalty": None, "length_penalty": -math.inf}, "length_penalty"),
        ({"stop_words": "stop"}, "stop_words"),
        ({"stop_words": ["ok", ""]}, "stop_words"),
        ({"bad_words": [1]}, "bad_words"),
        ({"bad_words": ("a",)}, "bad_words"),
        ({"exclude_input_in_output": 1}, "exclude_input_in_output"),
        ({"return_log_probs": "true"}, "return_log_probs"),
    ],
)
def test_invalid_request_names_the_field(kwargs: dict[str, Any], field: str) -> None:
    args = {"prompt": "hi", "max_tokens": 8, **kwargs}
    with pytest.raises(ValueError, match=field):
        GenerationRequest(**args)


def test_max_tokens_is_required() -> None:
    with pytest.raises(TypeError):
        GenerationRequest(prompt="hi")  # type: ignore[call-arg]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": 0},
        {"temperature": 0.7, "top_p": 0.01, "top_k": 0},
        {"top_p": 1},
        {"seed": 0},
        {"seed": UINT64_MAX},
        {"max_tokens": 2**31 - 1},
        {"presence_penalty": -2.0, "frequency_penalty": 2, "length_penalty": 0},
        {"stop_words": []},
    ],
)
def test_valid_edge_values_are_accepted(kwargs: dict[str, Any]) -> None:
    GenerationRequest(**{"prompt": "hi", "max_tokens": 8, **kwargs})


def test_every_optional_field_is_an_ensemble_option() -> None:
    optional = {f.name for f in fields(GenerationRequest)} - {"prompt", "max_tokens", "stream"}
    assert optional == set(OPTIONS)


# --- ensemble input tensors -------------------------------------------------------------------


def test_minimal_request_sends_the_required_inputs() -> None:
    arrays = GenerationRequest("héllo", max_tokens=16).to_arrays()
    assert list(arrays) == ["text_input", "max_tokens", "stream"]
    assert arrays["text_input"].dtype == np.object_ and arrays["text_input"].tolist() == [["héllo".encode()]]
    assert arrays["max_tokens"].dtype == np.int32 and arrays["max_tokens"].tolist() == [[16]]
    assert arrays["stream"].dtype == np.bool_ and arrays["stream"].tolist() == [[False]]
    assert all(array.shape == (1, 1) for array in arrays.values())


@pytest.mark.parametrize(
    "name, value, datatype, shape",
    [
        ("temperature", 0.5, "FP32", [1, 1]),
        ("top_k", 40, "INT32", [1, 1]),
        ("top_p", 0.9, "FP32", [1, 1]),
        ("seed", UINT64_MAX, "UINT64", [1, 1]),
        ("end_id", 2, "INT32", [1, 1]),
        ("pad_id", 0, "INT32", [1, 1]),
        ("min_tokens", 4, "INT32", [1, 1]),
        ("repetition_penalty", 1.1, "FP32", [1, 1]),
        ("presence_penalty", 0.25, "FP32", [1, 1]),
        ("frequency_penalty", -0.5, "FP32", [1, 1]),
        ("length_penalty", 1.0, "FP32", [1, 1]),
        ("stop_words", ["\n\n", "User:", "end"], "BYTES", [1, 3]),
        ("bad_words", ["damn"], "BYTES", [1, 1]),
        ("exclude_input_in_output", True, "BOOL", [1, 1]),
        ("return_log_probs", True, "BOOL", [1, 1]),
        ("return_num_input_tokens", False, "BOOL", [1, 1]),
        ("return_num_output_tokens", True, "BOOL", [1, 1]),
    ],
)
@pytest.mark.parametrize("infer_input", [grpcclient.InferInput, httpclient.InferInput])
def test_each_option_becomes_its_ensemble_input(
    name: str, value: Any, datatype: str, shape: list[int], infer_input: type
) -> None:
    req = GenerationRequest("hi", max_tokens=8, stream=True, **{name: value})
    inputs = {tensor.name(): tensor for tensor in req.to_infer_inputs(infer_input)}
    assert list(inputs) == ["text_input", "max_tokens", "stream", name]
    assert (inputs[name].datatype(), inputs[name].shape()) == (datatype, shape)
    assert [(inputs[n].datatype(), inputs[n].shape()) for n in ("text_input", "max_tokens", "stream")] == [
        ("BYTES", [1, 1]),
        ("INT32", [1, 1]),
        ("BOOL", [1, 1]),
    ]
    sent = req.to_arrays()[name].reshape(-1).tolist()
    expected = [w.encode() for w in value] if isinstance(value, list) else [value]
    if datatype == "FP32":
        assert sent == pytest.approx(expected)
    else:
        assert sent == expected


def test_unset_and_empty_options_are_not_sent() -> None:
    req = GenerationRequest("hi", max_tokens=8, stop_words=[], bad_words=None, temperature=None)
    assert [tensor.name() for tensor in req.to_infer_inputs()] == ["text_input", "max_tokens", "stream"]
    assert set(req.to_json()) == {"text_input", "max_tokens", "stream"}


# --- generate endpoint JSON body --------------------------------------------------------------


def test_minimal_json_body() -> None:
    body = GenerationRequest("What is ML?", max_tokens=20, stream=True).to_json()
    assert body == {"text_input": "What is ML?", "max_tokens": 20, "stream": True}


def test_json_body_has_plain_values_cast_to_the_input_type() -> None:
    req = GenerationRequest(
        "hi", 8, temperature=1, top_k=5, top_p=0.5, seed=UINT64_MAX, stop_words=["a", "b c"],
        exclude_input_in_output=True, repetition_penalty=2,
    )
    body = json.loads(json.dumps(req.to_json()))
    assert body["temperature"] == 1.0 and isinstance(body["temperature"], float)
    assert body["repetition_penalty"] == 2.0 and isinstance(body["repetition_penalty"], float)
    assert body["top_k"] == 5 and body["top_p"] == 0.5 and body["seed"] == UINT64_MAX
    assert body["stop_words"] == ["a", "b c"] and body["exclude_input_in_output"] is True


def test_output_names_follow_the_return_flags() -> None:
    assert GenerationRequest("hi", 8).output_names() == ["text_output"]
    req = GenerationRequest("hi", 8, return_log_probs=True, return_num_input_tokens=True,
                            return_num_output_tokens=True)
    assert req.output_names() == ["text_output", "cum_log_probs", "output_log_probs", "num_input_tokens",
                                  "num_output_tokens"]
    assert GenerationRequest("hi", 8, return_log_probs=False).output_names() == ["text_output"]


# --- responses --------------------------------------------------------------------------------

ALL_OUTPUTS = ["text_output", "cum_log_probs", "output_log_probs", "num_input_tokens", "num_output_tokens"]


def test_chunk_from_grpc_style_arrays() -> None:
    outputs = {
        "text_output": np.array([["日本".encode()]], dtype=np.object_),
        "cum_log_probs": np.array([[-1.5]], dtype=np.float32),
        "output_log_probs": np.array([[[-0.5, -1.0]]], dtype=np.float32),
        "num_input_tokens": np.array([[7]], dtype=np.int32),
        "num_output_tokens": np.array([[2]], dtype=np.int32),
    }
    chunk = chunk_from_outputs(outputs.get, ALL_OUTPUTS)
    assert chunk == TextChunk("日本", cum_log_probs=-1.5, output_log_probs=[-0.5, -1.0], num_input_tokens=7,
                              num_output_tokens=2)


def test_chunk_from_generate_json_strips_single_elements() -> None:
    # Triton's generate endpoint writes a one-element output as a bare value.
    body = {"model_name": "ensemble", "text_output": " world", "cum_log_probs": -0.25,
            "output_log_probs": -0.25, "num_output_tokens": 1}
    chunk = chunk_from_outputs(body.get, ALL_OUTPUTS)
    assert chunk == TextChunk(" world", cum_log_probs=-0.25, output_log_probs=[-0.25], num_output_tokens=1)


def test_chunk_reads_only_the_outputs_asked_for() -> None:
    body = {"text_output": "x", "cum_log_probs": 0.0, "output_log_probs": [0.0, 0.0], "num_output_tokens": 2}
    assert chunk_from_outputs(body.get, ["text_output"]) == TextChunk("x")


def test_response_without_text_is_no_chunk() -> None:
    assert chunk_from_outputs({}.get, ALL_OUTPUTS) is None
    empty = {"text_output": np.zeros((1, 0), dtype=np.object_)}
    assert chunk_from_outputs(empty.get, ALL_OUTPUTS) == TextChunk("")


def test_text_chunk_requires_str() -> None:
    with pytest.raises(TypeError):
        TextChunk(b"bytes")  # type: ignore[arg-type]


def _infer_result(text: bytes | None, final: bool) -> grpcclient.InferResult:
    response = service_pb2.ModelInferResponse(model_name="ensemble", id="r1")
    if text is not None:
        response.outputs.add(name="text_output", datatype="BYTES", shape=[1, 1])
        response.raw_output_contents.append(serialize_byte_tensor(np.array([[text]], dtype=np.object_)).item())
    response.parameters["triton_final_response"].bool_param = final
    return grpcclient.InferResult(response)


def test_grpc_result_decodes_and_final_flag() -> None:
    result = _infer_result(b"hello", final=False)
    assert chunk_from_outputs(result.as_numpy, ["text_output"]) == TextChunk("hello")
    assert not is_final_response(result)
    empty_final = _infer_result(None, final=True)
    assert is_final_response(empty_final) and chunk_from_outputs(empty_final.as_numpy, ["text_output"]) is None


def test_next_result_raises_triton_status_and_message() -> None:
    responses: queue.Queue = queue.Queue()
    responses.put((None, InferenceServerException("max_tokens must be > 0", status="StatusCode.INVALID_ARGUMENT")))
    with pytest.raises(GenerationError) as caught:
        next_result(responses, time.monotonic() + 5)
    assert caught.value.status == "StatusCode.INVALID_ARGUMENT"
    assert caught.value.message == "max_tokens must be > 0"
    assert str(caught.value) == "StatusCode.INVALID_ARGUMENT: max_tokens must be > 0"


def test_next_result_times_out_instead_of_hanging() -> None:
    started = time.monotonic()
    with pytest.raises(GenerationError) as caught:
        next_result(queue.Queue(), started + 0.05)
    assert caught.value.status == "StatusCode.DEADLINE_EXCEEDED"
    assert time.monotonic() - started < 2


def test_next_result_returns_the_result() -> None:
    responses: queue.Queue = queue.Queue()
    result = _infer_result(b"a", final=True)
    responses.put((result, None))
    assert next_result(responses, time.monotonic() + 5) is result


def test_generation_error_without_status() -> None:
    error = GenerationError(None, "Stub process is not healthy")
    assert (error.status, error.message, str(error)) == (None, "Stub process is not healthy",
                                                          "Stub process is not healthy")


# --- Server-Sent Events -----------------------------------------------------------------------


def test_sse_events_from_byte_lines() -> None:
    lines = [b'data: {"text_output": "Hel"}', b"", b'data: {"text_output": "lo"}', b""]
    assert list(parse_sse_json(lines)) == [{"text_output": "Hel"}, {"text_output": "lo"}]


def test_sse_skips_comments_and_other_fields_and_joins_data_lines() -> None:
    lines = [b": keep-alive", b"event: message", b"id: 3", b"data:first", b"data: second\r\n", b"\r\n",
             b"retry: 100", b"", b"data: last"]
    assert list(parse_sse(lines)) == ["first\nsecond", "last"]


def test_sse_accepts_str_lines_and_error_events() -> None:
    lines = ["data: {\"error\": \"in ensemble 'ensemble': max_tokens must be > 0\"}", ""]
    assert list(parse_sse_json(lines)) == [{"error": "in ensemble 'ensemble': max_tokens must be > 0"}]


def test_sse_rejects_a_non_object_event() -> None:
    with pytest.raises(ValueError):
        list(parse_sse_json([b"data: [1, 2]", b""]))


@pytest.mark.parametrize(
    "body, expected",
    [
        ('{"error":"unexpected inference input \'foo\'"}', "unexpected inference input 'foo'"),
        ('data: {"error":"top_p must be in [0, 1]"}\n\n', "top_p must be in [0, 1]"),
        ("plain failure\n", "plain failure"),
        ("", "Bad Request"),
    ],
)
def test_http_error_message(body: str, expected: str) -> None:
    assert error_message(body, "Bad Request") == expected


# --- clients' configuration -------------------------------------------------------------------


def test_http_endpoints() -> None:
    assert HttpLLMClient().endpoint("generate") == "http://localhost:8000/v2/models/ensemble/generate"
    client = HttpLLMClient("triton:9000/", model="llama")
    assert client.endpoint("generate_stream") == "http://triton:9000/v2/models/llama/generate_stream"


@pytest.mark.parametrize("client_cls", [GrpcLLMClient, HttpLLMClient])
def test_timeout_must_be_positive(client_cls: type) -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        client_cls(timeout_s=0)


# --- CLI --------------------------------------------------------------------------------------


def test_cli_defaults() -> None:
    args = build_parser().parse_args(["Hello"])
    assert (args.protocol, args.url, args.model, args.no_stream) == ("grpc", None, "ensemble", False)
    assert request_from_args(args) == GenerationRequest("Hello", max_tokens=64, stream=True)


def test_cli_options_map_to_request_fields() -> None:
    argv = ["Hi there", "--max-tokens", "12", "--protocol", "http", "--no-stream", "--url", "h:1", "--model", "m",
            "--temperature", "0.7", "--top-k", "40", "--top-p", "0.9", "--seed", "42", "--end-id", "2",
            "--pad-id", "0", "--min-tokens", "3", "--repetition-penalty", "1.1", "--presence-penalty", "0.5",
            "--frequency-penalty", "0.25", "--length-penalty", "1.0", "--stop-word", "\n", "--stop-word", "User:",
            "--bad-word", "damn", "--exclude-input"]
    args = build_parser().parse_args(argv)
    assert (args.protocol, args.url, args.model) == ("http", "h:1", "m")
    assert request_from_args(args) == GenerationRequest(
        "Hi there", max_tokens=12, stream=False, temperature=0.7, top_k=40, top_p=0.9, seed=42, end_id=2, pad_id=0,
        min_tokens=3, repetition_penalty=1.1, presence_penalty=0.5, frequency_penalty=0.25, length_penalty=1.0,
        stop_words=["\n", "User:"], bad_words=["damn"], exclude_input_in_output=True,
    )


def test_cli_rejects_unknown_protocol() -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["hi", "--protocol", "ws"])


def test_cli_invalid_request_exits_1_with_message(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hi", "--max-tokens", "0"]) == 1
    assert "max_tokens" in capsys.readouterr().err


@pytest.mark.parametrize("protocol, url", [("grpc", "localhost:1"), ("http", "http://localhost:1")])
def test_cli_unreachable_server_exits_1(protocol: str, url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hi", "--protocol", protocol, "--url", url, "--timeout", "5"]) == 1
    assert capsys.readouterr().err.startswith("error: ")


def test_print_chunks_streams_text_and_closes_on_error(capsys: pytest.CaptureFixture[str]) -> None:
    closed = []

    def chunks() -> Iterator[TextChunk]:
        try:
            yield TextChunk("Hel")
            yield TextChunk("lo")
            raise GenerationError("StatusCode.INTERNAL", "boom")
        finally:
            closed.append(True)

    with pytest.raises(GenerationError):
        print_chunks(chunks())
    assert capsys.readouterr().out == "Hello\n" and closed == [True]

"""Bad input gets INVALID_ARG with a message naming the problem; the server stays up and serves the next one."""
from __future__ import annotations

import numpy as np
import pytest
import requests
from tritonclient.utils import InferenceServerException

from client import GenerationRequest, GrpcLLMClient
from tests.integration.conftest import MAX_INPUT_LEN, MAX_SEQ_LEN
from tests.integration.oracle import hf_text
from tests.integration.trtllm_direct import stream_infer, tensor

HTTP_CASES = [
    ({"text_input": "", "max_tokens": 4}, "text_input is empty"),
    ({"text_input": "def "}, "max_tokens (REQUEST_OUTPUT_LEN) is required"),
    ({"text_input": "def ", "max_tokens": 0}, "max_tokens must be > 0"),
    ({"text_input": "def ", "max_tokens": -3}, "max_tokens must be > 0"),
    ({"text_input": "def ", "max_tokens": MAX_SEQ_LEN * 10}, "max_tokens"),
    ({"text_input": "x = 1\n" * MAX_INPUT_LEN, "max_tokens": 4}, f"more than max_input_len ({MAX_INPUT_LEN})"),
    ({"text_input": "def ", "max_tokens": 4, "top_p": 1.5}, "top_p must be in (0, 1]"),
    ({"text_input": "def ", "max_tokens": 4, "top_p": 1.0001}, "top_p must be in (0, 1]"),
    ({"text_input": "def ", "max_tokens": 4, "temperature": -0.5}, "temperature must be >= 0"),
    ({"text_input": "def ", "max_tokens": 4, "beam_width": 4}, "beam_width must be 1"),
    # Wrong JSON types: Triton 2.51's HTTP parser answers 500; the front refuses them first (docs/front.md).
    ({"text_input": "def ", "max_tokens": "four"}, "max_tokens must be an integer (INT32)"),
    ({"text_input": "def ", "max_tokens": 4, "top_p": "high"}, "top_p must be a number (FP32)"),
]


def _assert_serves(server, hf):
    req = GenerationRequest(prompt="def ", max_tokens=8)
    assert "".join(c.text for c in GrpcLLMClient(server.grpc_url).generate(req)) == hf_text(hf, "def ", 8)


@pytest.mark.parametrize("body,message", HTTP_CASES)
def test_http_bad_input_is_invalid_arg(server, hf, body, message):
    resp = requests.post(f"http://{server.http_url}/v2/models/ensemble/generate", json=body, timeout=60)
    assert resp.status_code == 400, resp.text  # Triton's HTTP status for INVALID_ARG
    assert message in resp.json()["error"]
    _assert_serves(server, hf)


def _grpc_error(server, inputs: dict[str, np.ndarray]) -> str:
    with pytest.raises(InferenceServerException) as info:
        stream_infer(server.grpc_url, "ensemble", [tensor(k, v) for k, v in inputs.items()])
    return info.value.message()


TEXT = np.array([[b"def "]], dtype=object)
FOUR = np.array([[4]], dtype=np.int32)
GRPC_CASES = [
    # Not valid UTF-8: cannot even be written in JSON, so over gRPC.
    ({"text_input": np.array([[b"def \xff\xfe"]], dtype=object), "max_tokens": FOUR}, "not valid UTF-8"),
    ({"text_input": TEXT, "max_tokens": np.array([[4]], dtype=np.int64)}, "INT64"),
    ({"text_input": np.array([[b"def ", b"x"]], dtype=object), "max_tokens": FOUR}, "shape"),
    ({"text_input": TEXT, "max_tokens": FOUR, "temperature": np.array([[-1.0]], dtype=np.float32)},
     "temperature must be >= 0"),
    ({"text_input": TEXT, "max_tokens": FOUR, "top_p": np.array([[1.5]], dtype=np.float32)}, "top_p must be in (0, 1]"),
]


@pytest.mark.parametrize("inputs,message", GRPC_CASES)
def test_grpc_bad_input_is_reported(server, hf, inputs, message):
    assert message in _grpc_error(server, inputs)
    _assert_serves(server, hf)

"""An accepted request's error as a stream_error response (backend/serving/stream_errors.py): who asks for it, the
tensors tensorrt_llm sends, and what postprocessing makes of them."""
from __future__ import annotations

import numpy as np
import pytest

from backend.errors import InvalidRequestError
from backend.serving import stream_errors
from backend.serving.response_group import RowError


def test_only_a_decoupled_request_that_asks_gets_its_errors_in_the_stream():
    asks = {"errors_in_stream": np.array([True])}
    assert stream_errors.wanted(asks, decoupled=True)
    assert not stream_errors.wanted(asks, decoupled=False)  # one response: nothing can run beside it
    assert not stream_errors.wanted({}, decoupled=True)  # a direct client, the BLS model: Triton errors
    assert not stream_errors.wanted({"errors_in_stream": np.array([False])}, decoupled=True)
    with pytest.raises(InvalidRequestError, match="errors_in_stream must be BOOL"):
        stream_errors.wanted({"errors_in_stream": np.array([1], dtype=np.int32)}, decoupled=True)


def test_error_tensors_round_trip_through_postprocessing():
    message = "request timed out: its deadline (timeout_ms=800) passed; its KV blocks were freed — ünïcode"
    tensors = stream_errors.error_tensors("UNAVAILABLE", message, request_key=2**63 - 1)
    assert tensors["output_ids"].shape == (1, 1, 0) and tensors["sequence_length"].tolist() == [[0]]
    assert tensors["stream_final"].tolist() == [[True]] and tensors["request_key"].tolist() == [[2**63 - 1]]
    assert stream_errors.read(tensors["stream_error"]) == ("UNAVAILABLE", message)


def test_a_row_error_with_a_code_no_sender_knows_is_refused_where_it_is_made():
    """Not at the send of the request's last response, where it would leave the client waiting."""
    with pytest.raises(ValueError, match="RowError code must be one of INVALID_ARG, UNAVAILABLE, CANCELLED, INTERNAL"):
        RowError("x", "NOT_A_CODE")
    assert [RowError("x", code).code for code in stream_errors.CODES] == list(stream_errors.CODES)


@pytest.mark.parametrize("value, match", [
    (np.array([[b"UNAVAILABLE"]], dtype=object), r"must hold \[code, message\]"),
    (np.array([[b"EXIT", b"x"]], dtype=object), "code must be one of INVALID_ARG, UNAVAILABLE"),
])
def test_postprocessing_refuses_a_stream_error_that_is_not_one(value, match):
    """A client calling postprocessing directly gets INVALID_ARG, never an unknown code passed to Triton."""
    with pytest.raises(InvalidRequestError, match=match):
        stream_errors.read(value)

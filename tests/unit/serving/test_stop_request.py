"""The stop request that postprocessing and tensorrt_llm_bls send for a cancelled stream
(backend/serving/stop_request.py)."""
from __future__ import annotations

import numpy as np

from backend.serving.stop_request import ANY_VERSION, stop_inputs, stop_version


def test_stop_inputs_carry_the_key_and_the_required_one_token_inputs():
    inputs = stop_inputs(np.array([[2**63 + 5]], dtype=np.uint64))
    assert sorted(inputs) == ["input_ids", "input_lengths", "request_key", "request_output_len", "stop"]
    assert inputs["request_key"].dtype == np.uint64 and inputs["request_key"].tolist() == [[2**63 + 5]]
    assert inputs["stop"].dtype == np.bool_ and inputs["stop"].tolist() == [[True]]
    for name in ("input_ids", "input_lengths", "request_output_len"):
        assert inputs[name].dtype == np.int32 and inputs[name].tolist() == [[1]]
    assert stop_inputs(np.array([7], dtype=np.uint64))["request_key"].shape == (1, 1)  # a [1]-shaped key too


def test_the_stop_goes_to_the_version_that_served_the_stream():
    assert stop_version(None) == ANY_VERSION == -1
    assert stop_version(np.array([[3]], dtype=np.int32)) == 3
    assert stop_version(np.array([2], dtype=np.int32)) == 2

"""The canary router's forwarding state machine (backend/serving/router_forwarding.py), without Triton."""
from __future__ import annotations

import numpy as np
import pytest

from backend.serving.router_forwarding import Forwarding, Outcome


def response(final: bool, key: int = 7, tokens: int = 1) -> dict[str, np.ndarray]:
    return {"output_ids": np.zeros((1, 1, tokens), np.int32), "stream_final": np.array([[final]]),
            "request_key": np.array([[key]], np.uint64)}


def never_gone() -> bool:
    raise AssertionError("readiness must not be asked after something was sent")


def test_one_sequence_final_flag_on_its_last_response():
    fwd = Forwarding(finals=1, retry_allowed=True)
    assert fwd.on_tensors(response(False)) is False
    assert fwd.on_tensors(response(True)) is True
    assert fwd.complete and not fwd.needs_final()
    assert fwd.on_tensors(response(False)) is None  # anything after the last final is dropped


def test_several_sequences_owe_one_final_each():
    fwd = Forwarding(finals=3, retry_allowed=True)
    flags = [fwd.on_tensors(response(final)) for final in (False, True, True, False, True)]
    assert flags == [False, False, False, False, True]


def test_empty_responses_are_dropped_and_a_short_stream_needs_an_empty_final():
    fwd = Forwarding(finals=2, retry_allowed=True)
    assert fwd.on_tensors({}) is None
    fwd.on_tensors(response(True))
    assert fwd.needs_final()


def test_error_before_anything_sent_retries_only_if_the_version_is_gone():
    assert Forwarding(1, retry_allowed=True).on_error(lambda: True) is Outcome.GONE
    assert Forwarding(1, retry_allowed=True).on_error(lambda: False) is Outcome.ERROR
    assert Forwarding(1, retry_allowed=False).on_error(lambda: True) is Outcome.ERROR  # pinned: no other version


def test_error_after_a_response_goes_to_the_client():
    fwd = Forwarding(1, retry_allowed=True)
    fwd.on_tensors(response(False))
    assert fwd.on_error(never_gone) is Outcome.ERROR


def test_finals_must_be_positive():
    with pytest.raises(ValueError, match="at least one final"):
        Forwarding(0, retry_allowed=True)


def test_a_stream_error_ends_the_request_whatever_finals_it_was_owed():
    """tensorrt_llm's error in the ensemble is its stream's last response (backend/serving/stream_errors.py): it goes
    out with the FINAL flag, nothing after it, and no empty final is added."""
    fwd = Forwarding(finals=2, retry_allowed=True)
    assert fwd.on_tensors(response(False)) is False
    error = {**response(True), "stream_error": np.array([[b"UNAVAILABLE", b"request timed out: ..."]], dtype=object)}
    assert fwd.on_tensors(error) is True
    assert fwd.failed and fwd.complete and not fwd.needs_final()
    assert fwd.on_tensors(response(True)) is None

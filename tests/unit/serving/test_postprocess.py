"""Postprocessor.token_ids: the ids text_output decodes (OUT_TOKEN_IDS), beam 0, padded past each row's length."""
from __future__ import annotations

import numpy as np

from backend.serving.postprocess import Postprocessor


def test_token_ids_take_beam_zero_up_to_the_sequence_length():
    tokens = np.array([[[5, 6, 7], [9, 9, 9]], [[1, 2, 0], [8, 8, 8]]], dtype=np.int32)  # (B 2, beams 2, T 3)
    lengths = np.array([[3, 3], [2, 3]], dtype=np.int32)
    out = Postprocessor.token_ids(tokens, lengths)
    assert out.dtype == np.int32 and out.tolist() == [[5, 6, 7], [1, 2, -1]]


def test_token_ids_of_an_empty_final_response():
    out = Postprocessor.token_ids(np.zeros((1, 1, 0), dtype=np.int32), np.zeros((1, 1), dtype=np.int32))
    assert out.shape == (1, 0)

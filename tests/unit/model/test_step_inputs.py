"""StepInputs: what the parallel driver broadcasts survives pack/unpack, and builds the same tensors."""
from __future__ import annotations

import torch

from backend.model.decoder import rotary_tables
from backend.model.step_inputs import StepInputs, step_tensors


def _inputs() -> StepInputs:
    # Two sequences: a 3-token prefill chunk at positions 4..6 that does not sample yet, and a decode at 9.
    return StepInputs(tokens=torch.tensor([11, 12, 13, 14]), start=torch.tensor([4, 9]), end=torch.tensor([7, 10]),
                      sampled=torch.tensor([0, 1]), context_slots=torch.arange(20).view(2, 10))


def test_pack_unpack_round_trip():
    inputs = _inputs()
    header, payload = inputs.pack()
    assert header.tolist() == [4, 2, 10] and payload.numel() == StepInputs.payload_size(header)
    back = StepInputs.unpack(header, payload)
    for name in ("tokens", "start", "end", "sampled", "context_slots"):
        assert torch.equal(getattr(back, name), getattr(inputs, name)), name
    assert back.num_sampled == 1


def test_step_tensors_layout():
    cos, sin = rotary_tables(8, 32, 10000.0)
    ids, meta, logits_index = step_tensors(_inputs(), cos, sin, torch.float32, torch.device("cpu"))
    assert ids.tolist() == [11, 12, 13, 14]
    assert meta.slot_mapping.tolist() == [4, 5, 6, 19]  # positions 4..6 of sequence 0, position 9 of sequence 1
    assert meta.query_index.tolist() == [[0, 1, 2], [3, 0, 0]]
    assert logits_index.tolist() == [3]  # only the decode samples
    assert torch.equal(meta.cos, cos[[4, 5, 6, 9]])
    assert meta.mask[1, 0, 0].tolist() == [True] * 10  # the decode at position 9 sees all 10 context positions
    assert meta.mask[0, 0, 0].tolist() == [True] * 5 + [False] * 5  # position 4 sees 0..4

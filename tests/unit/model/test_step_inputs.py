"""StepInputs: what the parallel driver broadcasts survives pack/unpack, and builds the same tensors (positions, KV
slots, per-window masks, per-token rotary state)."""
from __future__ import annotations

import pytest
import torch

from backend.model.decoder import signed_sin
from backend.model.rope import RopeSpec
from backend.model.rotary import RotaryEmbedding
from backend.model.step_inputs import StepInputs, _decode_tensors, _step_tensors, step_tensors

ROTARY = RotaryEmbedding(RopeSpec("default", 10000.0, 8, 32), torch.device("cpu"))


def _inputs() -> StepInputs:
    # Two sequences: a 3-token prefill chunk at positions 4..6 that does not sample yet, and a decode at 9.
    return StepInputs.of(tokens=torch.tensor([11, 12, 13, 14]), start=torch.tensor([4, 9]), end=torch.tensor([7, 10]),
                         sampled=torch.tensor([0, 1]), context_slots=torch.arange(20).view(2, 10))


def test_pack_unpack_round_trip():
    inputs = StepInputs(**{**_inputs().__dict__, "ctx_start": torch.tensor([0, 2]),
                           "prompt_len": torch.tensor([7, 5]), "total_len": torch.tensor([7, 10])})
    header, payload = inputs.pack()
    assert header.tolist() == [4, 2, 10] and payload.numel() == StepInputs.payload_size(header)
    back = StepInputs.unpack(header, payload)
    for name in ("tokens", "start", "end", "sampled", "context_slots", "ctx_start", "prompt_len", "total_len"):
        assert torch.equal(getattr(back, name), getattr(inputs, name)), name
    assert back.num_sampled == 1


def test_step_tensors_layout():
    ids, meta, logits_index = step_tensors(_inputs(), ROTARY, {None, 3}, torch.float32, torch.device("cpu"))
    assert ids.tolist() == [11, 12, 13, 14]
    assert meta.slot_mapping.tolist() == [4, 5, 6, 19]  # positions 4..6 of sequence 0, position 9 of sequence 1
    assert meta.query_index.tolist() == [[0, 1, 2], [3, 0, 0]]
    assert logits_index.tolist() == [3]  # only the decode samples
    want_cos, want_sin = ROTARY.cos_sin(torch.tensor([4, 5, 6, 9]), torch.tensor([7] * 4), torch.tensor([7] * 4))
    assert torch.equal(meta.cos, want_cos) and torch.equal(meta.sin_signed, signed_sin(want_sin))
    assert not meta.decode_only  # a 3-token chunk: queries need the padded (B, Q) layout
    full, window = meta.masks[None], meta.masks[3]
    assert full[1, 0, 0].tolist() == [True] * 10  # the decode at position 9 sees all 10 context positions
    assert full[0, 0, 0].tolist() == [True] * 5 + [False] * 5  # position 4 sees 0..4
    assert window[0, 0, 0].tolist() == [False] * 2 + [True] * 3 + [False] * 5  # window 3: positions 2..4
    assert window[1, 0, 0].tolist() == [False] * 7 + [True] * 3


def test_context_starting_past_a_released_window():
    """ctx_start: column j of context_slots holds position ctx_start + j (older blocks released)."""
    inputs = StepInputs.of(tokens=torch.tensor([5]), start=torch.tensor([9]), end=torch.tensor([10]),
                           sampled=torch.tensor([1]), context_slots=torch.tensor([[40, 41, 42, 43]]),
                           ctx_start=torch.tensor([6]))
    _, meta, _ = step_tensors(inputs, ROTARY, {4}, torch.float32, torch.device("cpu"))
    assert meta.slot_mapping.tolist() == [43]
    assert meta.masks[4][0, 0, 0].tolist() == [True] * 4  # positions 6..9, the window of 9


def test_a_step_of_single_tokens_is_decode_only():
    inputs = StepInputs.of(tokens=torch.tensor([5, 6]), start=torch.tensor([3, 7]), end=torch.tensor([4, 8]),
                           sampled=torch.tensor([1, 1]), context_slots=torch.arange(16).view(2, 8))
    assert inputs.is_decode and not _inputs().is_decode  # _inputs() holds a 3-token chunk
    _, meta, _ = step_tensors(inputs, ROTARY, {None}, torch.float32, torch.device("cpu"))
    assert meta.decode_only and meta.query_index.shape == (2, 1)


def test_causal_windows_only_where_the_mask_is_top_left_causal():
    """Fresh prompts (contexts = their new tokens, from column 0): every window spanning the longest chunk is plain
    causal, and the masks say so too; a cached prefix, a shorter window or a decode step is not."""
    def meta_of(start, end, ctx_start=None):
        inputs = StepInputs.of(tokens=torch.arange(int((torch.tensor(end) - torch.tensor(start)).sum())),
                               start=torch.tensor(start), end=torch.tensor(end), sampled=torch.ones(len(start)),
                               context_slots=torch.arange(len(start) * 8).view(len(start), 8),
                               ctx_start=None if ctx_start is None else torch.tensor(ctx_start))
        return step_tensors(inputs, ROTARY, {None, 3, 5}, torch.float32, torch.device("cpu"))[1]

    fresh = meta_of([0, 0], [5, 2])
    assert fresh.causal == {None, 5}
    for w in fresh.causal:  # the valid query rows of the mask are the lower triangle
        assert torch.equal(fresh.masks[w][0, 0], torch.ones(5, 8, dtype=torch.bool).tril()[:, :8] & (torch.arange(8) < 5))
    assert meta_of([3, 0], [5, 2]).causal == frozenset()  # sequence 0 has 3 cached positions
    assert meta_of([4, 0], [5, 2], ctx_start=[4, 0]).causal == {None, 3, 5}  # released positions 0..3; chunks <= 2
    assert meta_of([4, 6], [5, 7]).causal == frozenset()  # a decode step


def test_a_step_mixing_decodes_and_prompts_gets_one_metadata_per_group():
    """The decode sequence and the chunk each get the metadata step_tensors gives them alone (contexts cut to their
    own width), with their flat token indices; the paged kernel's columns go to the decode group."""
    _, meta, _ = step_tensors(_inputs(), ROTARY, {None, 3}, torch.float32, torch.device("cpu"), paged_decode=True)
    (decode_tokens, decode), (chunk_tokens, chunk) = meta.parts
    assert decode_tokens.tolist() == [3] and chunk_tokens.tolist() == [0, 1, 2]
    assert decode.decode_only and decode.decode_columns is not None and chunk.decode_columns is None
    assert decode.slot_mapping.tolist() == [19] and chunk.slot_mapping.tolist() == [4, 5, 6]
    assert chunk.context_slots.shape == (1, 7) and decode.context_slots.shape == (1, 10)
    assert torch.equal(chunk.masks[3][0, 0], meta.masks[3][0, 0, :3, :7])
    assert torch.equal(decode.cos, meta.cos[3:]) and chunk.parts is None and decode.parts is None
    fresh = step_tensors(StepInputs.of(tokens=torch.arange(5), start=torch.tensor([0, 0]), end=torch.tensor([3, 2]),
                                       sampled=torch.ones(2), context_slots=torch.arange(6).view(2, 3)),
                         ROTARY, {None}, torch.float32, torch.device("cpu"))[1]
    assert fresh.parts is None  # prompts only: one group


ROPES = {
    "default": RopeSpec("default", 10000.0, 8, 32),
    "dynamic": RopeSpec("dynamic", 10000.0, 8, 32, {"factor": 2.0}),  # per-sequence NTK past 32 positions
    "longrope": RopeSpec("longrope", 10000.0, 8, 512, {"original_max_position_embeddings": 32,
                                                      "short_factor": [1.0, 1.1, 1.3, 1.6],
                                                      "long_factor": [1.0, 2.0, 4.0, 8.0]}),
}


def _random_decode_step(gen: torch.Generator, B: int) -> StepInputs:
    """B sequences decoding one token each at random positions (some past 32: dynamic NTK and longrope's long set),
    some with released blocks (ctx_start > 0), some not sampling, contexts of different widths padded."""
    start = torch.randint(0, 60, (B,), generator=gen)
    ctx_start = torch.where(torch.rand(B, generator=gen) < 0.3, start // 2, torch.zeros_like(start))
    end = start + 1
    width = int((end - ctx_start).max())
    slots = torch.randint(0, 1000, (B, width), generator=gen)
    return StepInputs(tokens=torch.randint(0, 100, (B,), generator=gen), start=start, end=end,
                      sampled=(torch.rand(B, generator=gen) < 0.8).long(), context_slots=slots, ctx_start=ctx_start,
                      prompt_len=torch.minimum(torch.randint(1, 40, (B,), generator=gen), end), total_len=end)


def _assert_same_tensors(fast, general) -> None:
    (ids, meta, index), (want_ids, want, want_index) = fast, general
    assert torch.equal(ids, want_ids) and torch.equal(index, want_index)
    for name in ("slot_mapping", "query_index", "query_flat", "context_slots", "cos", "sin_signed"):
        got, expected = getattr(meta, name), getattr(want, name)
        assert got.dtype == expected.dtype and torch.equal(got, expected), name
    assert meta.masks.keys() == want.masks.keys()
    assert all(torch.equal(meta.masks[w], want.masks[w]) for w in want.masks)
    assert (meta.decode_only, meta.causal, meta.causal_seqs, meta.parts) == (True, want.causal, None, None)
    assert want.decode_only and want.causal_seqs is None and want.parts is None
    assert (meta.decode_columns is None) == (want.decode_columns is None)
    for w, (first, stop) in (meta.decode_columns or {}).items():
        assert torch.equal(first, want.decode_columns[w][0]) and torch.equal(stop, want.decode_columns[w][1])


@pytest.mark.parametrize("rope", sorted(ROPES))
@pytest.mark.parametrize("paged", [False, True])
def test_a_decode_steps_shortcut_builds_the_general_paths_tensors(rope, paged):
    """step_tensors takes _decode_tensors for a decode step; every tensor it builds is the general path's, for
    sliding windows, released blocks, sequences that do not sample and each rope's per-token state."""
    gen = torch.Generator().manual_seed(len(rope) + paged)
    rotary = RotaryEmbedding(ROPES[rope], torch.device("cpu"))
    for B in (1, 2, 5, 16):
        for _ in range(8):
            inputs = _random_decode_step(gen, B)
            args = (inputs, rotary, {None, 3, 16}, torch.float32, torch.device("cpu"), paged)
            general = _step_tensors(*args, False)
            _assert_same_tensors(_decode_tensors(*args), general)
            _assert_same_tensors(step_tensors(*args), general)

"""The attention's shortcuts are exact: rotary with the sign folded into sin equals HF's rotate_half formula bit
for bit (full and partial rotary), and a decode step's direct query layout gives the padded layout's output."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from backend.model.decoder import Attention, apply_rotary, signed_sin
from backend.model.features import AttentionFeatures
from backend.model.rope import RopeSpec
from backend.model.rotary import RotaryEmbedding
from backend.model.step_inputs import StepInputs, step_tensors


def _hf_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' apply_rotary_pos_emb on the first rot channels (rotate_half with its negation)."""
    rot = cos.shape[-1]
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    rotated = torch.cat((-x_rot[..., rot // 2:], x_rot[..., :rot // 2]), dim=-1)
    return torch.cat((x_rot * cos[:, None] + rotated * sin[:, None], x_pass), dim=-1)


@pytest.mark.parametrize("rot", [16, 8])  # 8 of 16: partial rotary (Phi, GPT-NeoX style)
def test_signed_sin_rotary_is_hf_rotary_bit_for_bit(rot):
    g = torch.Generator().manual_seed(rot)
    x = torch.randn(5, 3, 16, generator=g) * 100
    angles = torch.rand(5, rot // 2, generator=g) * 1000
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    assert torch.equal(apply_rotary(x, cos, signed_sin(sin)), _hf_rotary(x, cos, sin))


def test_decode_only_layout_matches_the_padded_layout():
    torch.manual_seed(0)
    attention = Attention(AttentionFeatures(64, 4, 2, 16, True, False, 1e-6, 0.25, None), window=None)
    rotary = RotaryEmbedding(RopeSpec("default", 10000.0, 16, 64), torch.device("cpu"))
    inputs = StepInputs.of(tokens=torch.tensor([1, 2, 3]), start=torch.tensor([5, 2, 7]), end=torch.tensor([6, 3, 8]),
                           sampled=torch.tensor([1, 1, 1]), context_slots=torch.arange(24).view(3, 8))
    _, meta, _ = step_tensors(inputs, rotary, {None}, torch.float32, torch.device("cpu"))
    assert meta.decode_only
    x = torch.randn(3, 64)
    outs = []
    for m in (meta, dataclasses.replace(meta, decode_only=False)):
        g = torch.Generator().manual_seed(1)  # the same pools for both layouts (the step writes into them)
        k_cache, v_cache = torch.randn(24, 2, 16, generator=g), torch.randn(24, 2, 16, generator=g)
        outs.append(attention(x, k_cache, v_cache, m))
    assert torch.equal(outs[0], outs[1])


def test_a_fresh_prefill_told_causal_equals_its_mask():
    """A step of fresh prompts (ragged, padded) runs SDPA with is_causal: the same output bit for bit as the
    masked call it replaces."""
    torch.manual_seed(2)
    attention = Attention(AttentionFeatures(64, 4, 2, 16, False, False, 1e-6, 0.25, None), window=None)
    rotary = RotaryEmbedding(RopeSpec("default", 10000.0, 16, 64), torch.device("cpu"))
    inputs = StepInputs.of(tokens=torch.arange(60), start=torch.tensor([0, 0, 0]), end=torch.tensor([37, 3, 20]),
                           sampled=torch.tensor([1, 1, 1]), context_slots=torch.arange(3 * 37).view(3, 37))
    _, meta, _ = step_tensors(inputs, rotary, {None}, torch.float32, torch.device("cpu"))
    assert meta.causal == {None}
    x = torch.randn(60, 64)
    outs = [attention(x, torch.zeros(111, 2, 16), torch.zeros(111, 2, 16), m)
            for m in (meta, dataclasses.replace(meta, causal=frozenset()))]
    assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("window,softcap", [(None, None), (3, None), (None, 30.0)])
def test_a_step_mixing_decodes_and_prompts_attends_per_group_as_the_padded_layout(window, softcap):
    """Decode tokens beside a prefill chunk and a fresh prompt: each group attended on its own (meta.parts) gives what
    the one padded (B, Q, L) layout gives, without padding every decode sequence to the longest chunk."""
    torch.manual_seed(3)
    attention = Attention(AttentionFeatures(64, 4, 2, 16, False, False, 1e-6, 0.25, softcap), window=window)
    rotary = RotaryEmbedding(RopeSpec("default", 10000.0, 16, 64), torch.device("cpu"))
    # decode at 9, a 5-token chunk at 3..7 after 3 cached positions, a decode at 2, a fresh 4-token prompt
    start, end = torch.tensor([9, 3, 2, 0]), torch.tensor([10, 8, 3, 4])
    inputs = StepInputs.of(tokens=torch.arange(11), start=start, end=end, sampled=torch.tensor([1, 1, 1, 1]),
                           context_slots=torch.arange(40).view(4, 10))
    _, meta, _ = step_tensors(inputs, rotary, {window}, torch.float32, torch.device("cpu"))
    assert [tokens.tolist() for tokens, _ in meta.parts] == [[0, 6], [1, 2, 3, 4, 5, 7, 8, 9, 10]]
    assert meta.parts[0][1].decode_only and meta.parts[1][1].query_index.shape == (2, 5)
    x = torch.randn(11, 64)
    outs = []
    for m in (meta, dataclasses.replace(meta, parts=None)):
        g = torch.Generator().manual_seed(1)
        k_cache, v_cache = torch.randn(40, 2, 16, generator=g), torch.randn(40, 2, 16, generator=g)
        outs.append(attention(x, k_cache, v_cache, m))
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-6, atol=1e-6)

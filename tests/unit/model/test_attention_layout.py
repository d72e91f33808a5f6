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

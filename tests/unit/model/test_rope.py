"""Every rotary variant against HF transformers 5 itself: inv_freq and attention scaling bit for bit (the same float32
ops), dynamic NTK per sequence length, longrope's short / long sets, and refusals of rotary keys the runtime would
not honour."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from backend.formats.checkpoint import TrtllmCheckpointConfig
from backend.formats.config_groups import LongRopeKeys
from backend.model.rope import RopeSpec, dynamic_inv_freq, longrope_inv_freq, longrope_scaling, static_inv_freq
from backend.model.decoder import signed_sin
from backend.model import rotary as rotary_module
from backend.model.rotary import RotaryEmbedding

HEAD, THETA = 16, 10000.0
SCALINGS = {
    "linear": {"factor": 2.0},
    "dynamic": {"factor": 2.0},
    "llama3": {"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    "yarn": {"factor": 4.0, "original_max_position_embeddings": 32},
    "yarn_mscale": {"factor": 4.0, "original_max_position_embeddings": 32, "mscale": 0.7, "mscale_all_dim": 0.5,
                    "beta_fast": 16, "beta_slow": 2},
}


def _hf(kind: str, params: dict, max_pos: int = 48):
    rope = {"rope_type": kind.split("_")[0], "rope_theta": THETA, **params}
    return AutoConfig.for_model("llama", hidden_size=64, num_attention_heads=4, head_dim=HEAD,
                                max_position_embeddings=max_pos, rope_parameters=rope)


def _ours(kind: str, params: dict, max_pos: int = 48, head: int = HEAD, **keys) -> RopeSpec:
    cfg = TrtllmCheckpointConfig(vocab_size=8, max_position_embeddings=max_pos, hidden_size=4 * head,
                                 num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4, head_size=head,
                                 intermediate_size=8,
                                 norm_epsilon=1e-5, rotary_base=THETA,
                                 rotary_scaling=None if kind in ("", "default") else {"type": kind.split("_")[0], **params},
                                 **keys)
    return RopeSpec.of(cfg)


@pytest.mark.parametrize("kind", sorted(SCALINGS))
def test_static_inv_freq_is_hf_bit_for_bit(kind):
    want, want_scaling = ROPE_INIT_FUNCTIONS[kind.split("_")[0]](_hf(kind, SCALINGS[kind]), "cpu")
    got, scaling = static_inv_freq(_ours(kind, SCALINGS[kind]))
    assert torch.equal(got, want) and scaling == want_scaling


def test_yarn_mixes_extrapolated_interpolated_and_ramped_frequencies():
    ratio = static_inv_freq(_ours("yarn", SCALINGS["yarn"]))[0] / static_inv_freq(_ours("default", {}))[0]
    assert ratio[0] == 1.0 and ratio[-1] == 0.25 and ((ratio > 0.25) & (ratio < 1)).any()


@pytest.mark.parametrize("seq_len", [49, 50, 64, 97, 300])
def test_dynamic_ntk_is_hf_bit_for_bit_per_length(seq_len):
    want, _ = ROPE_INIT_FUNCTIONS["dynamic"](_hf("dynamic", SCALINGS["dynamic"]), "cpu", seq_len=torch.tensor(seq_len))
    assert torch.equal(dynamic_inv_freq(_ours("dynamic", SCALINGS["dynamic"]), seq_len), want)


def test_dynamic_tokens_use_max_of_their_position_and_the_prompt():
    spec = _ours("dynamic", SCALINGS["dynamic"])
    rotary = RotaryEmbedding(spec, torch.device("cpu"))
    positions = torch.tensor([0, 10, 59, 60, 61])  # a 60-token prompt, then its first two generated tokens
    cos, _ = rotary.cos_sin(positions, torch.full((5,), 60), torch.full((5,), 62))
    # HF: the prompt's one forward has s = 60 for all its tokens; each generated token's own forward s = p + 1.
    for i, inv in enumerate(dynamic_inv_freq(spec, s) for s in (60, 60, 60, 61, 62)):
        freqs = positions[i].float() * inv
        assert torch.equal(cos[i], torch.cat((freqs, freqs)).cos()), i
    short = rotary.cos_sin(torch.tensor([3]), torch.tensor([20]), torch.tensor([20]))[0]
    base = static_inv_freq(_ours("default", {}))[0]
    assert torch.equal(short[0], torch.cat((3.0 * base, 3.0 * base)).cos())  # s <= max_positions: plain base


def test_longrope_sets_and_scaling_are_hf():
    short, long = [1.0, 1.1, 1.3, 1.6], [1.0, 2.0, 4.0, 8.0]
    hf = AutoConfig.for_model("phi3", hidden_size=64, num_attention_heads=4, max_position_embeddings=512,
                              original_max_position_embeddings=32, partial_rotary_factor=0.5,
                              rope_scaling={"type": "longrope", "short_factor": short, "long_factor": long})
    spec = _ours("", {}, max_pos=512, rotary_pct=0.5, position_embedding_type="long_rope",
                 architecture="Phi3ForCausalLM", hidden_act="swiglu", longrope=LongRopeKeys(32, short, long))
    want_short, want_scaling = ROPE_INIT_FUNCTIONS["longrope"](hf, "cpu")
    want_long, _ = ROPE_INIT_FUNCTIONS["longrope"](hf, "cpu", seq_len=33)
    assert torch.equal(longrope_inv_freq(spec, short), want_short)
    assert torch.equal(longrope_inv_freq(spec, long), want_long)
    assert longrope_scaling(spec) == want_scaling
    rotary = RotaryEmbedding(spec, torch.device("cpu"))
    cos_short, _ = rotary.cos_sin(torch.tensor([5]), torch.tensor([20]), torch.tensor([32]))
    cos_long, _ = rotary.cos_sin(torch.tensor([5]), torch.tensor([20]), torch.tensor([33]))  # the sequence's length
    assert torch.equal(cos_short[0], torch.cat((5.0 * want_short,) * 2).cos() * want_scaling)
    assert torch.equal(cos_long[0], torch.cat((5.0 * want_long,) * 2).cos() * want_scaling)


@pytest.mark.parametrize("kind", ["default", *sorted(SCALINGS)])
def test_cos_signed_sin_is_cos_sin_with_signed_sin_bit_for_bit(kind):
    """The decode step's one-multiply form against cos_sin() + decoder.signed_sin, yarn's scalings != 1 included,
    over positions on both sides of the original context and more tokens than one vector holds."""
    rotary = RotaryEmbedding(_ours(kind, SCALINGS.get(kind, {})), torch.device("cpu"))
    positions = torch.arange(0, 400, 7)
    lens = (positions + 1, positions + 1)
    cos, sin = rotary.cos_sin(positions, *lens)
    got_cos, got_sin = rotary.cos_signed_sin(positions, *lens)
    assert torch.equal(got_cos, cos) and torch.equal(got_sin, signed_sin(sin))
    if kind == "yarn_mscale":
        assert rotary.scaling != 1.0  # the multiply that carries the sign is not a multiply by 1


@pytest.mark.parametrize("scaling, message", [
    ({"type": "linear"}, r"missing keys \['factor'\]"),
    ({"type": "llama3", "factor": 8.0}, "missing keys"),
    ({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "attention_factor": 1.2},
     r"unsupported keys \['attention_factor'\]"),
    ({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "mscale": 0.7},
     "mscale 0.7 without mscale_all_dim"),
    ({"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "truncate": False}, "truncate false"),
    ({"type": "mrope", "factor": 2.0}, "rotary_scaling type 'mrope' is not supported"),
])
def test_unsupported_rotary_keys_are_refused(scaling, message):
    kind = scaling.pop("type")
    with pytest.raises(ValueError, match=message):
        _ours(kind, scaling)


@pytest.mark.parametrize("kind", ["default", "linear", "llama3", "yarn", "yarn_mscale"])
def test_the_static_table_gives_the_computed_rows_bit_for_bit(kind, monkeypatch):
    """cos / signed sin of a static rotary from its table (grown a chunk at a time as positions reach it) against
    the same operations on the step's positions, over steps that cross chunk edges, and cos_sin's HF form."""
    monkeypatch.setattr(rotary_module, "_TABLE_CHUNK", 256)
    monkeypatch.setattr(rotary_module, "_TABLE_MAX", 2048)
    spec = _ours(kind, SCALINGS.get(kind, {}), head=64)
    rotary = RotaryEmbedding(spec, torch.device("cpu"))
    g = torch.Generator().manual_seed(3)
    for top in (10, 255, 256, 700, 2047):
        positions = torch.randint(0, top + 1, (16,), generator=g)
        positions[0] = top
        lens = (positions + 1, positions + 1)
        got = rotary.cos_signed_sin(positions, *lens)
        assert rotary._cos_rows.shape[0] == (top // 256 + 1) * 256  # grown to cover them, a chunk at a time
        want = rotary._cos_signed_sin(positions, *lens)
        cos, sin = rotary.cos_sin(positions, *lens)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        assert torch.equal(got[0], cos) and torch.equal(got[1], signed_sin(sin))


def test_what_the_table_leaves_to_the_computation(monkeypatch):
    """Positions past its end, dynamic and longrope kinds (per-token frequencies), widths with a scalar tail."""
    monkeypatch.setattr(rotary_module, "_TABLE_MAX", 2048)
    rotary = RotaryEmbedding(_ours("default", {}, head=64), torch.device("cpu"))
    far = torch.tensor([5, 2048])
    assert not rotary._tabled(far) and rotary._cos_rows is None
    lens = (far + 1, far + 1)
    assert torch.equal(rotary.cos_signed_sin(far, *lens)[0], rotary._cos_signed_sin(far, *lens)[0])
    for kind, head in (("dynamic", 64), ("default", 16), ("default", 48)):
        rotary = RotaryEmbedding(_ours(kind, SCALINGS.get(kind, {}), head=head), torch.device("cpu"))
        assert not rotary._tabled(torch.tensor([3]))

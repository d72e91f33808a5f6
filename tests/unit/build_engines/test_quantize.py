"""build_engines/quantize: INT4 packing and round-to-nearest, INT8 and FP8 error bounds, the AWQ search never
worse than RTN (and better with outlier channels), the config.json block and tensors of every method exactly as
build_engines/shard.py expects (a quantized checkpoint shards), calibration statistics, and clear refusals."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from backend.formats.checkpoint import LM_HEAD, TrtllmCheckpointConfig, layer_prefix
from backend.formats.fp8 import E4M3_MAX, from_fp8, quantize_fp8
from backend.formats.int4 import dequantize, group_scales, pack, quantize_rtn, unpack
from backend.formats.int8 import dequantize_int8, quantize_int8
from build_engines.quantize import apply
from build_engines.quantize.awq import search_scale
from build_engines.quantize.calibration import calibrate
from build_engines.shard import shard_checkpoint
from tests.conftest import TINY_QUANT_GROUP as GROUP

CALIB_TOKENS = 1024


@pytest.fixture(scope="module")
def stats(tiny_ckpt_dir, tokenizer_dir):
    return calibrate(tiny_ckpt_dir, tokenizer_dir, max_tokens=CALIB_TOKENS, seq_len=256, progress=False)


def test_int4_pack_round_trips_every_value_and_puts_even_columns_low():
    q = torch.arange(-8, 8, dtype=torch.int8).repeat(3, 2)  # (3, 32): every INT4 value in both nibbles
    packed = pack(q)
    assert packed.shape == (3, 16) and packed.dtype == torch.int8
    assert torch.equal(unpack(packed), q)
    assert (packed[0, 0].item() & 0xFF) == ((-7 & 0xF) << 4) | (-8 & 0xF)  # columns 0 (-8) low, 1 (-7) high
    with pytest.raises(ValueError, match="even number of columns"):
        pack(torch.zeros(2, 3, dtype=torch.int8))


def test_int4_rtn_error_is_at_most_half_a_step_per_group():
    w = torch.randn(48, 128) * torch.linspace(0.1, 3, 128)  # groups of very different ranges
    scales = group_scales(w, GROUP)
    q = quantize_rtn(w, GROUP, scales)
    assert q.min() >= -8 and q.max() <= 7
    err = (dequantize(q, scales, GROUP) - w).abs().view(48, -1, GROUP)
    assert (err <= scales[..., None] / 2 + 1e-6).all()
    assert torch.equal(w.view(48, -1, GROUP).abs().amax(-1) / 7, scales)  # amax / 7: the largest value is exact


def test_int8_and_fp8_error_bounds():
    w = torch.randn(64, 96) * 0.05
    q, scale = quantize_int8(w)
    assert q.dtype == torch.int8 and scale.shape == (64,)
    assert ((dequantize_int8(q, scale) - w).abs() <= scale[:, None] / 2 + 1e-7).all()
    f8, fscale = quantize_fp8(w)
    assert f8.dtype == torch.float8_e4m3fn and fscale.shape == (1,)
    assert torch.allclose(fscale, w.abs().max() / E4M3_MAX)  # ModelOpt's amax / 448
    # E4M3 keeps 3 mantissa bits: relative error <= 2^-4, plus half the smallest subnormal (2^-10) times scale.
    assert ((from_fp8(f8, fscale) - w).abs() <= w.abs() / 16 + fscale * 2 ** -10).all()


def test_awq_search_never_worse_than_rtn_and_better_with_outlier_channels():
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(64, 128, generator=gen)
    x = torch.randn(256, 128, generator=gen)
    x[:, :4] *= 30  # a few salient input channels, as LLM activations have
    found = search_scale(w, x, x.abs().mean(0), GROUP)
    assert found.error <= found.rtn_error
    assert found.alpha > 0 and found.error < 0.7 * found.rtn_error
    assert found.scales.shape == (128,) and found.scales[:4].min() > found.scales[4:].max()


def test_quant_config_blocks():
    assert apply.quant_config("int4_awq", "fp8", 64) == apply.QuantConfig(
        quant_algo="W4A16_AWQ", kv_cache_quant_algo="FP8", group_size=64, pre_quant_scale=True,
        exclude_modules=("lm_head",))
    assert apply.quant_config("int4_rtn").pre_quant_scale is False
    assert apply.quant_config("fp8").quant_algo == "FP8" and apply.quant_config("int8_wo").quant_algo == "W8A16"
    assert apply.quant_config("none", "fp8").quant_algo is None
    for method in apply.METHODS:
        assert apply.method_of(apply.quant_config(method)) == method


@pytest.mark.parametrize("call, message", [
    (lambda: apply.quant_config("int3"), "unknown quantization method 'int3'"),
    (lambda: apply.quant_config("fp8", "int8"), "unknown KV cache quantization 'int8'"),
    (lambda: apply.quant_config("int4_awq", "none", 33), "group_size must be an even number"),
])
def test_quant_config_refuses_bad_input(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# What every decoder linear carries, by method (build_engines/shard.py's LINEAR_TENSORS), with shape functions.
EXPECTED = {
    "int8_wo": {"weight": (torch.int8, lambda o, i: (o, i)), "per_channel_scale": (torch.float32, lambda o, i: (o,))},
    "fp8": {"weight": (torch.float8_e4m3fn, lambda o, i: (o, i)),
            "weights_scaling_factor": (torch.float32, lambda o, i: (1,)),
            "activation_scaling_factor": (torch.float32, lambda o, i: (1,))},
    "int4_rtn": {"weight": (torch.int8, lambda o, i: (o, i // 2)),
                 "weights_scaling_factor": (torch.float32, lambda o, i: (o, i // GROUP))},
    "int4_awq": {"weight": (torch.int8, lambda o, i: (o, i // 2)),
                 "weights_scaling_factor": (torch.float32, lambda o, i: (o, i // GROUP)),
                 "prequant_scaling_factor": (torch.float32, lambda o, i: (i,))},
}


@pytest.mark.parametrize("method", sorted(EXPECTED))
def test_checkpoint_tensors_are_what_shard_expects(method, quantized_tiny, tiny_ckpt_dir, tmp_path):
    out = quantized_tiny(method, "fp8")
    cfg = TrtllmCheckpointConfig.from_json(out)
    assert cfg.quantization == apply.quant_config(method, "fp8", GROUP)
    raw = json.loads((out / "config.json").read_text())
    assert raw["quantization"]["exclude_modules"] == ["lm_head"]
    float_weights = load_file(str(tiny_ckpt_dir / "rank0.safetensors"))
    weights = load_file(str(out / "rank0.safetensors"))
    assert torch.equal(weights[LM_HEAD], float_weights[LM_HEAD])  # excluded: stays float
    for i in range(cfg.num_hidden_layers):
        p = layer_prefix(i)
        kv = weights.pop(f"{p}attention.kv_cache_scaling_factor")
        assert kv.shape == (1,) and kv.dtype == torch.float32 and kv.item() > 0
        for linear in apply.LINEARS:
            out_f, in_f = float_weights[f"{p}{linear}.weight"].shape
            for kind, (dtype, shape) in EXPECTED[method].items():
                t = weights.pop(f"{p}{linear}.{kind}")
                assert (t.dtype, tuple(t.shape)) == (dtype, shape(out_f, in_f)), f"{p}{linear}.{kind}"
    assert set(weights) == {k for k in float_weights if not k.startswith("transformer.layers.") or "layernorm" in k}
    if method == "int4_awq":  # fc and gate read one input: one scale, multiplied once at run time
        q = load_file(str(out / "rank0.safetensors"))
        assert torch.equal(q["transformer.layers.0.mlp.fc.prequant_scaling_factor"],
                           q["transformer.layers.0.mlp.gate.prequant_scaling_factor"])
    sharded = shard_checkpoint(out, tmp_path / "s", 2, 2)  # shard.py accepts every tensor and shape
    assert len(list(sharded.glob("rank*.safetensors"))) == 4


def test_calibration_statistics(stats, tiny_ckpt_dir):
    cfg = TrtllmCheckpointConfig.from_json(tiny_ckpt_dir)
    assert stats.num_tokens == CALIB_TOKENS and len(stats.kv_amax) == cfg.num_hidden_layers
    fc, gate = stats.linears["transformer.layers.1.mlp.fc"], stats.linears["transformer.layers.1.mlp.gate"]
    assert fc is gate
    proj = stats.linears["transformer.layers.1.mlp.proj"]
    assert proj.channel_mean_abs.shape == (cfg.intermediate_size,)
    assert 256 <= proj.samples.shape[0] <= 512 + 4 and proj.samples.shape[1] == cfg.intermediate_size
    assert proj.amax >= proj.samples.abs().max() and proj.amax >= proj.channel_mean_abs.max() > 0
    assert all(k > 0 and v > 0 for k, v in stats.kv_amax)


def test_refusals(tiny_ckpt_dir, tokenizer_dir, quantized_tiny, stats, tmp_path):
    weights = load_file(str(tiny_ckpt_dir / "rank0.safetensors"))
    with pytest.raises(ValueError, match="group_size 48 does not divide in_features 64"):
        apply.quantize_weights(weights, 2, apply.quant_config("int4_rtn", "none", 48), None, torch.float32)
    with pytest.raises(ValueError, match="need activation statistics: run calibrate"):
        apply.quantize_weights(weights, 2, apply.quant_config("fp8"), None, torch.float32)
    with pytest.raises(ValueError, match="need activation statistics"):
        apply.quantize_weights(weights, 2, apply.quant_config("int8_wo", "fp8"), None, torch.float32)
    with pytest.raises(ValueError, match="already quantized"):
        apply.quantize_checkpoint(quantized_tiny("int8_wo"), tmp_path / "x", "int4_rtn", group_size=GROUP)
    bare = tmp_path / "bare"  # a checkpoint without the tokenizer files convert.py copies beside the weights
    bare.mkdir()
    for name in ("config.json", "rank0.safetensors"):
        shutil.copyfile(tiny_ckpt_dir / name, bare / name)
    with pytest.raises(ValueError, match="no tokenizer in .*pass tokenizer_dir"):
        apply.quantize_checkpoint(bare, tmp_path / "x", "fp8")
    with pytest.raises(FileNotFoundError, match="text file .*nope.txt not found"):
        apply.quantize_checkpoint(tiny_ckpt_dir, tmp_path / "x", "int4_awq", group_size=GROUP,
                                  tokenizer_dir=tokenizer_dir, calib_text=tmp_path / "nope.txt")
    assert not (tmp_path / "x").exists()  # nothing half-written


def test_calibration_from_a_text_file(tiny_ckpt_dir, tokenizer_dir, tmp_path):
    text = tmp_path / "calib.txt"
    text.write_text("def f(x):\n    return x + 1\n" * 40)
    got = calibrate(tiny_ckpt_dir, tokenizer_dir, calib_text=text, max_tokens=10_000, seq_len=64, progress=False)
    assert 0 < got.num_tokens < 10_000  # the whole (short) file
    text.write_text("")
    with pytest.raises(ValueError, match="has 0 tokens"):
        calibrate(tiny_ckpt_dir, tokenizer_dir, calib_text=text, progress=False)

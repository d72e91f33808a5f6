"""The torch runtime on quantized checkpoints (backend/model/quantized_linear.py, backend/model/quantized_kv.py): a quantized
model computes what the float model with the dequantized weights computes (logits and the engine's greedy tokens),
on torch's CPU INT4 / INT8 kernels for decode-sized inputs and dequantized otherwise; FP8 linears quantize their inputs;
FP8 KV pools store float8 and read back within E4M3's precision; sharded quantized checkpoints (FP8 + FP8 KV,
AWQ) give the unsharded engine's tokens; unsupported quantization is refused."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.engine.sequence import Request
from backend.formats.checkpoint import TrtllmCheckpointConfig
from backend.formats.fp8 import fake_quantize_fp8, quantize_fp8, scale_for, to_fp8
from backend.formats.int4 import dequantize, quantize_int4, unpack
from backend.formats.int8 import dequantize_int8, quantize_int8
from backend.model.config import kv_bytes_per_token, load_model_config
from backend.model.loader import load_model
from backend.model.quantized_kv import Fp8KVPool
from backend.model.quantized_linear import KERNEL_MAX_ROWS, Fp8Linear, Int4Linear, W8A16Linear
from backend.model.scoring import window_logits
from build_engines.quantize import apply
from build_engines.shard import shard_checkpoint
from tests.conftest import TEST_ENGINE_LIMITS, random_prompts, run_to_end

CPU = torch.device("cpu")


def dequantized_checkpoint(qdir: Path, out: Path) -> Path:
    """The float checkpoint computing what the weight-only quantized qdir computes: W = dequant(q) (times AWQ's
    prequant scale, which the quantized linear applies to its input)."""
    raw = json.loads((qdir / "config.json").read_text())
    group = raw["quantization"]["group_size"]
    raw["quantization"] = {}
    q = load_file(str(qdir / "rank0.safetensors"))
    weights = {k: v for k, v in q.items() if k.endswith(".weight") and v.is_floating_point()}
    for name in {k.rsplit(".", 1)[0] for k in q if k.startswith("transformer.layers.") and "layernorm" not in k}:
        w = q[f"{name}.weight"]
        if f"{name}.per_channel_scale" in q:
            w = dequantize_int8(w, q[f"{name}.per_channel_scale"])
        else:
            w = dequantize(unpack(w), q[f"{name}.weights_scaling_factor"], group)
            if f"{name}.prequant_scaling_factor" in q:
                w = w * q[f"{name}.prequant_scaling_factor"][None, :]
        weights[f"{name}.weight"] = w
    out.mkdir()
    (out / "config.json").write_text(json.dumps(raw))
    save_file({k: v.contiguous() for k, v in weights.items()}, str(out / "rank0.safetensors"))
    return out


@pytest.mark.parametrize("method", ["int8_wo", "int4_rtn", "int4_awq"])
def test_quantized_model_computes_its_dequantized_weights(method, quantized_tiny, tmp_path, tokenizer_dir):
    qdir = quantized_tiny(method)
    model = load_model(qdir, CPU)
    kinds = {type(m) for m in model.modules()}
    assert (W8A16Linear if method == "int8_wo" else Int4Linear) in kinds and torch.nn.Linear in kinds  # lm_head
    if method != "int8_wo":  # the tiny model's widths suit torch's CPU INT4 kernel (out % 16 == 0, group 32)
        assert all(m._packed is not None for m in model.modules() if isinstance(m, Int4Linear))
    reference = load_model(dequantized_checkpoint(qdir, tmp_path / "deq"), CPU)
    windows = torch.tensor(random_prompts([48, 48], 8192, seed=1))
    got, want = window_logits(model, windows), window_logits(reference, windows)
    assert (got - want).abs().max() < 1e-3 * want.abs().max()


def greedy(ckpt: Path, prompts: list[tuple[int, ...]], max_tokens: int) -> dict[str, list[int]]:
    """The engine's greedy tokens per request (chunked prefill: 16 tokens a step)."""
    engine = LLMEngine(ckpt, EngineConfig(**{**TEST_ENGINE_LIMITS, "max_num_tokens": 16}))
    try:
        outs = run_to_end(engine, [Request(f"r{i}", p, SamplingParams(max_tokens=max_tokens))
                                   for i, p in enumerate(prompts)])
    finally:
        engine.close()
    return {rid: [t for o in seq for t in o.new_token_ids] for rid, seq in outs.items()}


def test_engine_greedy_tokens_on_awq_equal_the_dequantized_reference(quantized_tiny, tmp_path):
    qdir = quantized_tiny("int4_awq")
    prompts = random_prompts([5, 30, 17], 8192, seed=2)
    assert greedy(qdir, prompts, 12) == greedy(dequantized_checkpoint(qdir, tmp_path / "deq"), prompts, 12)


@pytest.mark.parametrize("out_features, group", [(48, 32), (40, 32), (48, 16)], ids=["kernel", "odd-out", "group16"])
def test_int4_kernel_and_dequantized_paths_agree(out_features, group):
    """Decode-sized inputs (<= KERNEL_MAX_ROWS rows) take torch's INT4 kernel where it applies, larger ones and
    shapes it does not take the dequantized weight: the same numbers either way."""
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(out_features, 64, generator=gen)
    q = quantize_int4(w, group)
    linear = Int4Linear(64, out_features, torch.float32, apply.quant_config("int4_rtn", "none", group))
    linear.load_state_dict({"weight": q.packed, "weights_scaling_factor": q.scales}, assign=True)
    linear.prepare()
    assert (linear._packed is not None) == (out_features % 16 == 0 and group >= 32)
    deq = dequantize(unpack(q.packed), q.scales, group)
    for rows in (1, KERNEL_MAX_ROWS, KERNEL_MAX_ROWS + 5):
        x = torch.randn(rows, 64, generator=gen)
        assert torch.allclose(linear(x), x @ deq.t(), atol=1e-4, rtol=1e-4)
    assert linear(x[None]).shape == (1, KERNEL_MAX_ROWS + 5, out_features)  # any leading dims


def test_int8_kernel_and_dequantized_paths_agree():
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(48, 64, generator=gen)
    q, scale = quantize_int8(w)
    linear = W8A16Linear(64, 48, torch.float32, apply.quant_config("int8_wo"))
    linear.load_state_dict({"weight": q, "per_channel_scale": scale}, assign=True)
    linear.prepare()
    for rows in (1, KERNEL_MAX_ROWS + 3):
        x = torch.randn(rows, 64, generator=gen)
        assert torch.allclose(linear(x), x @ dequantize_int8(q, scale).t(), atol=1e-4, rtol=1e-4)


def test_fp8_linear_quantizes_weight_and_input():
    gen = torch.Generator().manual_seed(0)
    w, x = torch.randn(32, 64, generator=gen) * 0.1, torch.randn(7, 64, generator=gen)
    q, scale = quantize_fp8(w)
    act = scale_for(x.abs().max())
    linear = Fp8Linear(64, 32, torch.float32, apply.quant_config("fp8"))
    linear.load_state_dict({"weight": q, "weights_scaling_factor": scale, "activation_scaling_factor": act},
                           assign=True)
    linear.prepare()
    want = fake_quantize_fp8(x, act) @ (q.float() * scale).t()
    assert torch.allclose(linear(x), want, atol=1e-6)
    assert (linear(x) - x @ w.t()).abs().max() < 0.1 * (x @ w.t()).abs().max()  # FP8's few-percent error


def test_fp8_kv_pool_round_trip():
    scale = scale_for(4.0)
    pool = Fp8KVPool((10, 2, 8), scale, torch.float32, CPU)
    kv = torch.randn(3, 2, 8).clamp(-4, 4)
    slots = torch.tensor([7, 0, 3])
    pool.index_copy_(0, slots, kv)  # the write attention uses
    assert pool.data.dtype == torch.float8_e4m3fn
    back = pool[torch.tensor([[7, 0, 3]])][0]  # (1, 3, ...) gather, as attention reads its context slots
    assert back.dtype == torch.float32
    assert ((back - kv).abs() <= kv.abs() / 16 + scale * 2 ** -10).all()
    assert pool[torch.tensor([1])].abs().max() == 0  # untouched slots read zero
    # the byte copy (no float8 index_copy_ on CPU) stores exactly the float8 conversion of kv / scale
    assert torch.equal(pool.data.view(torch.uint8)[slots], to_fp8(kv, scale).view(torch.uint8))


def test_fp8_kv_cache_stores_one_byte_per_value_and_runs(quantized_tiny, tiny_ckpt_dir):
    qdir = quantized_tiny("fp8", "fp8")
    float_cfg, cfg = load_model_config(tiny_ckpt_dir), load_model_config(qdir)
    assert kv_bytes_per_token(cfg) * 4 == kv_bytes_per_token(float_cfg)  # 1 byte instead of float32's 4
    engine = LLMEngine(qdir, EngineConfig(**TEST_ENGINE_LIMITS))
    assert all(isinstance(k, Fp8KVPool) for k, _ in engine.runner.kv.layers)
    outs = run_to_end(engine, [Request("a", tuple(range(1, 20)), SamplingParams(max_tokens=6))])
    assert sum(len(o.new_token_ids) for o in outs["a"]) == 6


@pytest.mark.parametrize("method, kv_cache", [("fp8", "fp8"), ("int4_awq", "none")])
def test_sharded_quantized_engine_matches_unsharded(method, kv_cache, quantized_tiny, tmp_path):
    """tp 2: column-parallel shares of scales, row-parallel shares of AWQ's prequant scale and INT4 groups,
    replicated FP8 and KV scales."""
    qdir = quantized_tiny(method, kv_cache)
    prompts = random_prompts([9, 23], 8192, seed=3)
    assert greedy(shard_checkpoint(qdir, tmp_path / "tp2", 2, 1), prompts, 8) == greedy(qdir, prompts, 8)


def test_runtime_refuses_unsupported_quantization(tiny_ckpt_dir, tmp_path):
    raw = json.loads((tiny_ckpt_dir / "config.json").read_text())
    raw["quantization"] = {"quant_algo": None, "kv_cache_quant_algo": "INT8"}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="kv_cache_quant_algo one of \\(None, 'FP8'\\)"):
        load_model_config(tmp_path)
    assert TrtllmCheckpointConfig.from_json(tmp_path).quantization.kv_cache_quant_algo == "INT8"  # valid TRT-LLM

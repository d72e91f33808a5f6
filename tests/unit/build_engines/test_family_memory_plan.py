"""Memory plans of released checkpoints' configs (build_engines/real_configs.py): weights on the meta device, per
quantization and TP size, through the converter and the planner a build runs; refusals say what to change."""
from __future__ import annotations

import re

import pytest

from build_engines.real_configs import REAL_CONFIGS, plan_row, real_checkpoint_config
from build_engines.spec import Limits

GIB = 2**30


@pytest.mark.parametrize("model, kv_kib, bf16_gib", [
    ("Llama-3.1-8B", 128, 14.96),  # 8.03 B parameters
    ("Mistral-7B-v0.3", 128, 13.50),
    ("Qwen2.5-7B", 56, 14.19),  # 4 KV heads of 128 over 28 layers
    ("Gemma-2-9B", 336, 18.92),  # 9.24 B + the tied lm_head written as its own copy (1.71 GiB)
])
def test_real_sizes_at_each_quantization_and_tp(model, kv_kib, bf16_gib):
    bf16 = plan_row(model, "bfloat16", "none", "none", 1, 80).plan
    assert bf16.ranks[0].weight_bytes / GIB == pytest.approx(bf16_gib, abs=0.01)
    assert bf16.ranks[0].kv_bytes_per_token == kv_kib * 1024
    tp2 = plan_row(model, "bfloat16", "none", "none", 2, 80).plan
    assert tp2.ranks[0].kv_bytes_per_token == kv_kib * 512 and tp2.kv_tokens > bf16.kv_tokens
    int4 = plan_row(model, "int4_awq", "int4_awq", "none", 1, 24).plan
    fp8 = plan_row(model, "fp8", "fp8", "fp8", 1, 24).plan
    assert int4.ranks[0].weight_bytes < fp8.ranks[0].weight_bytes < bf16.ranks[0].weight_bytes
    assert fp8.ranks[0].kv_bytes_per_token == kv_kib * 512  # one byte a value


def test_a_sliding_window_everywhere_caps_what_a_sequence_holds():
    limits = Limits(max_batch_size=64, max_input_len=16384, max_seq_len=32768, max_num_tokens=2048,
                    tokens_per_block=64)
    windowed = plan_row("Mistral-7B-v0.1", "bf16", "none", "none", 1, 24, limits).plan
    full = plan_row("Mistral-7B-v0.3", "bf16", "none", "none", 1, 24, limits).plan
    assert windowed.sequence_tokens == (-(-(4096 - 1 + 2048) // 64) + 1) * 64 == 6208
    assert full.sequence_tokens == 32768
    assert windowed.kv_tokens // windowed.sequence_tokens > 4 * (full.kv_tokens // full.sequence_tokens)


@pytest.mark.parametrize("model, quant, tp, memory, message", [
    ("Gemma-2-9B", "none", 1, 16, r"weights take 19377\.\d+ MiB, more than the device's 16 GiB: raise tp_size or "
                                  r"pp_size, or quantize"),
    ("Llama-3.1-8B", "none", 1, 16, r"less than one max_seq_len \(8192\) sequence: lower max_seq_len .* quantize"),
    ("Qwen2.5-7B", "none", 8, 80, r"tp_size 8 cannot split 28 attention heads / 4 KV heads evenly; tp sizes that "
                                  r"work: \[1, 2, 4, 28\]"),
])
def test_refusals_say_what_to_change(model, quant, tp, memory, message):
    row = plan_row(model, quant, quant, "none", tp, memory)
    assert row.plan is None and row.refusal is not None
    assert re.search(message, row.refusal), row.refusal


def test_real_configs_convert_with_their_families_keys():
    gemma = real_checkpoint_config("Gemma-2-9B")
    assert (gemma.architecture, gemma.gemma2.query_pre_attn_scalar, gemma.layer_types[:2]) == (
        "Gemma2ForCausalLM", 256, ("sliding_attention", "full_attention"))
    llama = real_checkpoint_config("Llama-3.1-8B")
    assert llama.rotary_scaling["type"] == "llama3" and llama.eos_token_id == 128001
    assert real_checkpoint_config("Qwen2.5-7B").layer_types is None  # use_sliding_window false: no window
    assert set(REAL_CONFIGS) >= {"Llama-3.1-8B", "Mistral-7B-v0.3", "Qwen2.5-7B", "Gemma-2-9B"}


@pytest.mark.parametrize("model", ["Mistral-7B-v0.1", "Gemma-2-9B"])
def test_pipeline_stages_keep_their_layers_windows(model):
    from build_engines.plan import plan_memory
    from build_engines.spec import BuildSpec, MemoryBudget

    spec = BuildSpec(name="p", source=model, pp_size=2, memory=MemoryBudget(device_memory_gib=24),
                     limits=Limits(max_batch_size=8, max_input_len=4096, max_seq_len=8192, max_num_tokens=2048))
    plan = plan_memory(real_checkpoint_config(model), spec)
    assert [r.layers for r in plan.ranks] == ([16, 16] if model.startswith("Mistral") else [21, 21])
    assert plan.ranks[0].kv_bytes_per_token * 2 == plan_row(model, "bf16", "none", "none", 1, 80).plan.ranks[
        0].kv_bytes_per_token

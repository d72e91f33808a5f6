"""Every family fixture (build_engines/family_fixtures.py) in the engine, against HF transformers greedy in float32,
token for token: prompts longer than the sliding window, longer than (or crossing, while generating) longrope's
original length and dynamic NTK's max_position_embeddings; with chunked prefill, a second pass served from the
prefix cache, and (for the stateful ropes and the sliding window) preemption under KV pressure."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.engine.sequence import Request
from backend.model.loader import load_model
from backend.model.scoring import window_logits
from tests.conftest import hf_generate, random_prompts

# fixture -> (prompt lengths, new tokens). Windows are 16 (Phi-3 mini-4k: 31); longrope's original length is 32;
# dynamic NTK's max_position_embeddings is 48.
CASES = {
    "llama2": ([40, 12], 16),
    "llama2_linear": ([40, 12], 16),
    "llama_dynamic": ([30, 60, 12], 24),  # 30 grows past 48 while generating; 60 starts past it
    "llama3": ([70, 12], 16),  # past the llama3 original length (64)
    "mistral": ([40, 12], 24),
    "qwen2": ([40, 12], 16),
    "qwen2_swa": ([40, 12], 24),
    "qwen2_yarn": ([40, 12], 16),
    "qwen3": ([40, 12], 16),
    "gemma2": ([40, 12], 24),
    "phi3_4k": ([40, 12], 20),  # total <= max_position_embeddings (64)
    "phi3_128k": ([28, 40, 12], 12),  # 28 crosses 32 while generating (HF re-prefills there), 40 starts long
    "phi3_partial": ([28, 40, 12], 12),
}
STATEFUL = ("llama_dynamic", "phi3_128k", "phi3_partial", "gemma2")


def _limits(name: str, **overrides) -> EngineConfig:
    seq = 64 if name == "phi3_4k" else 96  # phi3_4k: max_position_embeddings 64
    return EngineConfig(**{**dict(max_batch_size=4, max_num_tokens=16, max_input_len=seq - 24, max_seq_len=seq,
                                  tokens_per_block=8, device="cpu"), **overrides})


def _requests(prompts, n, tag):
    return [Request(f"{tag}{i}", p, SamplingParams(max_tokens=n)) for i, p in enumerate(prompts)]


def _expected(family_checkpoint, name):
    lengths, n = CASES[name]
    prompts = random_prompts(lengths, 8192, seed=len(name))
    hf_dir, _ = family_checkpoint(name)
    return prompts, n, [hf_generate(hf_dir, p, n) for p in prompts]


@pytest.mark.parametrize("name", sorted(CASES))
def test_greedy_equals_hf_with_chunked_prefill_and_prefix_reuse(family_checkpoint, name):
    prompts, n, want = _expected(family_checkpoint, name)
    engine = LLMEngine(family_checkpoint(name)[1], _limits(name))
    first = engine.generate(_requests(prompts, n, "a"))
    second = engine.generate(_requests(prompts, n, "b"))  # the same prompts again: their full blocks are cached
    assert [first[f"a{i}"] for i in range(len(prompts))] == want
    assert [second[f"b{i}"] for i in range(len(prompts))] == want
    assert engine.blocks.prefix_hits > 0
    assert engine.blocks.num_free_blocks == engine.blocks.num_blocks


@pytest.mark.parametrize("name", STATEFUL)
def test_greedy_equals_hf_under_preemption(family_checkpoint, name):
    """max_utilization over a KV cache too small for every sequence at once: sequences are preempted and recomputed
    (dynamic NTK: each token keeps its own base; longrope: a recompute after the crossing is all long)."""
    prompts, n, want = _expected(family_checkpoint, name)
    longest = max(map(len, prompts)) + n
    engine = LLMEngine(family_checkpoint(name)[1], _limits(
        name, max_num_tokens=96, max_input_len=longest - n, max_seq_len=longest, policy="max_utilization",
        max_tokens_in_paged_kv_cache=-(-longest // 8) * 8 + 8, enable_kv_cache_reuse=False))
    got = engine.generate(_requests(prompts, n, "p"))
    assert [got[f"p{i}"] for i in range(len(prompts))] == want
    assert engine.scheduler.num_preempted > 0


@pytest.mark.parametrize("name", ["mistral", "qwen2_swa"])
def test_sliding_window_blocks_are_released(family_checkpoint, name):
    """Mistral slides on every layer: blocks before the window go back to the pool, so both sequences run at once
    in a cache smaller than their tokens, without preemption. qwen2_swa's first layers are full: nothing is
    released, and the same cache must preempt. Both equal HF."""
    prompts, n, want = _expected(family_checkpoint, name)
    engine = LLMEngine(family_checkpoint(name)[1], _limits(
        name, max_num_tokens=16, max_input_len=40, max_seq_len=64, policy="max_utilization",
        max_tokens_in_paged_kv_cache=80, enable_kv_cache_reuse=True))
    assert engine.blocks.window == (16 if name == "mistral" else None)
    for r in _requests(prompts, n, "w"):
        engine.add_request(r)
    got = {f"w{i}": [] for i in range(len(prompts))}
    most_held = 0
    while engine.has_work():
        for out in engine.step():
            got[out.request_id] += out.new_token_ids
        held = [sum(b is not None for b in s.block_table) for s in engine.scheduler.running]
        most_held = max([most_held, *held])
    assert [got[f"w{i}"] for i in range(len(prompts))] == want
    assert sum(len(p) + n for p in prompts) > engine.blocks.num_blocks * 8
    if name == "mistral":
        assert engine.scheduler.num_preempted == 0
        assert most_held <= engine.blocks.max_live_blocks(64)  # (16 - 1 + 16) / 8 rounded up, + 1 = 5
    else:
        assert engine.scheduler.num_preempted > 0
    assert engine.blocks.num_free_blocks == engine.blocks.num_blocks


@torch.no_grad()
def test_gemma2_soft_caps_are_applied(family_checkpoint):
    """With caps of 1.0 both bind everywhere: logits equal HF's capped ones, far from the uncapped model's."""
    hf_dir, ckpt = family_checkpoint("gemma2_capped")
    ids = torch.tensor([random_prompts([40], 8192, seed=9)[0]])
    hf = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager").eval()
    want = hf(ids).logits
    ours = window_logits(load_model(ckpt, torch.device("cpu")), ids)
    torch.testing.assert_close(ours, want, rtol=0, atol=2e-6)
    assert want.abs().max() <= 1.0
    hf.config.final_logit_softcapping = hf.config.attn_logit_softcapping = None
    assert (hf(ids).logits - want).abs().max() > 0.5


@pytest.mark.parametrize("name", ["llama3", "phi3_4k", "gemma2"])  # plain gated, fused [up | gate], gelu + sandwich
def test_greedy_equals_hf_with_the_mlp_in_row_chunks(family_checkpoint, monkeypatch, name):
    """Whole-prompt prefill steps whose MLP runs in 32-row chunks (decoder.MLP_CHUNK_BYTES made small: a long
    prompt's chunks at the real size, on these small fixtures)."""
    from backend.model import decoder

    prompts, n, want = _expected(family_checkpoint, name)
    engine = LLMEngine(family_checkpoint(name)[1], _limits(name, max_num_tokens=128, enable_kv_cache_reuse=False))
    intermediate = engine.runner.model.transformer.layers[0].mlp.proj.in_features
    monkeypatch.setattr(decoder, "MLP_CHUNK_BYTES", 32 * 2 * intermediate * 4)
    got = engine.generate(_requests(prompts, n, "c"))
    assert [got[f"c{i}"] for i in range(len(prompts))] == want

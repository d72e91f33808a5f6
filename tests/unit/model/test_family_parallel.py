"""TP2 and PP2 shardings of every family serve exactly the single rank's greedy tokens (worker processes over gloo):
fused qkv and gate/up split half by half, q/k/v biases split with their rows, q/k norms replicated, Gemma 2's
parallel embedding and soft-caps, sliding windows, longrope's re-prefill at the crossing on every rank."""
from __future__ import annotations

import json

import pytest

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.engine.sequence import Request
from build_engines.shard import shard_checkpoint
from tests.conftest import random_prompts

FAMILIES = ["llama3", "llama_dynamic", "mistral", "qwen2", "qwen3", "gemma2", "phi3_128k"]
LIMITS = dict(max_batch_size=4, max_num_tokens=16, max_input_len=56, max_seq_len=72, tokens_per_block=8, device="cpu")


def _generate(ckpt, prompts) -> dict[str, list[int]]:
    engine = LLMEngine(ckpt, EngineConfig(**LIMITS))
    try:
        return engine.generate([Request(f"r{i}", p, SamplingParams(max_tokens=16)) for i, p in enumerate(prompts)])
    finally:
        engine.close()


@pytest.fixture(scope="module")
def single_rank(family_checkpoint):
    cache = {}

    def get(name):
        if name not in cache:
            prompts = random_prompts([28, 52, 9], 8192, seed=11)  # 28 + 16 crosses longrope's 32; 52 > windows
            cache[name] = prompts, _generate(family_checkpoint(name)[1], prompts)
        return cache[name]

    return get


@pytest.mark.parametrize("tp, pp", [(2, 1), (1, 2)], ids=["tp2", "pp2"])
@pytest.mark.parametrize("name", FAMILIES)
def test_sharded_family_equals_single_rank(family_checkpoint, single_rank, tmp_path, name, tp, pp):
    prompts, want = single_rank(name)
    sharded = shard_checkpoint(family_checkpoint(name)[1], tmp_path / "s", tp, pp)
    config = json.loads((sharded / "config.json").read_text())
    assert config["use_parallel_embedding"] == (name == "gemma2" and tp > 1)  # TRT-LLM's rule for Gemma
    assert _generate(sharded, prompts) == want

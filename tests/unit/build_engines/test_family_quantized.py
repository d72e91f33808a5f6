"""INT4-AWQ, FP8 (with an FP8 KV cache) and INT8 weight-only builds of every family, scored against the float build
on held-out text, and quantized TP2 shardings served equal to their single rank.

Random-init models have meaningless perplexity, so the bound is on how far the quantized model's next-token
distribution is from the float one's over the same text: the mean KL(float || quantized) per token, and the
perplexity ratio. Measured on the tiny fixtures (group 32, 512 calibration tokens, 4 x 64 held-out tokens):
KL 0.029-0.054 for INT4-AWQ, 0.004-0.010 for FP8, <= 0.0002 for INT8; perplexity ratios 0.948-1.032, 0.987-1.010,
0.999-1.001. The bounds below sit about twice above those, and a broken kernel (the same build with its weight
scales off by 1.5x, checked here for every family) lands above them (measured KL 0.12-0.30).
"""
from __future__ import annotations

import math
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.engine.sequence import Request
from backend.model.loader import load_model
from backend.model.scoring import window_logits
from build_engines.quantize.apply import quantize_checkpoint
from build_engines.quantize.evaluate import evaluation_tokens
from build_engines.shard import shard_checkpoint
from tests.conftest import random_prompts

FAMILIES = ["llama3", "mistral", "qwen2", "qwen3", "gemma2", "phi3_128k"]
# method -> (kv cache, KL bound, |ln perplexity ratio| bound)
BOUNDS = {"int4_awq": ("none", 0.10, 0.10), "fp8": ("fp8", 0.03, 0.03), "int8_wo": ("none", 0.005, 0.01)}


def _log_probs(ckpt, windows: torch.Tensor) -> torch.Tensor:
    return window_logits(load_model(ckpt, torch.device("cpu")), windows)[:, :-1].log_softmax(-1)


def _divergence(ref: torch.Tensor, got: torch.Tensor, targets: torch.Tensor) -> tuple[float, float]:
    """(mean KL(ref || got) per token, ln(perplexity got / perplexity ref))."""
    kl = (ref.exp() * (ref - got)).sum(-1).mean().item()
    nll = [-lp.gather(-1, targets[..., None]).mean().item() for lp in (ref, got)]
    return kl, nll[1] - nll[0]


@pytest.fixture(scope="module")
def quantized(family_checkpoint, tmp_path_factory):
    root, built = tmp_path_factory.mktemp("family-quant"), {}

    def get(name: str, method: str):
        if (name, method) not in built:
            built[name, method] = quantize_checkpoint(
                family_checkpoint(name)[1], root / f"{name}-{method}", method, BOUNDS[method][0], group_size=32,
                max_calib_tokens=512, progress=False)  # calibrated with the tokenizer the checkpoint carries
        return built[name, method]

    return get


@pytest.mark.parametrize("method", sorted(BOUNDS))
@pytest.mark.parametrize("name", FAMILIES)
def test_quantized_within_bound_of_float_and_broken_scales_are_caught(family_checkpoint, quantized, tmp_path,
                                                                      name, method):
    float_ckpt = family_checkpoint(name)[1]
    windows = evaluation_tokens(float_ckpt, max_tokens=256)[:256].view(4, 64)
    ref = _log_probs(float_ckpt, windows)
    kl, log_ratio = _divergence(ref, _log_probs(quantized(name, method), windows), windows[:, 1:])
    _, kl_bound, ratio_bound = BOUNDS[method]
    assert kl <= kl_bound and abs(log_ratio) <= ratio_bound, (kl, math.exp(log_ratio))
    if method == "int8_wo":
        return
    broken = shutil.copytree(quantized(name, method), tmp_path / "broken")
    weights = load_file(str(broken / "rank0.safetensors"))
    save_file({k: v * 1.5 if k.endswith("weights_scaling_factor") else v for k, v in weights.items()},
              str(broken / "rank0.safetensors"))
    assert _divergence(ref, _log_probs(broken, windows), windows[:, 1:])[0] > kl_bound


@pytest.mark.parametrize("name, method", [("phi3_128k", "int4_awq"), ("qwen2", "int4_awq"), ("gemma2", "fp8")])
def test_quantized_tp2_equals_its_single_rank(quantized, tmp_path, name, method):
    """INT4 group scales of the fused [up | gate] fc and of the biased qkv, FP8 with Gemma 2's parallel embedding:
    split by TRT-LLM's rules, the sharded engine gives the single rank's greedy tokens."""
    config = EngineConfig(max_batch_size=2, max_num_tokens=16, max_input_len=48, max_seq_len=64, tokens_per_block=8,
                          device="cpu")
    prompts = random_prompts([28, 40], 8192, seed=5)

    def run(ckpt):
        engine = LLMEngine(ckpt, config)
        try:
            return engine.generate([Request(f"q{i}", p, SamplingParams(max_tokens=12)) for i, p in enumerate(prompts)])
        finally:
            engine.close()

    single = quantized(name, method)
    assert run(shard_checkpoint(single, tmp_path / "tp2", 2, 1)) == run(single)

"""Randomly initialised Llama checkpoints in HF layout, with the demo tokenizer beside them.

They are for tests and benchmarks that need a model of some shape but not a trained one:
the tiny one loads in milliseconds; a ~100M one exercises realistic tensor sizes.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from tokenizers import Tokenizer
from transformers import LlamaForCausalLM

from build_engines.cache import atomic_dir
from build_engines.model_dims import LlamaDims
from build_engines.tokenizer import copy_tokenizer, endoftext_id

TINY_DIMS = LlamaDims(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128)
# With std 0.2 (HF's default is 0.02) the logits of an untrained model spread over
# several units, so greedy argmax is decided by the weights, not by float rounding.
RANDOM_INIT_STD = 0.2


def new_model(dims: LlamaDims, tokenizer_dir: Path, seed: int, initializer_range: float) -> LlamaForCausalLM:
    """A float32 model sized for the tokenizer in `tokenizer_dir`, initialised from `seed`."""
    vocab_size = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).get_vocab_size(with_added_tokens=True)
    config = dims.to_hf_config(vocab_size, endoftext_id(tokenizer_dir), initializer_range)
    with torch.random.fork_rng(devices=[]):  # leave the caller's RNG stream alone
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model.float().eval()


def save_model(model: LlamaForCausalLM, tokenizer_dir: Path, out_dir: Path) -> None:
    """safetensors weights + config.json + generation_config.json + the tokenizer files."""
    model.save_pretrained(out_dir, safe_serialization=True)
    copy_tokenizer(tokenizer_dir, out_dir)


def make_random_model(out_dir: Path, tokenizer_dir: Path, dims: LlamaDims, seed: int = 0,
                      initializer_range: float = RANDOM_INIT_STD) -> Path:
    """Write a random-init model to `out_dir` (replacing it atomically) and return `out_dir`."""
    model = new_model(dims, tokenizer_dir, seed, initializer_range)
    with atomic_dir(out_dir) as tmp:
        save_model(model, tokenizer_dir, tmp)
    return out_dir


def make_tiny_random(out_dir: Path, tokenizer_dir: Path, seed: int = 0, **dims: int | float) -> Path:
    """TINY_DIMS (hidden 64, 2 layers, 4 heads, 2 KV heads), any field overridable by keyword."""
    return make_random_model(out_dir, tokenizer_dir, dataclasses.replace(TINY_DIMS, **dims), seed)

"""Shared fixtures of the unit suite: the demo tokenizer, a tiny random Llama (HF and TRT-LLM layouts), engines
built on it, and factories for the engine core's boundary objects."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest
import torch
from transformers import AutoModelForCausalLM

from backend.engine.block_manager import BlockManager
from backend.engine.config import EngineConfig
from backend.engine.interface import RequestOutput
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.engine.sequence import Request, Sequence
from build_engines.convert import convert_hf_to_trtllm
from build_engines.random_model import make_tiny_random
from build_engines.tokenizer import build_tokenizer

# The tiny model's matmuls are too small to split: extra intra-op threads only spin against other processes on
# a 2-core machine (25x slower under load, measured).
torch.set_num_threads(1)

# Small limits so a test engine allocates little KV and its HF reference runs in milliseconds.
TEST_ENGINE_LIMITS = dict(max_batch_size=4, max_num_tokens=256, max_input_len=96, max_seq_len=160, tokens_per_block=8)


@pytest.fixture(scope="session")
def tokenizer_dir() -> Path:
    return build_tokenizer()  # trained once, then read from the build cache


@pytest.fixture(scope="session")
def tiny_hf_dir(tmp_path_factory, tokenizer_dir) -> Path:
    return make_tiny_random(tmp_path_factory.mktemp("tiny") / "hf", tokenizer_dir, seed=0)


@pytest.fixture(scope="session")
def tiny_ckpt_dir(tmp_path_factory, tiny_hf_dir) -> Path:
    return convert_hf_to_trtllm(tiny_hf_dir, tmp_path_factory.mktemp("tiny") / "ckpt", dtype="float32")


@pytest.fixture
def make_engine(tiny_ckpt_dir) -> Callable[..., LLMEngine]:
    """LLMEngine over the tiny checkpoint: TEST_ENGINE_LIMITS, any EngineConfig field overridable."""

    def make(**overrides) -> LLMEngine:
        return LLMEngine(tiny_ckpt_dir, EngineConfig(**{**TEST_ENGINE_LIMITS, **overrides}))

    return make


def random_prompts(lengths: list[int], vocab_size: int, seed: int = 0) -> list[tuple[int, ...]]:
    """Prompts of the given lengths, ids drawn from [1, vocab) (0 is the end-of-text token)."""
    gen = torch.Generator().manual_seed(seed)
    return [tuple(torch.randint(1, vocab_size, (n,), generator=gen).tolist()) for n in lengths]


@pytest.fixture
def prompts() -> Callable[..., list[tuple[int, ...]]]:
    return random_prompts


def run_to_end(engine: LLMEngine, requests: list[Request]) -> dict[str, list[RequestOutput]]:
    """Add requests and step the engine until idle: request id -> every RequestOutput it produced."""
    for r in requests:
        engine.add_request(r)
    outputs: dict[str, list[RequestOutput]] = {r.request_id: [] for r in requests}
    while engine.has_work():
        for out in engine.step():
            outputs[out.request_id].append(out)
    return outputs


@pytest.fixture
def run_engine() -> Callable[[LLMEngine, list[Request]], dict[str, list[RequestOutput]]]:
    return run_to_end


def assert_kv_idle(blocks: BlockManager) -> None:
    """Every KV block is back in the pool and none is reserved."""
    assert blocks.num_free_blocks == blocks.num_blocks
    assert blocks.num_unreserved_free_blocks == blocks.num_blocks


@pytest.fixture
def kv_idle() -> Callable[[BlockManager], None]:
    return assert_kv_idle


@pytest.fixture
def make_seq() -> Callable[..., Sequence]:
    """Sequence for a request: make_seq("a", prompt_len=5, max_tokens=3, temperature=0.7, ...) or prompt_ids=(...)."""

    def make(request_id: str = "r", prompt_len: int = 4, max_tokens: int = 4,
             prompt_ids: tuple[int, ...] | None = None, **sampling) -> Sequence:
        ids = tuple(prompt_ids) if prompt_ids is not None else tuple(range(1, prompt_len + 1))
        return Sequence.from_request(Request(request_id, ids, SamplingParams(max_tokens=max_tokens, **sampling)))

    return make


@pytest.fixture(scope="session")
def hf_model(tiny_hf_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_hf_dir, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # the engine runs without end_id here: never stop early
    return model


@pytest.fixture(scope="session")
def hf_greedy(hf_model):
    cache: dict[tuple, list[int]] = {}

    def generate(prompt: tuple[int, ...], max_tokens: int) -> list[int]:
        if (prompt, max_tokens) not in cache:
            ids = torch.tensor([prompt])
            out = hf_model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                    max_new_tokens=max_tokens, pad_token_id=0)
            cache[(prompt, max_tokens)] = out[0, len(prompt):].tolist()
        return cache[(prompt, max_tokens)]

    return generate


# Divides the tiny model's widths (64, 128) and is the smallest group torch's CPU INT4 kernel takes.
TINY_QUANT_GROUP = 32


@pytest.fixture(scope="session")
def quantized_tiny(tiny_ckpt_dir, tokenizer_dir, tmp_path_factory) -> Callable[..., Path]:
    """quantized_tiny(method, kv_cache="none") -> the tiny checkpoint quantized that way (group 32, calibrated on
    1024 held-out tokens), built once per session."""
    from build_engines.quantize.apply import quantize_checkpoint

    root, built = tmp_path_factory.mktemp("quantized"), {}

    def get(method: str, kv_cache: str = "none") -> Path:
        if (method, kv_cache) not in built:
            built[method, kv_cache] = quantize_checkpoint(
                tiny_ckpt_dir, root / f"{method}-{kv_cache}", method, kv_cache, group_size=TINY_QUANT_GROUP,
                tokenizer_dir=tokenizer_dir, max_calib_tokens=1024, progress=False)
        return built[method, kv_cache]

    return get


@pytest.fixture(scope="session")
def family_checkpoint(tmp_path_factory, tokenizer_dir) -> Callable[[str], tuple[Path, Path]]:
    """family_checkpoint(name) -> (HF dir, converted float32 TRT-LLM checkpoint) of a family fixture
    (build_engines/family_fixtures.py), made once per session."""
    from build_engines.family_fixtures import make_fixture

    root, made = tmp_path_factory.mktemp("families"), {}

    def get(name: str) -> tuple[Path, Path]:
        if name not in made:
            hf = make_fixture(name, root / name, tokenizer_dir)
            made[name] = hf, convert_hf_to_trtllm(hf, root / f"{name}.trtllm")
        return made[name]

    return get


def hf_generate(hf_dir: Path, prompt: tuple[int, ...], max_tokens: int) -> list[int]:
    """HF transformers greedy tokens, float32, eager attention, batch 1, from a fresh model (dynamic NTK rope keeps
    state across generate() calls), exactly max_tokens of them (no end id)."""
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager").eval()
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, num_beams=1,
                         max_new_tokens=max_tokens, min_new_tokens=max_tokens, pad_token_id=0)
    return out[0, len(prompt):].tolist()

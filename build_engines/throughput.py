"""Output tokens/s of our engine in-process on a checkpoint, greedy: the build report's measurement, and the
engine column of perf/bench_engine.py."""
from __future__ import annotations

import time
from pathlib import Path

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.engine.sequence import Request
from build_engines.corpus import heldout_text


def prompts(tokenizer, n: int, length: int) -> list[list[int]]:
    """n prompts of exactly `length` tokens, cut from held-out standard-library source."""
    ids = tokenizer.encode(heldout_text(400_000), add_special_tokens=False)
    stride = max(1, (len(ids) - length) // n)
    return [ids[i * stride : i * stride + length] for i in range(n)]


def bench_engine(engine_dir: Path, batch: list[list[int]], new_tokens: int) -> float:
    """Output tokens/s generating new_tokens for every prompt of batch at once (after a one-prompt warm-up)."""
    engine = LLMEngine(engine_dir, EngineConfig(max_batch_size=max(16, len(batch)), max_input_len=1024,
                                                max_seq_len=2048, device="cpu"))
    try:  # a sharded engine's worker processes end with close()
        reqs = [Request(str(i), tuple(p), SamplingParams(max_tokens=new_tokens)) for i, p in enumerate(batch)]
        engine.generate(reqs[:1])  # warm-up
        reqs = [Request(f"r{i}", tuple(p), SamplingParams(max_tokens=new_tokens)) for i, p in enumerate(batch)]
        start = time.perf_counter()
        out = engine.generate(reqs)
        elapsed = time.perf_counter() - start
    finally:
        engine.close()
    return sum(len(v) for v in out.values()) / elapsed

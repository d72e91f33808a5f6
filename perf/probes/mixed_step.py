"""The step in which a long prompt arrives while other sequences decode (in-flight batching), against the same
prompt's prefill step alone and the decode steps around it, in one engine. Not a test.

    .venv/bin/python perf/probes/mixed_step.py --hf perf/out/llama125m [--dtype bfloat16] [--long 1024]
        [--decoding 15] [--rounds 3]
"""
from __future__ import annotations

import backend  # noqa: F401 -- first: its OMP_WAIT_POLICY default must precede torch (backend/__init__.py)

# isort: split
import argparse
import statistics
import time
from pathlib import Path

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.engine.sequence import Request
from ensembles import artifacts


def step_ms(engine: LLMEngine) -> float:
    start = time.perf_counter()
    engine.step()
    return (time.perf_counter() - start) * 1e3


def one_round(engine: LLMEngine, r: int, long_prompt: tuple[int, ...], decoding: int) -> str:
    engine.add_request(Request(f"alone{r}", long_prompt, SamplingParams(max_tokens=1)))
    alone = step_ms(engine)
    while engine.has_work():
        engine.step()
    for i in range(decoding):
        prompt = tuple((i * 7 + j) % 1000 + 1 for j in range(128))
        engine.add_request(Request(f"d{r}_{i}", prompt, SamplingParams(max_tokens=40)))
    engine.step()  # their prefill
    before = statistics.median(step_ms(engine) for _ in range(3))
    engine.add_request(Request(f"mixed{r}", long_prompt, SamplingParams(max_tokens=1)))
    mixed = step_ms(engine)
    after = statistics.median(step_ms(engine) for _ in range(3))
    while engine.has_work():
        engine.step()
    return (f"round {r}: the prompt's prefill alone {alone:.0f} ms; decode step of {decoding} {before:.0f} ms; "
            f"the step it arrives in beside them {mixed:.0f} ms; decode step after {after:.0f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hf", type=Path, required=True)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--long", type=int, default=1024)
    parser.add_argument("--decoding", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    model = artifacts.from_hf(args.hf, args.dtype)
    engine = LLMEngine(model.engine_dir, EngineConfig(
        max_batch_size=args.decoding + 1, max_input_len=2047, max_seq_len=2048, max_num_tokens=2048,
        enable_kv_cache_reuse=False, device="cpu", adaptive_threads=False))
    long_prompt = tuple((j * 13) % 1000 + 1 for j in range(args.long))
    try:
        for r in range(args.rounds):
            print(one_round(engine, r, long_prompt, args.decoding), flush=True)
    finally:
        engine.close()


if __name__ == "__main__":
    main()

"""Decode steps with the bf16 GEMV serving up to 16 rows (EngineConfig.decode_gemv "on") against oneDNN for every
product ("off": what a decode step of more than one sequence ran before the GEMV took up to 16 rows), two engines
in one process on a bfloat16 checkpoint, generations alternating engine by engine; the median decode step of each
generation and the ratio of the medians. Prefix caching off (every round sends the same prompts). A measurement,
not a test.

    .venv/bin/python perf/probes/gemv_rows_ab.py --hf perf/out/llama125m --batch 8 [--rounds 4] [--new-tokens 48]
"""
from __future__ import annotations

import backend  # noqa: F401 -- first: its OMP_WAIT_POLICY default must precede torch (backend/__init__.py)

# isort: split
import argparse
import os
import statistics
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.engine.sequence import Request
from build_engines.throughput import prompts
from ensembles import artifacts


def median_decode_step(engine: LLMEngine, batch: list[list[int]], new_tokens: int, tag: str) -> float:
    for i, prompt in enumerate(batch):
        engine.add_request(Request(f"{tag}-{i}", tuple(prompt), SamplingParams(max_tokens=new_tokens,
                                                                              min_tokens=new_tokens)))
    times = []
    while engine.has_work():
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])  # the first step is the prefill


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hf", type=Path, required=True)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=48)
    args = parser.parse_args()
    model = artifacts.from_hf(args.hf, dtype="bfloat16")
    batch = prompts(AutoTokenizer.from_pretrained(str(args.hf)), args.batch, 128)
    torch.set_num_threads(os.cpu_count())
    engines = {choice: LLMEngine(model.engine_dir, EngineConfig(max_batch_size=16, device="cpu", decode_gemv=choice,
                                                                enable_kv_cache_reuse=False))
               for choice in ("off", "on")}
    steps: dict[str, list[float]] = {choice: [] for choice in engines}
    for r in range(args.rounds):
        for choice, engine in engines.items():
            steps[choice].append(median_decode_step(engine, batch, args.new_tokens, f"r{r}"))
    for choice, kept in steps.items():
        print(f"decode_gemv {choice}: median decode step per round (ms) {[round(t * 1e3, 2) for t in kept]}")
    print(f"on / off: {statistics.median(steps['on']) / statistics.median(steps['off']):.3f}")


if __name__ == "__main__":
    main()

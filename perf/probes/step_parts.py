"""Where a decode step's wall time goes, part by part, without a profiler's overhead: the engine's own methods
wrapped with timers (scheduling, the step's inputs, its tensors, the compiled layers, the head, sampling, emitting),
16 prompts of 128 tokens decoding 128 tokens each, the prefill left out; mean milliseconds per decode step per part,
one line per round. A measurement, not a test.

    .venv/bin/python perf/probes/step_parts.py [--hf DIR] [--dtype bfloat16] [--batch 16] [--rounds 3]
"""
from __future__ import annotations

import backend  # noqa: F401 -- first: its OMP_WAIT_POLICY default must precede torch (backend/__init__.py)

# isort: split
import argparse
import collections
import time
from pathlib import Path

from transformers import AutoTokenizer

from backend.engine import llm_engine
from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.engine.sequence import Request
from build_engines.throughput import prompts
from ensembles import artifacts

SPENT: collections.defaultdict[str, float] = collections.defaultdict(float)


def timed(owner, name: str, part: str) -> None:
    """Replace owner.name with a wrapper adding its wall time to SPENT[part]."""
    inner = getattr(owner, name)

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            SPENT[part] += time.perf_counter() - start

    setattr(owner, name, wrapper)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hf", type=Path, help="an HF checkpoint (default: the demo model)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    hf = args.hf or artifacts.demo().tokenizer_dir
    engine = LLMEngine(artifacts.from_hf(hf, args.dtype).engine_dir,
                       EngineConfig(max_batch_size=16, device="cpu", enable_kv_cache_reuse=False))
    runner = engine.runner
    for owner, name, part in ((engine.scheduler, "schedule", "schedule"), (engine, "_step_inputs", "step inputs"),
                              (runner, "run", "model"), (runner, "_step_tensors", "model: step tensors"),
                              (runner.model, "embed", "model: embed"), (runner.model, "head", "model: head"),
                              (llm_engine, "sample", "sample"), (engine, "_postprocess", "advance"),
                              (engine, "_emit", "emit")):
        timed(owner, name, part)
    if runner.native_layers is not None:
        timed(runner.native_layers.__class__, "__call__", "model: compiled layers")
    batch = prompts(AutoTokenizer.from_pretrained(str(hf)), args.batch, 128)
    for r in range(args.rounds):
        for i, p in enumerate(batch):
            engine.add_request(Request(f"r{r}-{i}", tuple(p), SamplingParams(max_tokens=128)))
        engine.step()  # the prefill
        SPENT.clear()
        steps, start = 0, time.perf_counter()
        while engine.has_work():
            engine.step()
            steps += 1
        total = (time.perf_counter() - start) / steps * 1e3
        parts = ", ".join(f"{part} {seconds / steps * 1e3:.3f}" for part, seconds in sorted(SPENT.items()))
        print(f"round {r}: decode step {total:.2f} ms: {parts}", flush=True)


if __name__ == "__main__":
    main()

"""Prefill time with the compiled causal attention kernel (backend/model/kernels/causal_prefill.py) against torch's
SDPA, in one engine, alternated round by round (EngineConfig "auto" picks the kernel; the probe switches the
runner's choice off and on between requests): one long prompt (max_tokens 1: the first token's time) and a batch
of short prompts (their prefill step), bf16 linears beside bf16 K/V; and whether both pick the same first tokens
(they need not: the kernel's products round queries and probabilities to bf16). Not a test.

    .venv/bin/python perf/probes/causal_prefill.py --hf perf/out/llama125m [--rounds 5] [--long 2047]
"""
from __future__ import annotations

import backend  # noqa: F401 -- first: its OMP_WAIT_POLICY default must precede torch (backend/__init__.py)

# isort: split
import argparse
import os
import statistics
from pathlib import Path

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from ensembles import artifacts
from mlp_chunks import add_workload_args, prefill_workloads, timed  # this folder: run as a script


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hf", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=5)
    add_workload_args(parser)
    args = parser.parse_args()
    workloads = prefill_workloads(args)
    model = artifacts.from_hf(args.hf, "bfloat16")
    engine = LLMEngine(model.engine_dir, EngineConfig(
        max_batch_size=args.batch, max_input_len=args.long, max_seq_len=args.long + 1,
        max_num_tokens=max(args.long, args.batch * args.short), enable_kv_cache_reuse=False, device="cpu",
        adaptive_threads=False))  # fixed threads: the governor probes alternate steps, as the A/B does
    if not engine.runner.causal_prefill:
        raise SystemExit("the causal prefill kernel does not apply here (see the engine's log)")
    try:
        times = {(w, k): [] for w in workloads for k in ("sdpa", "kernel")}
        tokens: dict[tuple[str, str], list] = {}
        for r in range(args.rounds + 1):  # round 0 warms up
            for w, prompts in workloads.items():
                for k in ("sdpa", "kernel"):
                    engine.runner.causal_prefill = k == "kernel"
                    seconds, out = timed(engine, prompts, f"r{r}")
                    tokens.setdefault((w, k), out)
                    if r:
                        times[w, k].append(seconds)
        for (w, k), ts in times.items():
            print(f"{w:10s} {k:6s}: median {statistics.median(ts) * 1e3:7.1f} ms {[round(t * 1e3) for t in ts]}, "
                  f"load {os.getloadavg()[0]:.2f}", flush=True)
        for w in workloads:
            same = sum(a == b for a, b in zip(tokens[w, "sdpa"], tokens[w, "kernel"]))
            print(f"{w}: first tokens equal in {same} of {len(workloads[w])} prompts")
    finally:
        engine.close()


if __name__ == "__main__":
    main()

"""Prefill time with the MLP run in cache-sized row chunks (decoder.MLP_CHUNK_BYTES) against the whole matrix at once,
in one process, alternated round by round: one long prompt (max_tokens 1: the first token's time) and a batch of
short prompts (their prefill step), per checkpoint dtype; and whether both give the same tokens. Not a test.

    .venv/bin/python perf/probes/mlp_chunks.py --hf perf/out/llama125m [--dtypes bfloat16 float32] [--rounds 5]
        [--bytes 4194304 0]     # 0: no chunks
"""
from __future__ import annotations

import backend  # noqa: F401 -- first: its OMP_WAIT_POLICY default must precede torch (backend/__init__.py)

# isort: split
import argparse
import os
import statistics
import time
from pathlib import Path

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.engine.sequence import Request
from backend.model import decoder
from ensembles import artifacts


def timed(engine: LLMEngine, prompts: list[tuple[int, ...]], tag: str) -> tuple[float, list]:
    start = time.perf_counter()
    out = engine.generate([Request(f"{tag}{i}", p, SamplingParams(max_tokens=1)) for i, p in enumerate(prompts)])
    return time.perf_counter() - start, [out[f"{tag}{i}"] for i in range(len(prompts))]


def add_workload_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--long", type=int, default=2047)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--short", type=int, default=128)


def prefill_workloads(args: argparse.Namespace) -> dict[str, list[tuple[int, ...]]]:
    """One long prompt, and a batch of short ones (synthetic ids: the time does not depend on them)."""
    return {f"1 x {args.long}": [tuple((j * 13) % 1000 + 1 for j in range(args.long))],
            f"{args.batch} x {args.short}": [tuple((i * 7 + j) % 1000 + 1 for j in range(args.short))
                                             for i in range(args.batch)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hf", type=Path, required=True)
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--bytes", type=int, nargs="+", default=[decoder.MLP_CHUNK_BYTES, 0])
    add_workload_args(parser)
    args = parser.parse_args()
    workloads = prefill_workloads(args)
    for dtype in args.dtypes:
        model = artifacts.from_hf(args.hf, dtype)
        engine = LLMEngine(model.engine_dir, EngineConfig(
            max_batch_size=args.batch, max_input_len=args.long, max_seq_len=args.long + 1,
            max_num_tokens=max(args.long, args.batch * args.short), enable_kv_cache_reuse=False, device="cpu",
            adaptive_threads=False))  # fixed threads: the governor probes alternate steps, as the A/B does
        try:
            times = {(w, b): [] for w in workloads for b in args.bytes}
            tokens = {}
            for r in range(args.rounds + 1):  # round 0 warms up
                for w, prompts in workloads.items():
                    for b in args.bytes:
                        decoder.MLP_CHUNK_BYTES = b or 1 << 62
                        seconds, out = timed(engine, prompts, f"r{r}")
                        tokens.setdefault(w, out)
                        assert out == tokens[w], (dtype, w, b, "tokens differ")
                        if r:
                            times[w, b].append(seconds)
            for (w, b), ts in times.items():
                print(f"{dtype:9s} {w:10s} chunk bytes {b:>9d}: median {statistics.median(ts) * 1e3:7.1f} ms {[round(t * 1e3) for t in ts]} "
                      f"(range {min(ts) * 1e3:.1f}-{max(ts) * 1e3:.1f}), load {os.getloadavg()[0]:.2f}", flush=True)
        finally:
            engine.close()
    print("same tokens with and without chunks: yes")


if __name__ == "__main__":
    main()

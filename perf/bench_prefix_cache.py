"""Time to first token for a request whose 1,024-token prefix is cached (hit) vs not (miss), our engine
in-process, same checkpoint. Prints a table and writes perf/out/bench_prefix_cache.{json,md}. Not a test.

    .venv/bin/python perf/bench_prefix_cache.py [--hf DIR] [--prefix-len 1024] [--repeats 5]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.engine.sequence import Request
from ensembles import artifacts

OUT = Path(__file__).resolve().parent / "out"


def ttft(engine: LLMEngine, rid: str, prompt: list[int]) -> float:
    """Seconds from submission to the first generated token."""
    start = time.perf_counter()
    engine.add_request(Request(rid, tuple(prompt), SamplingParams(max_tokens=1)))
    while engine.has_work():
        if any(o.new_token_ids for o in engine.step()):
            return time.perf_counter() - start
    raise RuntimeError("no token")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hf", type=Path, help="HF checkpoint (default: the demo model)")
    parser.add_argument("--prefix-len", type=int, default=1024)
    parser.add_argument("--suffix-len", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    model = artifacts.from_hf(args.hf) if args.hf else artifacts.demo()
    engine = LLMEngine(model.engine_dir, EngineConfig(max_input_len=args.prefix_len + args.suffix_len,
                                                      max_seq_len=args.prefix_len + args.suffix_len + 8,
                                                      max_num_tokens=args.prefix_len + args.suffix_len,
                                                      enable_kv_cache_reuse=True, device="cpu"))
    vocab = engine.vocab_size
    misses, hits = [], []
    for r in range(args.repeats):
        prefix = [(r * 7919 + i * 31) % (vocab - 1) + 1 for i in range(args.prefix_len)]  # new prefix: a miss
        suffix = [(r + i) % (vocab - 1) + 1 for i in range(args.suffix_len)]
        misses.append(ttft(engine, f"miss{r}", prefix + suffix))
        hits.append(ttft(engine, f"hit{r}", prefix + suffix[::-1]))  # same prefix, other suffix: a hit
    miss, hit = statistics.median(misses), statistics.median(hits)
    table = ("| prefix tokens | TTFT miss (ms) | TTFT hit (ms) | hit / miss |\n|---|---|---|---|\n"
             f"| {args.prefix_len} | {miss * 1e3:.1f} | {hit * 1e3:.1f} | {hit / miss:.3f} |\n")
    print(table + f"\nmedian of {args.repeats}; engine in-process, float32, CPU")
    OUT.mkdir(exist_ok=True)
    (OUT / "bench_prefix_cache.json").write_text(json.dumps(
        {"miss_s": misses, "hit_s": hits, "ratio": hit / miss, "args": vars(args)}, default=str, indent=2))
    (OUT / "bench_prefix_cache.md").write_text(table)


if __name__ == "__main__":
    main()

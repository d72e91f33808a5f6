"""Output tokens/s of the torch engine in-process on the demo model unsharded (tp1) vs sharded tp2 and pp2 (real
worker processes over gloo), at 1 and 16 concurrent requests, greedy. tp1 runs with 2 x --threads torch threads
(the sharded layouts' total) and with --threads; tp2/pp2 with --threads in each of their 2 ranks. Prints a table and writes
perf/out/bench_parallel.{json,md}. A benchmark, not a test.

    .venv/bin/python perf/bench_parallel.py [--prompt-len 128] [--new-tokens 64] [--concurrency 1 16] [--threads 1]
"""
from __future__ import annotations

import backend  # noqa: F401 -- first: its OMP_WAIT_POLICY default must precede torch (backend/__init__.py)

# isort: split
import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import torch
from bench_engine import OUT, prompts
from transformers import AutoTokenizer

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.engine.sequence import Request
from build_engines.shard import shard_checkpoint
from ensembles import artifacts

# (tp, pp, torch threads per rank as a multiple of --threads): tp1 gets the sharded layouts' total, and also one.
LAYOUTS = [(1, 1, 2), (1, 1, 1), (2, 1, 1), (1, 2, 1)]


def bench(engine_dir: Path, threads: int, batch: list[list[int]], new_tokens: int) -> float:
    engine = LLMEngine(engine_dir, EngineConfig(max_batch_size=max(16, len(batch)), max_input_len=1024,
                                                max_seq_len=2048, device="cpu", num_threads=threads))
    try:
        engine.generate([Request("warm", tuple(batch[0]), SamplingParams(max_tokens=4))])
        reqs = [Request(f"r{i}", tuple(p), SamplingParams(max_tokens=new_tokens)) for i, p in enumerate(batch)]
        start = time.perf_counter()
        out = engine.generate(reqs)
        return sum(len(v) for v in out.values()) / (time.perf_counter() - start)
    finally:
        engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank of a sharded layout")
    args = parser.parse_args()
    demo = artifacts.demo()
    tok = AutoTokenizer.from_pretrained(str(demo.tokenizer_dir))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for tp, pp, share in LAYOUTS:
            world = tp * pp
            engine_dir = demo.engine_dir if world == 1 else shard_checkpoint(demo.engine_dir, Path(tmp) / f"{tp}x{pp}",
                                                                              tp, pp)
            threads = args.threads * share
            row = {"layout": f"tp{tp} pp{pp}", "ranks": world, "threads_per_rank": threads}
            for n in args.concurrency:
                row[f"tok_s_at_{n}"] = round(bench(engine_dir, threads, prompts(tok, n, args.prompt_len),
                                                   args.new_tokens), 1)
            rows.append(row)
            print(row, flush=True)
    cols = [f"tok_s_at_{n}" for n in args.concurrency]
    table = ("| layout | ranks (processes) | torch threads per rank | "
             + " | ".join(f"tok/s at {n}" for n in args.concurrency) + " |\n|---|---|---|"
             + "---|" * len(cols) + "\n")
    table += "".join(f"| {r['layout']} | {r['ranks']} | {r['threads_per_rank']} | "
                     + " | ".join(str(r[c]) for c in cols) + " |\n" for r in rows)
    load = os.getloadavg()
    machine = (f"{platform.machine()}, {os.cpu_count()} CPUs, load average at the end {load[0]:.1f}, "
               f"torch {torch.__version__}")
    print(table + f"\nfloat32 demo model, greedy, {args.prompt_len} prompt tokens, {args.new_tokens} new tokens; "
          f"{machine}")
    OUT.mkdir(exist_ok=True)
    (OUT / "bench_parallel.json").write_text(json.dumps({"rows": rows, "machine": machine, "args": vars(args)},
                                                        indent=2))
    (OUT / "bench_parallel.md").write_text(table)


if __name__ == "__main__":
    main()

"""Where a decode step of the in-process engine spends its time: torch.profiler operator table (self CPU time) and a
cProfile of the Python side, for one checkpoint and batch size. Writes perf/report/profile_<name>_bs<N>.txt.
A measurement, not a test.

    .venv/bin/python perf/profile_engine.py [--hf DIR [--dtype D]] [--name demo] [--batch 16] [--prompt-len 128] [--steps 32]
"""
from __future__ import annotations

import backend  # noqa: F401 -- first: its OMP_WAIT_POLICY default must precede torch (backend/__init__.py)

# isort: split
import argparse
import cProfile
import io
import os
import pstats
import subprocess
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.engine.sequence import Request
from ensembles import artifacts

REPORT = Path(__file__).resolve().parent / "report"


def start_engine(engine_dir: Path, batch: int, prompt_len: int, steps: int, **config) -> LLMEngine:
    """An engine whose `batch` sequences have prefilled their prompts: every later step() is a pure decode step."""
    engine = LLMEngine(engine_dir, EngineConfig(max_batch_size=max(16, batch), device="cpu", **config))
    for i in range(batch):
        prompt = tuple((i * 7 + j) % 1000 + 1 for j in range(prompt_len))
        engine.add_request(Request(f"r{i}", prompt, SamplingParams(max_tokens=3 * steps + 8)))
    while engine.last_step.context or engine.iterations == 0:  # prefill (possibly chunked)
        engine.step()
    for _ in range(4):  # warm-up decode steps
        engine.step()
    return engine


def timed_steps(engine: LLMEngine, steps: int) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hf", type=Path)
    parser.add_argument("--dtype", default="float32", help="the checkpoint's dtype (converted from --hf)")
    parser.add_argument("--name", default="demo")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--linear-kernel", help="EngineConfig.linear_kernel (default: the config's default)")
    parser.add_argument("--time-only", action="store_true", help="print the decode step time, no profiles")
    parser.add_argument("--suffix", default="", help="appended to the output file's name")
    parser.add_argument("--threads", type=int, help="EngineConfig.num_threads (default: torch's)")
    args = parser.parse_args()
    config = {k: v for k, v in (("linear_kernel", args.linear_kernel), ("num_threads", args.threads)) if v}
    model = artifacts.from_hf(args.hf, args.dtype) if args.hf else artifacts.demo()
    engine = start_engine(model.engine_dir, args.batch, args.prompt_len, args.steps, **config)
    plain = timed_steps(engine, args.steps)
    if args.time_only:
        print(f"step_ms={plain * 1e3:.2f} tok_s={args.batch / plain:.1f} threads={torch.get_num_threads()} "
              f"config={config} OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}")
        return
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        profiled = timed_steps(engine, args.steps)
    cprof = cProfile.Profile()
    cprof.enable()
    timed_steps(engine, args.steps)
    cprof.disable()
    py = io.StringIO()
    pstats.Stats(cprof, stream=py).sort_stats("cumulative").print_stats(25)
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    head = (f"# {args.name}, batch {args.batch}, {args.prompt_len} prompt tokens, decode steps at context "
            f"{args.prompt_len}-{args.prompt_len + 3 * args.steps}; {torch.get_num_threads()} torch threads, "
            f"torch {torch.__version__}, config {config}, OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}\n"
            f"# uptime after: {load}\n"
            f"# decode step: {plain * 1e3:.2f} ms unprofiled, {profiled * 1e3:.2f} ms under torch.profiler "
            f"({args.batch / plain:.1f} tok/s unprofiled)\n\n")
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60)
    text = head + "## torch.profiler, by self CPU time\n" + table + "\n## cProfile, by cumulative time\n" + py.getvalue()
    REPORT.mkdir(exist_ok=True)
    out = REPORT / f"profile_{args.name}_bs{args.batch}{args.suffix}.txt"
    out.write_text(text)
    print(head + table[:6000])
    print(out)


if __name__ == "__main__":
    main()

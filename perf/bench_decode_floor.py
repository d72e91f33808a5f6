"""A batch-1 decode step of our engine against the memory-bandwidth floor: every weight is read once per step,
so a step cannot take less than weight bytes / the fastest rate this machine streams memory at. That rate is the
better of a one-thread copy (read + write counted) and a read on every core (a sum over 256 MB, torch's threads):
the copy alone understated it (33-48 GB/s read on both cores of this VM against ~25 GB/s copied by one, 2026-11-25).

This VM's read rate changes between two levels, ~32 and ~50 GB/s, for seconds at a time, and the step follows it
(9.4 against 7.1 ms; perf/ISSUE16.md): a floor measured after the steps compared them with another moment's memory.
So steps and rates alternate, ROUND_STEPS steps then the rates, and each round gives its own step / floor; the table
shows medians over rounds and the ratio's range. Prints a table, writes perf/out/bench_decode_floor.{json,md}. Not
a test.

    .venv/bin/python perf/bench_decode_floor.py [--hf DIR [--dtype bfloat16]] [--steps 100]
"""
from __future__ import annotations

import backend  # noqa: F401 -- first: its OMP_WAIT_POLICY default must precede torch (backend/__init__.py)

# isort: split
import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.engine.sequence import Request
from backend.model.config import load_model_config
from backend.model.prepacked_linear import PrepackedLinear
from ensembles import artifacts

OUT = Path(__file__).resolve().parent / "out"


ROUND_STEPS = 5  # decode steps a round, between two measurements of the read rate


def copy_bandwidth(src: np.ndarray, dst: np.ndarray, repeats: int = 2) -> float:
    """Bytes/s moved by a large numpy copy (one thread; read + write counted), best of `repeats`."""
    best = min(_timed(lambda: np.copyto(dst, src)) for _ in range(repeats))
    return 2 * src.nbytes / best


def read_bandwidth(t: torch.Tensor, repeats: int = 3) -> float:
    """Bytes/s read by a sum over a large float32 tensor on torch's threads (every core), best of `repeats`."""
    best = min(_timed(lambda: t.sum()) for _ in range(repeats))
    return t.numel() * t.element_size() / best


def checkpoint_bytes(engine_dir: Path) -> int:
    return sum(t.numel() * t.element_size() for t in load_file(str(engine_dir / "rank0.safetensors")).values())


def embedding_bytes(engine_dir: Path) -> int:
    t = load_file(str(engine_dir / "rank0.safetensors"))["transformer.vocab_embedding.weight"]
    return t.numel() * t.element_size()


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(engine_dir: Path, steps: int, n_bytes: int = 256 * 2**20) -> dict:
    """Batch-1 decode steps (128 prompt tokens, then `steps` steps in rounds of ROUND_STEPS) against weight bytes /
    the streaming rate measured after each round: per round the median step / that round's floor."""
    engine = LLMEngine(engine_dir, EngineConfig(max_batch_size=1, max_num_tokens=512, device="cpu"))
    # The checkpoint's tensors (prepacked linears keep no plain weight, so count the file, not the modules);
    # the embedding table is read by rows only, so it is left out of the bytes a step must stream.
    weight_bytes = checkpoint_bytes(engine_dir) - embedding_bytes(engine_dir)
    src, read_t = np.ones(n_bytes // 8), torch.ones(n_bytes // 4)
    dst = np.empty_like(src)
    step_s, rounds = [], []
    n_rounds = max(1, steps // ROUND_STEPS)
    try:
        engine.add_request(Request("r", tuple(range(1, 129)), SamplingParams(max_tokens=n_rounds * ROUND_STEPS + 2)))
        engine.step()  # prefill
        for _ in range(n_rounds):
            these = [_timed(engine.step) for _ in range(ROUND_STEPS)]
            copy, read = copy_bandwidth(src, dst), read_bandwidth(read_t)
            floor = weight_bytes / max(copy, read)
            step_s += these
            rounds.append({"step_s": statistics.median(these), "copy_bytes_s": copy, "read_bytes_s": read,
                           "floor_s": floor, "ratio": statistics.median(these) / floor})
        kernel = engine.runner.linear_kernel
        dtype = load_model_config(engine_dir).dtype
        packed = {str(m.dtype).removeprefix("torch.") for m in engine.runner.model.modules()
                  if isinstance(m, PrepackedLinear)}
    finally:
        engine.close()
    med = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    return {"weight_bytes": weight_bytes, "bandwidth_bytes_s": weight_bytes / med["floor_s"],
            "copy_bytes_s": med["copy_bytes_s"], "read_bytes_s": med["read_bytes_s"], "floor_s": med["floor_s"],
            "step_s": step_s, "median_step_s": statistics.median(step_s), "rounds": rounds,
            "ratio": med["ratio"], "ratio_range": [min(r["ratio"] for r in rounds), max(r["ratio"] for r in rounds)],
            "linear_kernel": kernel, "dtype": dtype, "linear_dtype": ", ".join(sorted(packed)) or dtype,
            "load": os.getloadavg()[0]}


def table(ms: list[dict]) -> str:
    lines = ["| checkpoint dtype | linears | weights (MB) | copy, 1 thread / read, every core (GB/s) | floor (ms) "
             "| batch-1 decode step (ms) | step / floor (range over rounds) |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {m['dtype']} | {m['linear_dtype']} | {m['weight_bytes'] / 1e6:.1f} | "
              f"{m['copy_bytes_s'] / 1e9:.1f} / {m['read_bytes_s'] / 1e9:.1f} | {m['floor_s'] * 1e3:.2f} | "
              f"{m['median_step_s'] * 1e3:.2f} | {m['ratio']:.2f} ({m['ratio_range'][0]:.2f}-"
              f"{m['ratio_range'][1]:.2f}) |" for m in ms]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hf", type=Path)
    parser.add_argument("--dtype", default="float32", help="the checkpoint's dtype (converted from --hf)")
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    model = artifacts.from_hf(args.hf, args.dtype) if args.hf else artifacts.demo()
    m = measure(model.engine_dir, args.steps)
    print(table([m]) + f"\n{len(m['rounds'])} rounds of {ROUND_STEPS} steps at 128-{128 + args.steps} tokens of "
          f"context, medians over rounds; CPU; "
          f"linear kernel {m['linear_kernel']}; load average (1 min) {m['load']:.2f}")
    OUT.mkdir(exist_ok=True)
    (OUT / "bench_decode_floor.json").write_text(json.dumps(m, indent=2))
    (OUT / "bench_decode_floor.md").write_text(table([m]))


if __name__ == "__main__":
    main()

"""Does the engine's memory grow with every new step shape? RSS of this process (the in-process engine, demo model,
1 thread) after prefills of --lengths distinct prompt lengths, after the same lengths again, and after as many new
lengths. Growth that stops once a few shapes ran is warm-up (allocator, kernel caches); growth with every new
shape would be a per-shape cache without bound. A measurement, not a test.

    .venv/bin/python perf/probes/rss_by_prefill_length.py --linear-kernel onednn --lengths 199
"""
from __future__ import annotations

import backend  # noqa: F401 -- first: its OMP_WAIT_POLICY default must precede torch (backend/__init__.py)

# isort: split
import argparse

import psutil
import torch

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling_params import SamplingParams
from backend.engine.sequence import Request
from ensembles import artifacts


def rss_mib() -> float:
    return psutil.Process().memory_info().rss / 2**20


def prefill_each(engine: LLMEngine, lengths: range, tag: str) -> float:
    """One request per length (prompt of that many tokens, 1 new token), run to completion; RSS growth (MiB)."""
    before = rss_mib()
    for n in lengths:
        prompt = tuple((7 * j) % 500 + 1 for j in range(n))
        engine.add_request(Request(f"{tag}{n}", prompt, SamplingParams(max_tokens=1)))
        while engine.has_work():
            engine.step()
    return rss_mib() - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--linear-kernel", default="onednn", choices=["onednn", "torch"])
    parser.add_argument("--lengths", type=int, default=199)
    args = parser.parse_args()
    torch.set_num_threads(1)
    engine = LLMEngine(artifacts.demo().engine_dir, EngineConfig(
        device="cpu", num_threads=1, linear_kernel=args.linear_kernel, max_batch_size=16, max_input_len=512,
        max_seq_len=1024, max_num_tokens=2048))
    first, new = range(1, args.lengths + 1), range(args.lengths + 1, 2 * args.lengths + 1)
    print(f"{args.linear_kernel}: {args.lengths} distinct prefill lengths +{prefill_each(engine, first, 'a'):.0f} MiB, "
          f"the same again +{prefill_each(engine, first, 'b'):.0f} MiB, "
          f"{args.lengths} new lengths +{prefill_each(engine, new, 'c'):.0f} MiB")


if __name__ == "__main__":
    main()

"""Decode steps with attention_kernel "torch" (gather + SDPA) and "paged" (read in place, backend/model/kernels/),
two engines of one checkpoint in one process, interleaved round by round: median step time per batch size, and
whether both engines produced the same tokens. A measurement, not a test.

    .venv/bin/python perf/probes/paged_attention_ab.py [--hf DIR] [--batch 1 16] [--rounds 5] [--steps 24] [--threads N]
"""
from __future__ import annotations

import backend  # noqa: F401 -- first: its OMP_WAIT_POLICY default must precede torch (backend/__init__.py)

# isort: split
import argparse
import statistics
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from profile_engine import start_engine, timed_steps  # noqa: E402

from ensembles import artifacts  # noqa: E402

KERNELS = ("torch", "paged")


def tokens(engine) -> dict[str, tuple[int, ...]]:
    return {rid: tuple(seq.output_ids) for rid, seq in engine.sequences.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hf", type=Path)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--threads", type=int)
    args = parser.parse_args()
    model = artifacts.from_hf(args.hf) if args.hf else artifacts.demo()
    config = {"num_threads": args.threads} if args.threads else {}
    print(f"# {args.hf or 'demo'}; torch threads {args.threads or torch.get_num_threads()}; "
          f"{subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    for batch in args.batch:
        engines = {k: start_engine(model.engine_dir, batch, args.prompt_len, args.rounds * args.steps,
                                   attention_kernel=k, **config) for k in KERNELS}
        assert engines["paged"].runner.attention_kernel == "paged", "the kernel did not build"
        times: dict[str, list[float]] = {k: [] for k in KERNELS}
        for r in range(args.rounds):
            for k in (KERNELS if r % 2 == 0 else KERNELS[::-1]):
                times[k].append(timed_steps(engines[k], args.steps) * 1e3)
        same = tokens(engines["torch"]) == tokens(engines["paged"])
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"batch {batch}: step ms, median of {args.rounds} rounds of {args.steps} (ranges): "
              + ", ".join(f"{k} {med[k]:.2f} ({min(times[k]):.2f}-{max(times[k]):.2f})" for k in KERNELS)
              + f"; paged / torch {med['paged'] / med['torch']:.2f}; same tokens: {same}")


if __name__ == "__main__":
    main()

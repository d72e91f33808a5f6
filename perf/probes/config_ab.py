"""Decode steps of two engines of one checkpoint in one process that differ in one EngineConfig field (say
attention_kernel torch / paged, or decode_layers python / native), interleaved round by round: median step time per
batch size, and whether both engines produced the same tokens. A measurement, not a test.

    .venv/bin/python perf/probes/config_ab.py --field decode_layers --values python native [--hf DIR [--dtype D]]
        [--batch 1 16] [--rounds 5] [--steps 24] [--threads N] [--set FIELD=VALUE ...]
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


def tokens(engine) -> dict[str, tuple[int, ...]]:
    return {rid: tuple(seq.output_ids) for rid, seq in engine.sequences.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--field", required=True, help="the EngineConfig field the two engines differ in")
    parser.add_argument("--values", nargs=2, required=True, metavar=("A", "B"))
    parser.add_argument("--hf", type=Path)
    parser.add_argument("--dtype", default="float32", help="the checkpoint's dtype (converted from --hf)")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--threads", type=int)
    parser.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE",
                        help="string fields both engines share, e.g. decode_layers=python")
    args = parser.parse_args()
    model = artifacts.from_hf(args.hf, args.dtype) if args.hf else artifacts.demo()
    config = {"num_threads": args.threads} if args.threads else {}
    config.update(item.split("=", 1) for item in args.set)
    a, b = args.values
    print(f"# {args.hf or 'demo'} ({args.dtype if args.hf else 'float32'}); {args.field} {a} / {b}; {args.set}; torch threads {args.threads or torch.get_num_threads()}; "
          f"{subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    for batch in args.batch:
        engines = {v: start_engine(model.engine_dir, batch, args.prompt_len, args.rounds * args.steps,
                                   **{args.field: v}, **config) for v in (a, b)}
        times: dict[str, list[float]] = {v: [] for v in (a, b)}
        for r in range(args.rounds):
            for v in ((a, b) if r % 2 == 0 else (b, a)):
                times[v].append(timed_steps(engines[v], args.steps) * 1e3)
        same = tokens(engines[a]) == tokens(engines[b])
        med = {v: statistics.median(t) for v, t in times.items()}
        print(f"batch {batch}: step ms, median of {args.rounds} rounds of {args.steps} (ranges): "
              + ", ".join(f"{v} {med[v]:.2f} ({min(times[v]):.2f}-{max(times[v]):.2f})" for v in (a, b))
              + f"; {b} / {a} {med[b] / med[a]:.2f}; same tokens: {same}")


if __name__ == "__main__":
    main()

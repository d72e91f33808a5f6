"""The bf16 GEMV's prefetch (backend/model/kernels/bf16_gemv.cpp), two ways, on the 125M model's linears (qkv 768 ->
1280, dense 768 -> 768, fc/gate 768 -> 6144, proj 3072 -> 768). A measurement, not a test; A/B two trees by running
it from each (PYTHONPATH=<tree>), alternating.

- `paired`: every linear of the 12 layers at --rows rows (distinct weights, streamed from DRAM as in a decode step),
  each round followed by a sum over 256 MB on every core (best of three), since this VM's read rate moves between two
  levels for seconds at a time (perf/ISSUE16.md): the GEMV's rate / the read rate, median and range over rounds.
- `cold`: per linear at --rows rows, 24 distinct weights in a row (cold) against one weight repeated (in the caches):
  microseconds, GFLOP/s and cold / cached.

    .venv/bin/python perf/probes/gemv_prefetch.py paired [--rows 1] [--rounds 6]
    .venv/bin/python perf/probes/gemv_prefetch.py cold [--rows 16] [--rounds 5]
"""
from __future__ import annotations

import backend  # noqa: F401 -- first: its OMP_WAIT_POLICY default must precede torch (backend/__init__.py)

# isort: split
import argparse
import statistics
import sys
from pathlib import Path

import torch

from backend.model.kernels.bf16_gemv import bf16_gemv
from backend.model.prepacked_linear import PrepackedLinear

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_decode_floor import _timed  # noqa: E402
from gemv_rows import SHAPES  # noqa: E402 -- (in, out) of each linear in a 125M layer


def _linears(k: int, n: int, count: int) -> list[PrepackedLinear]:
    return [PrepackedLinear(torch.randn(n, k) * 0.05, None, torch.bfloat16, gemv=True) for _ in range(count)]


def paired(rows: int, rounds: int) -> None:
    layers = [[lin for k, n in SHAPES for lin in _linears(k, n, 1)] for _ in range(12)]
    xs = [torch.randn(rows, k) for k, _ in SHAPES]
    weight_bytes = sum(k * n * 2 for k, n in SHAPES) * 12
    big = torch.ones(64 * 2**20)  # 256 MB

    def one_pass() -> None:
        for layer in layers:
            for x, linear in zip(xs, layer):
                bf16_gemv(x, linear.gemv, None)

    ratios, times, reads = [], [], []
    for _ in range(rounds):
        gemv_s = statistics.median(_timed(one_pass) for _ in range(5))
        read = big.numel() * 4 / min(_timed(big.sum) for _ in range(3))
        times.append(gemv_s)
        reads.append(read)
        ratios.append(weight_bytes / gemv_s / read)
    print(f"{rows} row(s), {weight_bytes / 1e6:.1f} MB: GEMV {statistics.median(times) * 1e3:.2f} ms, read "
          f"{statistics.median(reads) / 1e9:.1f} GB/s; GEMV rate / read rate {statistics.median(ratios):.3f} "
          f"({min(ratios):.3f}-{max(ratios):.3f})")


def cold(rows: int, rounds: int) -> None:
    big = torch.ones(16 * 2**20)  # 64 MB: evicts the caches between rounds
    for k, n in SHAPES:
        linears, x = _linears(k, n, 24), torch.randn(rows, k)
        cold_s, warm_s = [], []
        for _ in range(rounds):
            big.sum()
            cold_s.append(_timed(lambda: [bf16_gemv(x, lin.gemv, None) for lin in linears]) / len(linears))
            for _ in range(3):
                bf16_gemv(x, linears[0].gemv, None)
            warm_s.append(_timed(lambda: [bf16_gemv(x, linears[0].gemv, None) for _ in linears]) / len(linears))
        c, w = statistics.median(cold_s), statistics.median(warm_s)
        flop = 2 * k * n * rows
        print(f"{k} -> {n}, {rows} rows: cold {c * 1e6:.0f} us ({flop / c / 1e9:.0f} GFLOP/s, "
              f"{k * n * 2 / c / 1e9:.0f} GB/s), cached {w * 1e6:.0f} us ({flop / w / 1e9:.0f} GFLOP/s), "
              f"cold / cached {c / w:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("paired", "cold"))
    parser.add_argument("--rows", type=int)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    if args.mode == "paired":
        paired(args.rows or 1, args.rounds)
    else:
        cold(args.rows or 16, args.rounds)


if __name__ == "__main__":
    main()

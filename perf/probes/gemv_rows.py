"""The bf16 GEMV (backend/model/kernels/bf16_gemv.cpp) against oneDNN's bf16 linear at 1-16 rows: every linear of
the 125M model's 12 layers (qkv 768 -> 1280, dense 768 -> 768, fc/gate 768 -> 6144, proj 3072 -> 768), distinct
weights per layer so that they stream from DRAM as in a decode step, rounds alternating between the two; the median
round of each, GB/s of weights and GFLOP/s. Both take float32 rows and give float32 (bf16-rounded) results, as
PrepackedLinear does. A measurement, not a test.

    .venv/bin/python perf/probes/gemv_rows.py [--rows 1 4 8 16] [--rounds 10] [--threads 2]
"""
from __future__ import annotations

import backend  # noqa: F401 -- first: its OMP_WAIT_POLICY default must precede torch (backend/__init__.py)

# isort: split
import argparse
import statistics
import time

import torch

from backend.model.kernels.bf16_gemv import bf16_gemv
from backend.model.prepacked_linear import PrepackedLinear

SHAPES = [(768, 1280), (768, 768), (768, 6144), (3072, 768)]  # (in, out) of each linear in a 125M layer


def one_round(layers: list[list[PrepackedLinear]], xs: dict[int, torch.Tensor], kernel: str) -> float:
    start = time.perf_counter()
    for layer in layers:
        for (k, _), linear in zip(SHAPES, layer):
            if kernel == "gemv":
                bf16_gemv(xs[k], linear.gemv, None)
            else:  # PrepackedLinear's oneDNN call
                torch.ops.mkldnn._linear_pointwise(xs[k].to(torch.bfloat16), linear.packed, None, "none", [],
                                                   "").float()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 12, 16])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    layers = [[PrepackedLinear(torch.randn(n, k) * 0.05, None, torch.bfloat16, gemv=True) for k, n in SHAPES]
              for _ in range(12)]
    weight_bytes = sum(k * n * 2 for k, n in SHAPES) * 12
    print(f"{weight_bytes / 1e6:.1f} MB of bf16 weights, {args.threads} threads")
    for rows in args.rows:
        xs = {k: torch.randn(rows, k) for k, _ in SHAPES}
        times: dict[str, list[float]] = {"onednn": [], "gemv": []}
        for _ in range(args.rounds):
            for kernel, kept in times.items():
                kept.append(one_round(layers, xs, kernel))
        cells = []
        for kernel, kept in times.items():
            t = statistics.median(kept)
            cells.append(f"{kernel} {t * 1e3:.2f} ms ({weight_bytes / t / 1e9:.1f} GB/s, "
                         f"{weight_bytes * rows / t / 1e9:.0f} GFLOP/s)")
        print(f"rows {rows}: " + " | ".join(cells))


if __name__ == "__main__":
    main()

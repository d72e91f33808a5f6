"""oneDNN's prepacked linears in float32 against bf16 (x rounded to bf16 before the product, y widened to float32
after it, as EngineConfig.linear_dtype "bfloat16" runs them), at several row counts: the four linears of one
768-wide decoder layer (qkv 2304, dense 768, fused gate/up 6144, down 768), weights cycled through ~400 MB so that
they come from DRAM as in the engine. Best of 7 passes, ms per layer. A measurement, not a test.

    .venv/bin/python perf/probes/linear_dtypes.py [--rows 1 4 16 128 512] [--threads 2] [--hint 16]
"""
from __future__ import annotations

import backend  # noqa: F401 -- first: its OMP_WAIT_POLICY default must precede torch (backend/__init__.py)

# isort: split
import argparse
import time

import torch

SHAPES = [(2304, 768), (768, 768), (6144, 768), (768, 3072)]  # (out, in) of a 768-wide layer's linears
LAYERS = 12  # copies of the layer's weights: ~400 MB in float32, more than any cache


def per_layer_ms(dtype: torch.dtype, rows: int, hint: int) -> float:
    packed = [(torch.ops.mkldnn._reorder_linear_weight(torch.randn(n, k).to(dtype), hint), k)
              for _ in range(LAYERS) for n, k in SHAPES]
    xs = {k: torch.randn(rows, k) for _, k in SHAPES}

    def one_pass() -> None:
        for w, k in packed:
            x = xs[k] if dtype == torch.float32 else xs[k].to(dtype)
            torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "").float()

    for _ in range(3):
        one_pass()
    best = float("inf")
    for _ in range(7):
        start = time.perf_counter()
        one_pass()
        best = min(best, time.perf_counter() - start)
    return best / LAYERS * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16, 128, 512])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--hint", type=int, default=16, help="_reorder_linear_weight's batch_size layout hint")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"# torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()}, native bf16: "
          f"{torch.ops.mkldnn._is_mkldnn_bf16_supported()}, {args.threads} threads, hint {args.hint}")
    print("| rows | float32 (ms / layer) | bf16 + conversions (ms / layer) |\n|---|---|---|")
    for rows in args.rows:
        print(f"| {rows} | {per_layer_ms(torch.float32, rows, args.hint):.3f} | "
              f"{per_layer_ms(torch.bfloat16, rows, args.hint):.3f} |", flush=True)


if __name__ == "__main__":
    main()

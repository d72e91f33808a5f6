"""What a decode step's KV gather costs when its context is cold (the whole model's weights streamed through the
caches since the last step touched it) and warm: index_select of --rows contiguous slots from a float32 pool
shaped like the demo model's (slots, 4 KV heads, 32), against a plain read and a clone of the same rows and SDPA
over them in place. Medians, 1 thread. A measurement, not a test.

    .venv/bin/python perf/probes/cold_gather.py --rows 200
"""
from __future__ import annotations

import backend  # noqa: F401 -- first: its OMP_WAIT_POLICY default must precede torch (backend/__init__.py)

# isort: split
import argparse
import statistics
import time
from typing import Callable

import torch
import torch.nn.functional as F


def median_us(fn: Callable[[], object], before: Callable[[], object], n: int) -> float:
    """fn's median time, each call after `before` (which is not timed)."""
    times = []
    for _ in range(n):
        before()
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--evict-mb", type=int, default=32, help="read this much elsewhere first (cold runs)")
    parser.add_argument("--calls", type=int, default=100)
    args = parser.parse_args()
    torch.set_num_threads(1)
    pool = torch.randn(8192 * 16, 4, 32)  # (slots, n_kv, head_dim)
    first = 4096
    idx = torch.arange(args.rows) + first
    rows = pool[first:first + args.rows]
    other = torch.randn(args.evict_mb * 1024 * 1024 // 4)
    query = torch.randn(1, 8, 1, 32)
    kv = rows.view(1, args.rows, 4, 32).transpose(1, 2)
    probes = {
        "index_select": lambda: pool.index_select(0, idx),
        "sum of the rows": lambda: rows.sum(),
        "clone of the rows": lambda: rows.clone(),
        "SDPA over the rows in place": lambda: F.scaled_dot_product_attention(query, kv, kv, enable_gqa=True),
    }
    for name, fn in probes.items():
        warm = median_us(fn, lambda: None, args.calls)
        cold = median_us(fn, other.sum, args.calls)
        print(f"{name}: warm {warm:.1f} us, after reading {args.evict_mb} MB elsewhere {cold:.1f} us")


if __name__ == "__main__":
    main()

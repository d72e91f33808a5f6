"""The paged decode attention kernel now against the kernel at a git revision, in one process, rounds interleaved:
the demo model's, a 125M Llama's and Llama 3 8B's decode shapes (16 sequences of 192 context rows in shuffled
pool rows, and one), float32 and bfloat16 pools, 1 and 2 threads; outputs must be equal bit for bit (with --close:
within the tests' tolerance of each other, for a change of summation order). --blocks lays each sequence's rows out
as the engine does: runs of 32 consecutive pool rows (one KV block) in shuffled blocks. --cold reads them from
memory, as a served step does (its weights evict the caches): a pool of 262,144 rows, 64 MB written between calls,
each call timed alone; with --read-flush the 64 MB are read instead, as a decode step's weights are (written lines
leave dirty ones that the call's reads wait behind). A measurement, not a test.

    .venv/bin/python perf/probes/paged_decode_ab.py --base HEAD~1 [--close] [--blocks] [--cold [--read-flush]]
"""
from __future__ import annotations

import backend  # noqa: F401 -- first: its OMP_WAIT_POLICY default must precede torch (backend/__init__.py)

# isort: split
import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from old_kernels import build_at  # noqa: E402

from backend.model.kernels.build import load  # noqa: E402

SHAPES = {  # name -> (sequences, heads, kv heads, head size, context rows)
    "demo": (16, 8, 4, 32, 192), "125m": (16, 12, 4, 64, 192), "llama3-8b": (16, 32, 8, 128, 192),
    "demo b1": (1, 8, 4, 32, 192),
}


def _rows(pool_rows: int, n: int, blocks: bool, g: torch.Generator) -> torch.Tensor:
    """n pool rows of one sequence: shuffled rows, or (blocks) consecutive runs of 32 in shuffled blocks."""
    if not blocks:
        return torch.randperm(pool_rows, generator=g)[:n]
    starts = torch.randperm(pool_rows // 32, generator=g)[:(n + 31) // 32] * 32
    return (starts[:, None] + torch.arange(32)).reshape(-1)[:n]


def timed(kernel, args, calls: int, flush: torch.Tensor | None = None, read_flush: bool = False) -> float:
    if flush is not None:  # each call after the caches were overwritten; the median call
        took = []
        for _ in range(calls):
            if read_flush:
                flush.sum()
            else:
                flush.add_(1.0)
            start = time.perf_counter()
            kernel.paged_decode(*args)
            took.append(time.perf_counter() - start)
        return statistics.median(took) * 1e6
    for _ in range(calls // 10):
        kernel.paged_decode(*args)
    start = time.perf_counter()
    for _ in range(calls):
        kernel.paged_decode(*args)
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default="HEAD~1", help="the git revision whose kernel is the baseline")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--close", action="store_true", help="outputs within rtol 1e-5, atol 2e-6, not equal")
    parser.add_argument("--blocks", action="store_true", help="rows in shuffled 32-row blocks, as the engine's")
    parser.add_argument("--cold", action="store_true", help="rows read from memory, not the caches")
    parser.add_argument("--read-flush", action="store_true", help="--cold by reading 64 MB, not writing them")
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    args = parser.parse_args()
    old, new = build_at(args.base), load()
    flush = torch.ones(16 << 20) if args.cold else None  # 64 MB: twice the L3
    for name in args.shapes:
        B, H, KV, D, L = SHAPES[name]
        g = torch.Generator().manual_seed(0)
        S = 32 * 8192 if args.cold else 16 * 256
        for dtype in (torch.float32, torch.bfloat16):
            k, v = (torch.randn(S, KV, D, generator=g).to(dtype) for _ in range(2))
            q = torch.randn(B, H, D, generator=g)
            slots = torch.stack([_rows(S, L, args.blocks, g) for _ in range(B)])
            call = (q, k, v, slots, torch.zeros(B, dtype=torch.long), torch.full((B,), L), D ** -0.5, 0.0)
            if args.close:
                torch.testing.assert_close(new.paged_decode(*call), old.paged_decode(*call), rtol=1e-5, atol=2e-6)
            else:
                assert torch.equal(old.paged_decode(*call), new.paged_decode(*call)), (name, dtype)
            for threads in (1, 2):
                torch.set_num_threads(threads)
                us = {"base": [], "now": []}
                for _ in range(args.rounds):
                    us["base"].append(timed(old, call, args.calls, flush, args.read_flush))
                    us["now"].append(timed(new, call, args.calls, flush, args.read_flush))
                base, now = statistics.median(us["base"]), statistics.median(us["now"])
                print(f"{name:10s} {str(dtype)[6:]:9s} {threads} thread(s): {args.base} {base:7.1f} us, now "
                      f"{now:7.1f} us, now / base {now / base:.2f} ({'close' if args.close else 'equal'} outputs)",
                      flush=True)


if __name__ == "__main__":
    main()

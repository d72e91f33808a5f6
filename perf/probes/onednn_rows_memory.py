"""What one more distinct row count costs the oneDNN linears: glibc heap bytes in use (mallinfo2) grown over row
counts --first..--last through the demo model's four layer shapes (qkv 256->384, o 256->256, fc_gate 256->2048,
down 1024->256), each run once, and a new row count's first call against its second. --rows exact calls oneDNN
with each row count as it is (what PrepackedLinear does); --rows bucketed with each padded to one of 8 row counts an
octave (perf/probes/row_padding_ab.py's padded_rows, not adopted). Run each in its own process: oneDNN's caches are
per process. A measurement, not a test.

    .venv/bin/python perf/probes/onednn_rows_memory.py --rows exact
    .venv/bin/python perf/probes/onednn_rows_memory.py --rows bucketed
"""
from __future__ import annotations

import backend  # noqa: F401 -- first: its OMP_WAIT_POLICY default must precede torch (backend/__init__.py)

# isort: split
import argparse
import statistics
import time

import torch
from engine_memory_rounds import heap_in_use_mib  # siblings in perf/probes/, this script's folder
from row_padding_ab import padded_rows
from torch import nn

from backend.model.prepacked_linear import PrepackedLinear

SHAPES = [(256, 384), (256, 256), (256, 2048), (1024, 256)]  # (in, out) of the demo model's layer linears


def run(linears: list[PrepackedLinear], rows: int, exact: bool) -> None:
    """Each linear once on rows input rows (padded_rows(rows) unless exact: what oneDNN sees is the point)."""
    for lin in linears:
        lin(torch.randn(rows if exact else padded_rows(rows), lin.in_features))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", choices=["exact", "bucketed"], required=True)
    parser.add_argument("--first", type=int, default=17, help="first row count (above the exact decode batches)")
    parser.add_argument("--last", type=int, default=199)
    args = parser.parse_args()
    if not 1 <= args.first <= args.last:
        parser.error("1 <= --first <= --last")
    torch.set_num_threads(1)
    exact = args.rows == "exact"
    linears = [PrepackedLinear.of(nn.Linear(i, o, bias=False)) for i, o in SHAPES]
    with torch.inference_mode():
        first, again = [], []
        for rows in (3, 5, 7, 9, 11, 13):  # new row counts, run twice: primitive creation vs a cached primitive
            for times in (first, again):
                began = time.perf_counter()
                run(linears, rows, exact)
                times.append(time.perf_counter() - began)
        before = heap_in_use_mib()
        for rows in range(args.first, args.last + 1):
            run(linears, rows, exact)
        grown = heap_in_use_mib() - before
    counts = len(range(args.first, args.last + 1)) if exact else len(
        {padded_rows(r) for r in range(args.first, args.last + 1)})
    print(f"{args.rows}: rows {args.first}-{args.last} ran as {counts} row counts, heap in use +{grown:.1f} MiB "
          f"({grown / counts:.2f} MiB a row count, 4 shapes); a new row count's first call "
          f"{statistics.median(first) * 1e3:.2f} ms, again {statistics.median(again) * 1e3:.2f} ms (4 linears)")


if __name__ == "__main__":
    main()

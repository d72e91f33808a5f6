"""bf16 linears of 1 to 16 rows (decode steps of up to 16 sequences) on an AVX-512 BF16 kernel over interleaved
weights (bf16_gemv.cpp; "GEMV" for its one-row origin).

The Python side: the weights' layout, the call, and whether the CPU runs it (backend/model/kernels/gemv.py decides
where the GEMV applies). A batch-1 decode step's linears are reads of
their weights; oneDNN's bf16 kernel reads them at about two thirds of the memory's read rate on the development CPU,
this kernel at about that rate (0.97-1.04 of a sum on every core, with non-temporal prefetch); at 8-16 rows it reads
the weights once and computes at or beyond oneDNN's rate (perf/ISSUE16.md). It needs its own copy of each bf16
linear's weights (oneDNN's packed one stays for every product of more rows), so EngineConfig.decode_gemv's "auto"
takes it only where the KV cache keeps its capacity with that copy in memory (backend/engine/llm_engine.py).
"""
from __future__ import annotations

import torch

from backend.model.kernels.build import avx512_bf16_missing, load

LANES, STRIP = 16, 64  # bf16_gemv.cpp's kLanes (output columns per accumulator) and kStrip (columns per strip)
_NO_BIAS = torch.empty(0)  # the kernel's "no bias", made once: the call sits on the decode step's hot path


def interleaved_width(k: int) -> int:
    """The interleaved copy's row width for K input features: K padded to whole pairs."""
    return k + k % 2


def interleave(w: torch.Tensor) -> torch.Tensor:
    """w (N, K) -> (N, K padded to 2) bf16 holding bf16_gemv.cpp's layout: columns of the output (rows of w) in strips
    of STRIP (the last strip: the rest), each strip [K/2][columns][2] (each column's K values in pairs, the pairs in
    order), so that a strip is read in order. A padded K column is zero."""
    n, k = w.shape
    kp = interleaved_width(k)
    w = torch.nn.functional.pad(w.detach().to(torch.bfloat16), (0, kp - k))
    full = n // STRIP * STRIP
    parts = [w[:full].reshape(n // STRIP, STRIP, kp // 2, 2).transpose(1, 2).reshape(-1)]
    if full < n:
        parts.append(w[full:].reshape(n - full, kp // 2, 2).transpose(0, 1).reshape(-1))
    return torch.cat(parts).view(n, kp)


def bf16_gemv(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x (M, K) float32, 1 <= M <= gemv.MAX_ROWS -> (M, N) float32: bf16(bf16(x) W^T + bias) widened, W given interleaved
    (`packed`). Each row's result is the same whatever M is (one summation order for every row)."""
    return load().bf16_gemv(x, packed, _NO_BIAS if bias is None else bias)


def unsupported(device: torch.device | str) -> str | None:
    """Why the GEMV cannot run here (None: it can)."""
    if torch.device(device).type != "cpu":
        return f"the bf16 GEMV runs on CPU only, not on {device}"
    return avx512_bf16_missing("bf16 GEMV", "bf16_gemv_available")

"""float32 linears of 1 to 16 rows (decode steps of up to 16 sequences) on an AVX2 + FMA kernel reading the
weights in their own row-major layout (f32_gemv.cpp; "GEMV" for its one-row origin).

Why: where the CPU has no native bf16 arithmetic, float32 is the fast dtype, and a batch-1 decode step's linears
are reads of their weights: oneDNN's float32 kernel reads them at about half of the memory's read rate there, this
kernel at 0.7-0.8 of it, and at 16 rows it takes oneDNN's time or less (perf/ISSUE16.md). Its copy is the plain
weight, kept beside oneDNN's packed one (backend/model/kernels/gemv.py decides where), in bf16 where that holds
every weight exactly (a bf16 checkpoint run as a float32 model): the kernel widens each weight as it reads it, so
the products are the float32 ones over half the bytes.
"""
from __future__ import annotations

import torch

from backend.model.kernels.build import KernelUnavailable, load

_NO_BIAS = torch.empty(0)  # the kernel's "no bias", made once: the call sits on the decode step's hot path
_EXACT_SLICE = 1 << 20  # elements per slice of bf16_exact's check: its int32 temporary stays at 4 MiB


def bf16_exact(weight: torch.Tensor) -> bool:
    """Whether bf16 holds every value of weight exactly: bf16 itself, or float32 with the low 16 bits of every value
    zero (a bf16 is the top half of a float32: a bf16 checkpoint widened to float32). Checked a slice at a time."""
    if weight.dtype == torch.bfloat16:
        return True
    if weight.dtype != torch.float32:
        return False
    flat = weight.detach().reshape(-1).view(torch.int32)
    return all(not torch.any(flat[i:i + _EXACT_SLICE] & 0xFFFF) for i in range(0, flat.numel(), _EXACT_SLICE))


def f32_gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x (M, K) float32, 1 <= M <= gemv.MAX_ROWS, weight (N, K) float32 or bfloat16, contiguous -> (M, N) float32:
    x W^T + bias in float32 (bf16 weights widened, exact). Each row's result is the same whatever M is (one summation
    order for every row)."""
    return load().f32_gemv(x, weight, _NO_BIAS if bias is None else bias)


def unsupported(device: torch.device | str) -> str | None:
    """Why the float32 GEMV cannot run here (None: it can)."""
    if torch.device(device).type != "cpu":
        return f"the float32 GEMV runs on CPU only, not on {device}"
    try:
        if not load().f32_gemv_available():
            return "the float32 GEMV needs AVX2 and FMA, which this CPU lacks"
    except KernelUnavailable as exc:
        return str(exc)
    return None

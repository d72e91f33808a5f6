"""The GEMV: products of 1 to MAX_ROWS rows (decode steps of up to 16 sequences) of a oneDNN-prepacked linear beside
float32 activations, on a kernel reading its own copy of the weights once: bf16 linears on bf16_gemv.cpp (AVX-512
BF16, an interleaved copy), float32 linears on f32_gemv.cpp (AVX2 + FMA, the plain weight, held in bf16 where that
is exact: a bf16 checkpoint widened to float32 on a CPU without native bf16). oneDNN's packed copy serves every
product of more rows. Where it applies, the copy it reads, and the call.
"""
from __future__ import annotations

import torch

from backend.kernel_choices import DECODE_GEMV
from backend.model.kernels import bf16_gemv, f32_gemv

# Most rows of x per call (kernels.h's kGemvMaxRows): products of up to 16 rows read the weights once and compute at
# or beyond oneDNN's rate; more go to oneDNN (perf/ISSUE16.md).
MAX_ROWS = 16


def gemv_dtype(linear_dtype: torch.dtype | None, model_dtype: torch.dtype) -> torch.dtype | None:
    """The linears' dtype where their activations are float32 (the GEMV's inputs and outputs), else None.
    linear_dtype: the prepacked linears' dtype beside float32 activations (None: the checkpoint's, model_dtype)."""
    if linear_dtype is not None:
        return linear_dtype
    return torch.float32 if model_dtype == torch.float32 else None


def unsupported(device: torch.device | str, dtype: torch.dtype | None) -> str | None:
    """Why the GEMV cannot serve linears of `dtype` beside float32 activations here (None: it can)."""
    if dtype == torch.bfloat16:
        return bf16_gemv.unsupported(device)
    if dtype == torch.float32:
        return f32_gemv.unsupported(device)
    return "the GEMV serves float32 linears and bfloat16 ones beside float32 activations, not the checkpoint's " \
           f"{dtype if dtype is not None else 'reduced-precision'} activations"


def resolve_decode_gemv(choice: str, device: torch.device | str, dtype: torch.dtype | None,
                        onednn: bool = True) -> bool:
    """Whether the prepacked linears' products of up to MAX_ROWS rows take the GEMV. dtype: gemv_dtype(...);
    onednn: whether the linears are oneDNN-prepacked (the GEMV's copy lives in PrepackedLinear). "on" where it cannot
    run raises ValueError naming why; "auto" -> where it runs."""
    if choice not in DECODE_GEMV:
        raise ValueError(f"decode_gemv must be one of {DECODE_GEMV}, got {choice!r}")
    if choice == "off":
        return False
    reason = unsupported(device, dtype) if onednn else "the linears are not oneDNN-prepacked (linear_kernel 'torch')"
    if choice == "on" and reason is not None:
        raise ValueError(f"decode_gemv 'on' is unavailable: {reason}")
    return reason is None


def gemv_copy(weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The GEMV's copy of weight (N, K) for linears of `dtype`: bf16_gemv.py's interleaved layout, or for float32
    linears the weight itself (row-major, contiguous), in bf16 where that holds it exactly (f32_gemv.bf16_exact)."""
    if dtype == torch.bfloat16:
        return bf16_gemv.interleave(weight)
    if dtype == torch.float32:
        narrow = torch.bfloat16 if f32_gemv.bf16_exact(weight) else torch.float32
        return weight.detach().to(narrow).contiguous()
    raise ValueError(f"the GEMV serves bfloat16 and float32 linears, not {dtype} ones")


def copy_bytes(weight: torch.Tensor, dtype: torch.dtype) -> int:
    """Bytes of gemv_copy(weight, dtype), without making it."""
    n, k = weight.shape
    if dtype == torch.bfloat16:
        return n * bf16_gemv.interleaved_width(k) * 2
    return n * k * (2 if f32_gemv.bf16_exact(weight) else 4)


def gemv(x: torch.Tensor, copy: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """x (M, K) float32, 1 <= M <= MAX_ROWS -> (M, N) float32 on the kernel of the linears' `dtype` (the copy's
    dtype alone does not say: a float32 linear's copy may be bf16)."""
    if dtype == torch.float32:
        return f32_gemv.f32_gemv(x, copy, bias)
    return bf16_gemv.bf16_gemv(x, copy, bias)

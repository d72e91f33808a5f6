"""Decode attention read in place from the paged KV pool (paged_decode.cpp, built by build.py).

The Python side: the call, where the kernel applies, and the choice EngineConfig.attention_kernel makes.
"""
from __future__ import annotations

import logging

import torch

from backend.kernel_choices import ATTENTION_KERNELS
from backend.model.kernels.build import KernelUnavailable, load

log = logging.getLogger(__name__)



def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                 col_start: torch.Tensor, col_end: torch.Tensor, scale: float, softcap: float | None) -> torch.Tensor:
    """q (B, H, D), pools (S, KV, D), slots (B, L), columns [col_start, col_end) (B,) each -> (B, H, D)."""
    return load().paged_decode(q.contiguous(), k_cache, v_cache, slots, col_start, col_end, scale,
                               0.0 if softcap is None else softcap)


def unsupported(device: torch.device | str, dtype: torch.dtype) -> str | None:
    """Why the paged decode kernel does not apply to this device and dtype (None: it does)."""
    if torch.device(device).type != "cpu":
        return f"the paged decode kernel runs on CPU only, not on {device}"
    if dtype != torch.float32:
        return f"the paged decode kernel is float32 only, not {dtype}"
    return None


def resolve_attention_kernel(kernel: str, device: torch.device | str, dtype: torch.dtype) -> str:
    """"auto" -> "paged" where the kernel runs, else "torch" (gather + SDPA); an explicit "paged" that cannot run
    raises ValueError naming why. Float32 CPU is where it runs; a failed build under "auto" is logged as a warning."""
    if kernel not in ATTENTION_KERNELS:
        raise ValueError(f"attention_kernel must be one of {ATTENTION_KERNELS}, got {kernel!r}")
    if kernel == "torch":
        return kernel
    reason = unsupported(device, dtype)
    if reason is None:
        try:
            load()
            return "paged"
        except KernelUnavailable as exc:  # where it should have run: a failed build
            reason = str(exc)
            if kernel == "auto":
                log.warning("attention_kernel 'auto' uses gather + SDPA: %s", reason)
    if kernel == "paged":
        raise ValueError(f"attention_kernel 'paged' is unavailable: {reason}")
    return "torch"

"""FP8 E4M3 with per-tensor scales, as NVIDIA ModelOpt exports for TensorRT-LLM: scale = amax / 448 (the largest
finite E4M3 value), stored value = x / scale cast to float8_e4m3fn. Used for weights (weights_scaling_factor),
linear inputs (activation_scaling_factor, from calibration) and the KV cache (kv_cache_scaling_factor)."""
from __future__ import annotations

import torch

E4M3_MAX = 448.0
FP8 = torch.float8_e4m3fn


def scale_for(amax: float | torch.Tensor) -> torch.Tensor:
    """(1,) float32 scale for values up to amax (a tiny floor keeps an all-zero tensor finite)."""
    amax = torch.as_tensor(amax, dtype=torch.float32).reshape(1)
    return (amax / E4M3_MAX).clamp(min=1e-12)


def to_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x / scale, saturated to +-448 (E4M3 has no infinity), as float8_e4m3fn."""
    return (x.float() / scale.float()).clamp(-E4M3_MAX, E4M3_MAX).to(FP8)


def from_fp8(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return (q.float() * scale.float()).to(dtype)


def quantize_fp8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, in) float -> (float8_e4m3fn (out, in), weights_scaling_factor (1,) float32)."""
    scale = scale_for(weight.float().abs().amax())
    return to_fp8(weight, scale), scale


def fake_quantize_fp8(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """What an FP8 GEMM sees of x: to FP8 and back, in x's dtype."""
    return from_fp8(to_fp8(x, scale), scale, x.dtype)

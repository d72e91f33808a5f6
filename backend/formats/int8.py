"""Per-output-channel symmetric INT8 weights (W8A16, TensorRT-LLM's int8 weight-only): W ~= q * scale[:, None],
scale = amax(row) / 127, q int8 (out, in); the scale is the checkpoint's `per_channel_scale` (out,)."""
from __future__ import annotations

import torch

INT8_MAX = 127


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, in) float -> (q int8 (out, in), per_channel_scale float32 (out,))."""
    scale = (weight.float().abs().amax(dim=1) / INT8_MAX).clamp(min=1e-8)
    q = (weight.float() / scale[:, None]).round().clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q, scale


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.float() * scale.float()[:, None]

"""Group-wise symmetric INT4 weights (W4A16): round-to-nearest quantization, packing two values a byte.

A weight W (out, in) is cut into groups of `group_size` consecutive input columns; each (row, group) has one
scale = amax / 7 and its values are round(W / scale) clamped to [-8, 7] (signed INT4, no zero point, as
TensorRT-LLM's W4A16_AWQ with has_zero_point false). Dequantized: W ~= q * scale.

Layout (build_engines/shard.py's rules, shared with backend/model/quantized_linear.py): packed weight int8
(out, in / 2), column 2j in the low nibble and 2j+1 in the high one, two's complement; scales (out, in / group),
i.e. torch's (out, in) orientation, so that TP sharding cuts them like the float weight. TensorRT-LLM's own
loader preprocesses INT4 weights (and may transpose the group scales to (in / group, out)) for its mixed-GEMM
kernels; that step was not checked against TensorRT-LLM here (it is not installable on this machine): a converter
to its exact tensor orientation belongs with trtllm-build, not in this layout.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

INT4_MIN, INT4_MAX = -8, 7


@dataclass(frozen=True)
class Int4Weight:
    """What a checkpoint stores for one INT4 linear."""

    packed: torch.Tensor  # (out, in / 2) int8
    scales: torch.Tensor  # (out, in / group) float


def check_group(in_features: int, group_size: int, name: str = "weight") -> None:
    if group_size < 2 or group_size % 2:
        raise ValueError(f"INT4 group_size must be an even number >= 2, got {group_size}")
    if in_features % group_size:
        raise ValueError(f"{name}: group_size {group_size} does not divide in_features {in_features}; "
                         f"use a group size that divides every linear's input width")


def group_scales(weight: torch.Tensor, group_size: int) -> torch.Tensor:
    """(out, in) -> (out, in / group) float32: amax / 7 of each group (a tiny floor keeps all-zero groups finite)."""
    out, in_features = weight.shape
    amax = weight.float().reshape(out, in_features // group_size, group_size).abs().amax(-1)
    return (amax / INT4_MAX).clamp(min=1e-8)


def quantize_rtn(weight: torch.Tensor, group_size: int, scales: torch.Tensor | None = None) -> torch.Tensor:
    """(out, in) float -> (out, in) int8 values in [-8, 7] (unpacked), with the given or amax scales."""
    check_group(weight.shape[1], group_size)
    scales = group_scales(weight, group_size) if scales is None else scales
    out, in_features = weight.shape
    grouped = weight.float().reshape(out, in_features // group_size, group_size) / scales[..., None]
    return grouped.round().clamp(INT4_MIN, INT4_MAX).to(torch.int8).reshape(out, in_features)


def dequantize(q: torch.Tensor, scales: torch.Tensor, group_size: int) -> torch.Tensor:
    """(out, in) int values and (out, in / group) scales -> (out, in) float32."""
    out, in_features = q.shape
    grouped = q.float().reshape(out, in_features // group_size, group_size) * scales.float()[..., None]
    return grouped.reshape(out, in_features)


def fake_quantize(weight: torch.Tensor, group_size: int) -> torch.Tensor:
    """W -> dequantize(quantize(W)): the weight INT4 RTN actually computes with (float32)."""
    scales = group_scales(weight, group_size)
    return dequantize(quantize_rtn(weight, group_size, scales), scales, group_size)


def pack(q: torch.Tensor) -> torch.Tensor:
    """(out, in) int8 in [-8, 7] -> (out, in / 2) int8: even column low nibble, odd column high nibble."""
    if q.shape[-1] % 2:
        raise ValueError(f"INT4 packing needs an even number of columns, got {q.shape[-1]}")
    low, high = q[:, 0::2].to(torch.int16) & 0x0F, q[:, 1::2].to(torch.int16) & 0x0F
    byte = low | (high << 4)  # 0..255
    return torch.where(byte > 127, byte - 256, byte).to(torch.int8)


def unpack(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of pack: (out, in / 2) int8 -> (out, in) int8 in [-8, 7]."""
    byte = packed.to(torch.int16) & 0xFF
    low, high = byte & 0x0F, (byte >> 4) & 0x0F
    both = torch.stack([low, high], dim=-1).reshape(packed.shape[0], -1)  # interleave back: col 2j, 2j+1
    return torch.where(both > 7, both - 16, both).to(torch.int8)


def quantize_int4(weight: torch.Tensor, group_size: int) -> Int4Weight:
    """RTN INT4 of a (out, in) weight, packed for the checkpoint."""
    scales = group_scales(weight, group_size)
    return Int4Weight(pack(quantize_rtn(weight, group_size, scales)), scales)

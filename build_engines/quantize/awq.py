"""AWQ (Lin et al., 2023, "Activation-aware Weight Quantization"): before INT4 rounding, scale each input channel
of a weight by s = mean|x|^alpha (channels that see large activations keep more precision), and divide the
activations by s at run time (TRT-LLM's prequant_scaling_factor = 1 / s). alpha is chosen on a grid over [0, 1]
to minimise the layer's output error ||X W^T - X Q(W s)^T / s||^2 on calibration inputs X; alpha = 0 is plain
round-to-nearest, so the search never does worse than RTN on those inputs.

Linears that read the same input (fc and gate of the MLP; the fused qkv) share one s: the search scores them
together, and the runtime multiplies their common input once.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from backend.formats.int4 import fake_quantize

GRID = 20  # alpha = 0, 0.05, ..., 1 (the original implementation's grid)


@dataclass(frozen=True)
class AwqScale:
    scales: torch.Tensor  # (in,) float32: weights are multiplied by it before quantization
    alpha: float
    error: float  # mean squared output error at alpha
    rtn_error: float  # ... at alpha = 0 (plain round-to-nearest)


def search_scale(weight: torch.Tensor, inputs: torch.Tensor, channel_mean_abs: torch.Tensor,
                 group_size: int, grid: int = GRID) -> AwqScale:
    """weight (out, in) float; inputs (n, in) calibration rows of this linear's input; channel_mean_abs (in,)."""
    w, x = weight.float(), inputs.float()
    ref = x @ w.t()  # (n, out)
    base = channel_mean_abs.float().clamp(min=1e-5)
    best: tuple[float, float, torch.Tensor] | None = None
    rtn_error = float("nan")
    for alpha in torch.linspace(0, 1, grid + 1).tolist():
        s = base.pow(alpha)
        s = s / (s.max() * s.min()).sqrt()  # centre the range so neither end under/overflows
        err = (x @ (fake_quantize(w * s, group_size) / s).t() - ref).pow(2).mean().item()
        if alpha == 0.0:
            rtn_error = err
        if best is None or err < best[0]:
            best = (err, alpha, s)
    assert best is not None
    return AwqScale(scales=best[2], alpha=best[1], error=best[0], rtn_error=rtn_error)

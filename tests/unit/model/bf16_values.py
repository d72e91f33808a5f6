"""Float32 models of bf16 values (a bf16 checkpoint widened, as linear_dtype 'float32' loads it), and their GEMV
copies held in float32 instead of bf16: the tests' way to compare the two copies of the same values."""
from __future__ import annotations

import torch
from torch import nn

from backend.model.kernels.decode_layers import NativeDecodeLayers
from backend.model.prepacked_linear import PrepackedLinear


def round_to_bf16_values(model: nn.Module) -> None:
    """Every parameter of `model`, and every fused fc | gate weight (a plain tensor, not a parameter), rounded to
    bf16 and kept in float32."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).float())
        for mlp in (m for m in model.modules() if isinstance(getattr(m, "fc_gate", None), torch.Tensor)):
            mlp.fc_gate = mlp.fc_gate.to(torch.bfloat16).float()


def float32_gemv_copies(model: nn.Module, native: NativeDecodeLayers | None) -> None:
    """Every GEMV copy under `model` held in float32 (the same values), the compiled layers' list collected again."""
    for m in model.modules():
        if isinstance(m, PrepackedLinear) and m.gemv is not None:
            m.gemv = m.gemv.float()
    if native is not None:
        native.collect_weights(model.transformer.layers)

"""Causal attention of prompts prefilled from position 0, bf16 products on AVX-512 BF16 (causal_prefill.cpp, built by
build.py).

The Python side: the call, and where it applies. It comes with attention_kernel "paged" (EngineConfig: "auto"
resolves to it on CPU) where the KV pools are bf16 beside bf16 linears (backend/model/prepacked_linear.py): K and V
are bf16 there already, and the kernel rounds the queries and the softmax's probabilities to bf16 for the
products (every sum in float32), as a bf16 checkpoint's own attention does. Float32 pools keep torch's SDPA, so
float32 greedy tokens stay HF's. Steps it does not cover (a prompt continuing a cached prefix or an earlier chunk,
a sliding window shorter than the prompt, soft-capped scores) keep gather + SDPA.
"""
from __future__ import annotations

import torch

from backend.model.kernels.build import avx512_bf16_missing, load

HEAD_SIZES = (16, 32, 64, 80, 96, 128, 256)  # the head sizes causal_prefill.cpp is instantiated for


def causal_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seqs: torch.Tensor,
                   scale: float) -> torch.Tensor:
    """q (T, H, D) float32, k/v (T, KV, D) bfloat16, seqs (B, 2) int64: each sequence's first flat token and token
    count (its keys are its own tokens, query i seeing keys 0..i) -> (T, H, D) float32 (zeros outside the ranges)."""
    return load().causal_prefill(q.contiguous(), k.contiguous(), v.contiguous(), seqs, scale)


def unsupported(head_size: int, kv_dtype: torch.dtype, device: torch.device | str) -> str | None:
    """Why the causal prefill kernel does not apply (None: it does)."""
    if torch.device(device).type != "cpu":
        return f"the causal prefill kernel runs on CPU only, not on {device}"
    if kv_dtype != torch.bfloat16:
        return f"the causal prefill kernel reads bf16 K/V pools (bf16 linears), not {kv_dtype}"
    if head_size not in HEAD_SIZES:
        return f"the causal prefill kernel is built for head sizes {HEAD_SIZES}, not {head_size}"
    return avx512_bf16_missing("causal prefill kernel", "causal_prefill_available")

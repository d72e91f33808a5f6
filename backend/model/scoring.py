"""Next-token logits at every position of whole token windows, with the engine's own model (float or quantized,
FP8 KV cache included): what calibration and held-out evaluation run. One forward per call, each window its own
sequence in a fresh KV pool; no scheduler, no sampling."""
from __future__ import annotations

import torch

from backend.model.causal_lm import CausalLM
from backend.model.config import torch_dtype
from backend.model.kernels.causal_prefill import unsupported as causal_prefill_unsupported
from backend.model.quantized_kv import kv_pools
from backend.model.runner import model_step_tensors
from backend.model.step_inputs import StepInputs


@torch.inference_mode()
def window_logits(model: CausalLM, windows: torch.Tensor, kv_dtype: torch.dtype | None = None,
                  causal_prefill: bool = False) -> torch.Tensor:
    """windows (B, n) int64 token ids -> (B, n, vocab) float32: position j's logits predict token j + 1.

    Each window is a whole prompt to the model (its rope state is that of an n-token prompt). kv_dtype: the KV
    pool's, where it is not the model's (bf16 beside bf16 linears, as the engine keeps it). causal_prefill: attend
    with the compiled causal kernel where it applies (backend/model/kernels/causal_prefill.py), as the engine does."""
    if windows.dim() != 2 or windows.shape[1] == 0:
        raise ValueError(f"windows must be (batch, tokens) with tokens >= 1, got shape {tuple(windows.shape)}")
    cfg = model.config
    B, n = windows.shape
    if n > cfg.max_position_embeddings:
        raise ValueError(f"windows of {n} tokens exceed max_position_embeddings ({cfg.max_position_embeddings})")
    device, dtype = next(model.parameters()).device, torch_dtype(cfg)  # lm_head may be prepacked: no .weight
    if causal_prefill and (reason := causal_prefill_unsupported(cfg.head_size, kv_dtype or dtype, device)):
        raise ValueError(f"causal_prefill: {reason}")
    inputs = StepInputs.of(tokens=windows.reshape(-1).long(), start=torch.zeros(B, dtype=torch.long),
                           end=torch.full((B,), n), sampled=torch.ones(B, dtype=torch.long),
                           context_slots=torch.arange(B * n).view(B, n))
    input_ids, meta, _ = model_step_tensors(model, inputs, device, causal_prefill=causal_prefill)
    kv = kv_pools(model.transformer.layers, (B * n, cfg.num_key_value_heads, cfg.head_size), kv_dtype or dtype,
                  device)
    logits = model(input_ids, meta, kv, torch.arange(B * n, device=device))  # (B * n, vocab)
    return logits.view(B, n, -1)

"""Llama decoder over a flat batch of tokens with a paged KV cache.

The model knows nothing of batching policy, parallelism or quantization: it takes the tokens of this step
(prefill chunks and decode tokens of many sequences, concatenated) and an AttentionMetadata that says where
their K/V go in the cache and which cached positions each query may see. Parameter names follow the
TensorRT-LLM checkpoint (transformer.layers.N.attention.qkv, mlp.fc/gate/proj, ...), so a checkpoint loads as is.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from backend.model.config import ModelConfig


@dataclass
class AttentionMetadata:
    """Where this step's tokens sit, built once per step and shared by every layer.

    T = tokens this step, B = sequences, Q = most new tokens of one sequence, L = longest context (cached + new).
    """

    slot_mapping: torch.Tensor  # (T,) cache slot receiving each new token's K/V
    query_index: torch.Tensor  # (B, Q) flat token index of each sequence's new tokens, padded with 0
    query_flat: torch.Tensor  # (T,) index of each flat token in the padded (B * Q) layout
    context_slots: torch.Tensor  # (B, L) cache slot of each context position, padded with 0
    mask: torch.Tensor  # (B, 1, Q, L) bool: query may attend to key (causal within its own context)
    cos: torch.Tensor  # (T, head_dim) rotary cos at each token's position
    sin: torch.Tensor  # (T, head_dim)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32, as HF Llama does, then cast back.
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotary_tables(head_dim: int, max_positions: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin (max_positions, head_dim) for GPT-NeoX style rotary embedding (halves rotated)."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)  # (P, head_dim / 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x (T, heads, head_dim); cos/sin (T, head_dim) broadcast over heads.
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads
        self.head_dim = cfg.head_size
        self.qkv = nn.Linear(cfg.hidden_size, (self.n_heads + 2 * self.n_kv) * self.head_dim, bias=False)
        self.dense = nn.Linear(self.n_heads * self.head_dim, cfg.hidden_size, bias=False)

    def forward(
        self, x: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        # x (T, hidden); k_cache/v_cache (slots, n_kv, head_dim)
        T = x.shape[0]
        q, k, v = self.qkv(x).split(
            [self.n_heads * self.head_dim, self.n_kv * self.head_dim, self.n_kv * self.head_dim], dim=-1
        )
        q = apply_rotary(q.view(T, self.n_heads, self.head_dim), meta.cos, meta.sin)
        k = apply_rotary(k.view(T, self.n_kv, self.head_dim), meta.cos, meta.sin)
        k_cache[meta.slot_mapping] = k
        v_cache[meta.slot_mapping] = v.view(T, self.n_kv, self.head_dim)

        B, Q = meta.query_index.shape
        q_pad = q[meta.query_index].transpose(1, 2)  # (B, n_heads, Q, head_dim)
        k_ctx = k_cache[meta.context_slots].transpose(1, 2)  # (B, n_kv, L, head_dim)
        v_ctx = v_cache[meta.context_slots].transpose(1, 2)
        out = F.scaled_dot_product_attention(q_pad, k_ctx, v_ctx, attn_mask=meta.mask, enable_gqa=True)
        out = out.transpose(1, 2).reshape(B * Q, self.n_heads * self.head_dim)[meta.query_flat]  # (T, heads*dim)
        return self.dense(out)


class GatedMLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)  # goes through SiLU (HF gate_proj)
        self.gate = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)  # HF up_proj
        self.proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)  # HF down_proj

        self.fc_gate: torch.Tensor | None = None  # (2 * intermediate, hidden): fc and gate in one matmul

    def fuse(self) -> None:
        """After loading: one matmul for both input projections (fewer, larger kernels: small batches on CPU are
        bound by per-call overhead). Only plain float linears fuse; modules swapped in afterwards (quantized
        ones, say) keep their own forward."""
        if type(self.fc) is not nn.Linear or type(self.gate) is not nn.Linear:
            return
        self.fc_gate = torch.cat([self.fc.weight, self.gate.weight]).detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fc_gate is None:
            return self.proj(F.silu(self.fc(x)) * self.gate(x))
        fc, gate = F.linear(x, self.fc_gate).chunk(2, dim=-1)
        return self.proj(F.silu(fc) * gate)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.norm_epsilon)
        self.attention = Attention(cfg)
        self.post_layernorm = RMSNorm(cfg.hidden_size, cfg.norm_epsilon)
        self.mlp = GatedMLP(cfg)

    def forward(self, x: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        x = x + self.attention(self.input_layernorm(x), k_cache, v_cache, meta)
        return x + self.mlp(self.post_layernorm(x))


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.vocab_embedding = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.ln_f = RMSNorm(cfg.hidden_size, cfg.norm_epsilon)


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        self.transformer = Transformer(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        cos, sin = rotary_tables(cfg.head_size, cfg.max_position_embeddings, cfg.rotary_base)
        # Kept in float32 whatever the weights' dtype (see AttentionMetadata.cos); not part of the checkpoint.
        self.rope_cos, self.rope_sin = cos, sin

    def fuse(self) -> "LlamaForCausalLM":
        for layer in self.transformer.layers:
            layer.mlp.fuse()
        return self

    def to(self, *args, **kwargs) -> "LlamaForCausalLM":
        super().to(*args, **kwargs)
        device = next(self.parameters()).device
        self.rope_cos, self.rope_sin = self.rope_cos.to(device), self.rope_sin.to(device)
        return self

    def forward(
        self,
        input_ids: torch.Tensor,  # (T,)
        meta: AttentionMetadata,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],  # per layer (k, v), each (slots, n_kv, head_dim)
        logits_index: torch.Tensor,  # (S,) flat index of the tokens whose next-token logits are wanted
    ) -> torch.Tensor:
        x = self.transformer.vocab_embedding(input_ids)
        for layer, (k_cache, v_cache) in zip(self.transformer.layers, kv_caches):
            x = layer(x, k_cache, v_cache, meta)
        x = self.transformer.ln_f(x[logits_index])
        return self.lm_head(x).float()  # (S, vocab)

"""Megatron-style tensor parallelism applied to a built LlamaForCausalLM (TRT-LLM's split, build_engines/shard.py).

Column-parallel linears (attention.qkv, mlp.fc, mlp.gate) keep only this rank's output rows and need no
communication: their output stays split (by heads, by intermediate columns) into the next layer. Row-parallel
linears (attention.dense, mlp.proj) take that split input and all_reduce their partial sums, so every rank
ends each layer with the full hidden state. lm_head is split by (padded) vocabulary; the logits are
all_gathered so the rank that samples sees the whole vocabulary.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from backend.model import Attention, GatedMLP, LlamaForCausalLM
from build_engines.rank_layout import kv_heads_per_rank, padded_vocab


class ColumnParallelLinear(nn.Linear):
    """out_features / tp rows of the full weight; the output stays split across ranks."""


class RowParallelLinear(nn.Linear):
    """in_features / tp columns of the full weight; partial outputs are summed over the group."""

    def __init__(self, in_features: int, out_features: int, group: dist.ProcessGroup) -> None:
        super().__init__(in_features, out_features, bias=False, device="meta")
        self.group = group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        dist.all_reduce(out, group=self.group)
        return out


class VocabParallelLMHead(nn.Linear):
    """(padded_vocab / tp, hidden) rows; forward returns (S, vocab) logits, gathered from every rank."""

    def __init__(self, hidden: int, vocab_size: int, tp_size: int, group: dist.ProcessGroup) -> None:
        super().__init__(hidden, padded_vocab(vocab_size, tp_size) // tp_size, bias=False, device="meta")
        self.vocab_size, self.tp_size, self.group = vocab_size, tp_size, group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        local = super().forward(x).contiguous()  # (S, padded_vocab / tp)
        parts = [torch.empty_like(local) for _ in range(self.tp_size)]
        dist.all_gather(parts, local, group=self.group)
        return torch.cat(parts, dim=-1)[:, : self.vocab_size]  # drop the padding columns


def _column(full: nn.Linear, rows: int) -> ColumnParallelLinear:
    return ColumnParallelLinear(full.in_features, rows, bias=False, device="meta")


def _parallel_attention(attn: Attention, tp_size: int, group: dist.ProcessGroup) -> None:
    n_heads, n_kv = attn.n_heads // tp_size, kv_heads_per_rank(attn.n_kv, tp_size)
    attn.qkv = _column(attn.qkv, (n_heads + 2 * n_kv) * attn.head_dim)
    attn.dense = RowParallelLinear(n_heads * attn.head_dim, attn.dense.out_features, group)
    attn.n_heads, attn.n_kv = n_heads, n_kv  # forward() splits q/k/v and sizes attention by these


def _parallel_mlp(mlp: GatedMLP, tp_size: int, group: dist.ProcessGroup) -> None:
    inter = mlp.fc.out_features // tp_size
    mlp.fc, mlp.gate = _column(mlp.fc, inter), _column(mlp.gate, inter)
    mlp.proj = RowParallelLinear(inter, mlp.proj.out_features, group)


def apply_tensor_parallel(model: LlamaForCausalLM, tp_size: int, group: dist.ProcessGroup) -> LlamaForCausalLM:
    """Replace the linears with their tp_size-way parallel versions (on the meta device: load the rank's
    weights next, with load_state_dict(assign=True)). The embedding and the norms stay whole (replicated)."""
    if tp_size == 1:
        return model
    for layer in model.transformer.layers:
        _parallel_attention(layer.attention, tp_size, group)
        _parallel_mlp(layer.mlp, tp_size, group)
    if isinstance(model.lm_head, nn.Linear):
        model.lm_head = VocabParallelLMHead(model.lm_head.in_features, model.config.vocab_size, tp_size, group)
    return model

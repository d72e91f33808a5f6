"""Megatron-style tensor parallelism applied to a built CausalLM (TRT-LLM's split, build_engines/shard.py).

Column-parallel linears (attention.qkv with its bias, mlp.fc, mlp.gate; a fused [up | gate] fc keeps its share of
each half) keep only this rank's output rows and need no communication: their output stays split (by heads, by intermediate columns) into the next layer. Row-parallel
linears (attention.dense, mlp.proj) take that split input and all_reduce their partial sums, so every rank
ends each layer with the full hidden state. lm_head is split by (padded) vocabulary; the logits are
all_gathered so the rank that samples sees the whole vocabulary.

Two steps, so that quantization can come in between (it swaps linears by their local shapes, and the
all_reduce must follow whatever module ends up in a row-parallel position): shard_linears() resizes,
add_all_reduce() hooks the row-parallel positions.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from backend.formats.rank_layout import kv_heads_per_rank, padded_vocab
from backend.model.causal_lm import CausalLM
from backend.model.decoder import Attention, GatedMLP

ROW_PARALLEL = ("attention.dense", "mlp.proj")  # inside each decoder layer


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


class VocabParallelEmbedding(nn.Embedding):
    """use_parallel_embedding (TRT-LLM forces it for Gemma under TP): (padded_vocab / tp, hidden) rows of the
    table per rank; each rank looks up the ids in its range (zeros elsewhere) and the sum over ranks is the row."""

    def __init__(self, vocab_size: int, hidden: int, tp_size: int, group: dist.ProcessGroup) -> None:
        super().__init__(padded_vocab(vocab_size, tp_size) // tp_size, hidden, device="meta")
        self.first = dist.get_rank(group) * self.num_embeddings
        self.group = group

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.first
        mine = (local >= 0) & (local < self.num_embeddings)
        out = super().forward(local.clamp(0, self.num_embeddings - 1)) * mine[:, None].to(self.weight.dtype)
        dist.all_reduce(out, group=self.group)
        return out


def _linear(in_features: int, out_features: int, bias: bool = False) -> nn.Linear:
    return nn.Linear(in_features, out_features, bias=bias, device="meta")


def _shard_attention(attn: Attention, tp_size: int) -> None:
    n_heads, n_kv = attn.n_heads // tp_size, kv_heads_per_rank(attn.n_kv, tp_size)
    attn.qkv = _linear(attn.qkv.in_features, (n_heads + 2 * n_kv) * attn.head_dim, attn.qkv.bias is not None)
    attn.dense = _linear(n_heads * attn.head_dim, attn.dense.out_features)  # row-parallel
    attn.n_heads, attn.n_kv = n_heads, n_kv  # forward() splits q/k/v and sizes attention by these


def _shard_mlp(mlp: GatedMLP, tp_size: int) -> None:
    inter = mlp.proj.in_features // tp_size
    mlp.fc = _linear(mlp.fc.in_features, inter * (2 if mlp.fused else 1))  # column (fused: [up_r | gate_r])
    if mlp.gate is not None:
        mlp.gate = _linear(mlp.gate.in_features, inter)  # column
    mlp.proj = _linear(inter, mlp.proj.out_features)  # row-parallel


def shard_linears(model: CausalLM, tp_size: int, group: dist.ProcessGroup) -> CausalLM:
    """Resize the linears to this rank's share (on the meta device: load the rank's weights next, with
    load_state_dict(assign=True)). The embedding and the norms (q/k norms too: per head) stay whole (replicated)."""
    if tp_size == 1:
        return model
    for layer in model.transformer.layers:
        _shard_attention(layer.attention, tp_size)
        _shard_mlp(layer.mlp, tp_size)
    embedding = model.transformer.vocab_embedding
    if embedding is not None and model.config.use_parallel_embedding:
        model.transformer.vocab_embedding = VocabParallelEmbedding(embedding.num_embeddings, embedding.embedding_dim,
                                                                   tp_size, group)
    if model.lm_head is not None:
        model.lm_head = VocabParallelLMHead(model.lm_head.in_features, model.config.vocab_size, tp_size, group)
    return model


def add_all_reduce(model: CausalLM, tp_size: int, group: dist.ProcessGroup) -> CausalLM:
    """Sum the row-parallel outputs over the tensor-parallel group (a forward hook on whatever module sits there:
    a float or a quantized linear)."""
    if tp_size == 1:
        return model

    def all_reduce(_module: nn.Module, _inputs: tuple, out: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(out, group=group)
        return out

    for layer in model.transformer.layers:
        for name in ROW_PARALLEL:
            layer.get_submodule(name).register_forward_hook(all_reduce)
    return model

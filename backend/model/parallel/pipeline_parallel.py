"""Pipeline parallelism applied to a built CausalLM: each stage keeps its range of layers (TRT-LLM's
Mapping.pp_layers split: the first stages take one extra layer when the split is uneven), the first stage the
embedding, the last the final norm and lm_head. Hidden states go stage to stage with point-to-point send/recv,
tp_rank to the same tp_rank; within a step the stages run one after the other (no micro-batching).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from backend.formats.rank_layout import RankPosition
from backend.model.causal_lm import CausalLM
from backend.model.decoder import AttentionMetadata


def apply_pipeline(model: CausalLM, pos: RankPosition) -> CausalLM:
    """Drop what other stages hold; the kept layers are renumbered from 0, as the stage's rank file names them."""
    if pos.pp_size == 1:
        return model
    layers = pos.layers(model.config.num_hidden_layers)
    model.transformer.layers = nn.ModuleList(model.transformer.layers[i] for i in layers)
    if not pos.is_first_stage:
        model.transformer.vocab_embedding = None
    if not pos.is_last_stage:
        model.transformer.ln_f = None
        model.lm_head = None
    return model


def stage_forward(
    model: CausalLM,
    pos: RankPosition,
    input_ids: torch.Tensor,  # (T,)
    meta: AttentionMetadata,
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]],  # this stage's layers only
    logits_index: torch.Tensor,  # (S,)
    dtype: torch.dtype,
) -> torch.Tensor | None:
    """This stage's part of CausalLM.forward: logits (S, vocab) on the last stage, None elsewhere."""
    if pos.is_first_stage:
        x = model.embed(input_ids)
    else:
        x = torch.empty(input_ids.shape[0], model.config.hidden_size, dtype=dtype, device=input_ids.device)
        dist.recv(x, src=pos.prev_stage_rank)  # (T, hidden) from the previous stage
    x = model.run_layers(x, meta, kv_caches)
    if not pos.is_last_stage:
        dist.send(x.contiguous(), dst=pos.next_stage_rank)
        return None
    return model.head(x[logits_index])


def logits_to_driver(logits: torch.Tensor | None, pos: RankPosition, num_sampled: int, vocab_size: int,
                     device: torch.device) -> torch.Tensor | None:
    """Bring the last stage's logits to rank 0, which samples; returns them on rank 0, None elsewhere."""
    last_stage_head = pos.stage_ranks(pos.pp_size - 1)[0]
    if last_stage_head == 0:  # pp_size 1: rank 0 gathered the logits itself
        return logits if pos.rank == 0 else None
    if pos.rank == last_stage_head and num_sampled:
        dist.send(logits.contiguous(), dst=0)
    if pos.rank != 0:
        return None
    out = torch.empty(num_sampled, vocab_size, dtype=torch.float32, device=device)
    if num_sampled:
        dist.recv(out, src=last_stage_head)
    return out

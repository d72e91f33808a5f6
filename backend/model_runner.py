"""Turns a scheduled step into tensors, runs the model, returns next-token logits."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from backend.block_manager import BlockManager
from backend.model import AttentionMetadata, LlamaForCausalLM
from backend.model_config import torch_dtype
from backend.sequence import Sequence


@dataclass(frozen=True)
class ScheduledSeq:
    seq: Sequence
    num_new_tokens: int  # tokens of this sequence processed this step (a prefill chunk, or 1 to decode)

    @property
    def start(self) -> int:
        return self.seq.num_computed_tokens

    @property
    def end(self) -> int:
        return self.seq.num_computed_tokens + self.num_new_tokens

    @property
    def samples(self) -> bool:
        """Whether this step yields the sequence's next token (its prompt is then fully in the cache)."""
        return self.end == self.seq.num_tokens


class KVCache:
    """Per layer K and V pools: (num_blocks * block_size, n_kv_heads, head_dim) each."""

    def __init__(self, model: LlamaForCausalLM, num_blocks: int, block_size: int, device: torch.device) -> None:
        cfg = model.config
        shape, dtype = (num_blocks * block_size, cfg.num_key_value_heads, cfg.head_size), torch_dtype(cfg)
        self.layers = [
            (torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
            for _ in range(cfg.num_hidden_layers)
        ]


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM, blocks: BlockManager, device: torch.device) -> None:
        self.model = model
        self.blocks = blocks
        self.device = device
        self.kv = KVCache(model, blocks.num_blocks, blocks.block_size, device)

    @torch.inference_mode()
    def run(self, batch: list[ScheduledSeq]) -> torch.Tensor:
        """Process every scheduled token; return logits (S, vocab) for the sequences that sample, in batch order."""
        input_ids, meta, logits_index = self._prepare(batch)
        return self.model(input_ids, meta, self.kv.layers, logits_index)

    def _prepare(self, batch: list[ScheduledSeq]) -> tuple[torch.Tensor, AttentionMetadata, torch.Tensor]:
        """Index tensors for the step, built with vectorised ops from the block tables (no per-token Python)."""
        start = torch.tensor([item.start for item in batch])  # (B,) first new position of each sequence
        end = torch.tensor([item.end for item in batch])  # (B,) context length after this step
        q_len = end - start
        B, Q, L = len(batch), int(q_len.max()), int(end.max())
        keys = torch.arange(L)
        ctx_valid = keys[None, :] < end[:, None]  # (B, L)
        ctx_slots = self.blocks.slots([item.seq for item in batch], end)  # (B, L)
        offsets = torch.arange(Q)
        q_valid = offsets[None, :] < q_len[:, None]  # (B, Q)
        q_pos = torch.where(q_valid, start[:, None] + offsets, 0)  # (B, Q); padded queries sit at position 0
        first = torch.cumsum(q_len, 0) - q_len  # (B,) flat index of each sequence's first new token
        q_idx = torch.where(q_valid, first[:, None] + offsets, 0)
        # Query at position p sees keys at positions <= p; padded queries see key 0 only, so no row is empty.
        mask = (keys[None, None, :] <= q_pos[:, :, None]) & ctx_valid[:, None, :]  # (B, Q, L)
        positions = q_pos[q_valid]  # (T,)
        sampled = torch.tensor([item.samples for item in batch])
        tokens = [t for item in batch for t in item.seq.token_ids[item.start : item.end]]
        dev, dtype = self.device, torch_dtype(self.model.config)
        meta = AttentionMetadata(
            slot_mapping=ctx_slots.gather(1, q_pos)[q_valid].to(dev),
            query_index=q_idx.to(dev),
            query_flat=(torch.arange(B)[:, None] * Q + offsets)[q_valid].to(dev),
            context_slots=ctx_slots.to(dev),
            mask=mask[:, None].to(dev),
            cos=self.model.rope_cos[positions.to(dev)].to(dtype),
            sin=self.model.rope_sin[positions.to(dev)].to(dtype),
        )
        logits_index = (first + q_len - 1)[sampled]  # the last new token of each sequence that samples
        return torch.tensor(tokens, dtype=torch.long, device=dev), meta, logits_index.to(dev)

"""Turns a scheduled step into tensors, runs the model, returns next-token logits."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from backend.block_manager import BlockManager
from backend.model import AttentionMetadata, LlamaForCausalLM
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
        shape = (num_blocks * block_size, cfg.num_key_value_heads, cfg.head_size)
        self.layers = [
            (torch.zeros(shape, dtype=cfg.torch_dtype, device=device), torch.zeros(shape, dtype=cfg.torch_dtype, device=device))
            for _ in range(cfg.num_hidden_layers)
        ]
        self.bytes = 2 * len(self.layers) * self.layers[0][0].numel() * self.layers[0][0].element_size()


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
        tokens: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        query_index: list[list[int]] = []
        context_slots: list[list[int]] = []
        logits_index: list[int] = []
        for item in batch:
            seq = item.seq
            first = len(tokens)
            tokens.extend(seq.token_ids[item.start : item.end])
            positions.extend(range(item.start, item.end))
            slots.extend(self.blocks.slot(seq, p) for p in range(item.start, item.end))
            query_index.append(list(range(first, len(tokens))))
            context_slots.append([self.blocks.slot(seq, p) for p in range(item.end)])
            if item.samples:
                logits_index.append(len(tokens) - 1)
        q_max = max(len(q) for q in query_index)
        l_max = max(len(c) for c in context_slots)
        B = len(batch)
        q_pos = torch.zeros(B, q_max, dtype=torch.long)
        q_idx = torch.zeros(B, q_max, dtype=torch.long)
        ctx = torch.zeros(B, l_max, dtype=torch.long)
        ctx_len = torch.zeros(B, 1, 1, dtype=torch.long)
        q_flat: list[int] = []
        for b, (item, q, c) in enumerate(zip(batch, query_index, context_slots)):
            q_idx[b, : len(q)] = torch.tensor(q)
            q_pos[b, : len(q)] = torch.arange(item.start, item.end)
            ctx[b, : len(c)] = torch.tensor(c)
            ctx_len[b] = len(c)
            q_flat.extend(b * q_max + i for i in range(len(q)))
        keys = torch.arange(l_max)
        # Query at position p sees keys at positions <= p; padded queries (position 0) see key 0 only, so no row is empty.
        mask = (keys[None, None, :] <= q_pos[:, :, None]) & (keys[None, None, :] < ctx_len)
        pos = torch.tensor(positions, dtype=torch.long)
        dtype = self.model.config.torch_dtype
        dev = self.device
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=dev),
            query_index=q_idx.to(dev),
            query_flat=torch.tensor(q_flat, dtype=torch.long, device=dev),
            context_slots=ctx.to(dev),
            mask=mask[:, None].to(dev),
            cos=self.model.rope_cos[pos.to(dev)].to(dtype),
            sin=self.model.rope_sin[pos.to(dev)].to(dtype),
        )
        ids = torch.tensor(tokens, dtype=torch.long, device=dev)
        return ids, meta, torch.tensor(logits_index, dtype=torch.long, device=dev)

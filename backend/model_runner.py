"""Turns a scheduled step into tensors, runs the model, returns next-token logits."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from backend.block_manager import BlockManager
from backend.model import AttentionMetadata, LlamaForCausalLM
from backend.model_config import torch_dtype
from backend.quantized_kv import kv_pools
from backend.sequence import Sequence
from backend.step_inputs import StepInputs, step_tensors


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
    """Per layer K and V pools: (num_blocks * block_size, n_kv_heads, head_dim) each (FP8 pools for an FP8 KV
    cache, backend/quantized_kv.py)."""

    def __init__(self, model: LlamaForCausalLM, num_blocks: int, block_size: int, device: torch.device) -> None:
        cfg = model.config
        shape = (num_blocks * block_size, cfg.num_key_value_heads, cfg.head_size)
        self.layers = kv_pools(model.transformer.layers, shape, torch_dtype(cfg), device)


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

    def close(self) -> None:
        """Nothing outlives an in-process runner (backend/parallel/driver.py's has worker processes)."""

    def _prepare(self, batch: list[ScheduledSeq]) -> tuple[torch.Tensor, AttentionMetadata, torch.Tensor]:
        inputs = StepInputs.from_batch(batch, self.blocks)
        model = self.model
        return step_tensors(inputs, model.rope_cos, model.rope_sin, torch_dtype(model.config), self.device)

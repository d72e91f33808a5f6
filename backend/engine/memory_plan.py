"""How many KV tokens the cache holds: from max_tokens_in_paged_kv_cache and a fraction of free memory (the
anchor's kv_cache_free_gpu_mem_fraction), at 2 x layers x kv_heads x head_dim x bytes per token. With a sliding
window on every layer a sequence never holds more than its window's blocks (block_manager.max_live_blocks), so
one sequence needs that much, not max_seq_len."""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch

from backend.engine.config import EngineConfig
from backend.model.config import ModelConfig, kv_bytes_per_token, kv_window

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KVPlan:
    bytes_per_token: int
    tokens: int  # capacity, a whole number of blocks
    blocks: int
    free_bytes: int  # device memory free when planned (after the weights were loaded)
    reason: str  # which limit decided

    def describe(self) -> str:
        return (f"KV cache: {self.blocks} blocks = {self.tokens} tokens x {self.bytes_per_token} B/token = "
                f"{self.tokens * self.bytes_per_token / 2**20:.1f} MiB ({self.reason}; {self.free_bytes / 2**30:.1f} "
                f"GiB free)")


def free_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def sequence_kv_tokens(model: ModelConfig, engine: EngineConfig) -> int:
    """KV tokens one max_seq_len sequence holds at once: all of them, or (every layer sliding) its window's blocks
    plus a prefill chunk's."""
    window, block = kv_window(model), engine.tokens_per_block
    if window is None:
        return engine.max_seq_len
    live_blocks = -(-(window - 1 + engine.max_num_tokens) // block) + 1
    return min(engine.max_seq_len, live_blocks * block)


def plan_kv_cache(model: ModelConfig, engine: EngineConfig, free_bytes: int) -> KVPlan:
    """Capacity = the smallest of: max_tokens_in_paged_kv_cache (or, unset, max_batch_size full-length sequences),
    and the fraction of free memory. Raises ValueError if not even one full-length sequence fits."""
    per_token = kv_bytes_per_token(model)
    by_memory = int(free_bytes * engine.kv_cache_free_mem_fraction) // per_token
    one_sequence = sequence_kv_tokens(model, engine)
    wanted = (engine.max_tokens_in_paged_kv_cache if engine.max_tokens_in_paged_kv_cache is not None
              else engine.max_batch_size * one_sequence)
    reason = ("max_tokens_in_paged_kv_cache" if engine.max_tokens_in_paged_kv_cache is not None
              else "max_batch_size x max_seq_len")
    if by_memory < wanted:
        wanted, reason = by_memory, f"kv_cache_free_mem_fraction {engine.kv_cache_free_mem_fraction}"
    blocks = wanted // engine.tokens_per_block
    if blocks * engine.tokens_per_block < one_sequence:
        at_once = (f" holds at once ({one_sequence} tokens, its sliding window's blocks)"
                   if one_sequence < engine.max_seq_len else "")
        raise ValueError(
            f"the KV cache would hold {blocks * engine.tokens_per_block} tokens ({reason}), less than one "
            f"max_seq_len ({engine.max_seq_len}) sequence{at_once}: lower max_seq_len or give the cache more memory"
        )
    return KVPlan(per_token, blocks * engine.tokens_per_block, blocks, free_bytes, reason)

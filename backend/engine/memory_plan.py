"""How many KV tokens the cache holds: from max_tokens_in_paged_kv_cache and a fraction of free memory (the
anchor's kv_cache_free_gpu_mem_fraction), at 2 x layers x kv_heads x head_dim x bytes per token."""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch

from backend.engine.config import EngineConfig
from backend.model.config import ModelConfig, kv_bytes_per_token

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


def plan_kv_cache(model: ModelConfig, engine: EngineConfig, free_bytes: int) -> KVPlan:
    """Capacity = the smallest of: max_tokens_in_paged_kv_cache (or, unset, max_batch_size full-length sequences),
    and the fraction of free memory. Raises ValueError if not even one full-length sequence fits."""
    per_token = kv_bytes_per_token(model)
    by_memory = int(free_bytes * engine.kv_cache_free_mem_fraction) // per_token
    wanted = engine.kv_cache_tokens
    reason = ("max_tokens_in_paged_kv_cache" if engine.max_tokens_in_paged_kv_cache is not None
              else "max_batch_size x max_seq_len")
    if by_memory < wanted:
        wanted, reason = by_memory, f"kv_cache_free_mem_fraction {engine.kv_cache_free_mem_fraction}"
    blocks = wanted // engine.tokens_per_block
    if blocks * engine.tokens_per_block < engine.max_seq_len:
        raise ValueError(
            f"the KV cache would hold {blocks * engine.tokens_per_block} tokens ({reason}), less than one "
            f"max_seq_len ({engine.max_seq_len}) sequence: lower max_seq_len or give the cache more memory"
        )
    return KVPlan(per_token, blocks * engine.tokens_per_block, blocks, free_bytes, reason)

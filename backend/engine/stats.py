"""Snapshots of the engine's state for metrics (the anchor's nv_trt_llm_* families), taken on the engine thread."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineStats:
    # nv_trt_llm_request_metrics{request_type=...}
    active_requests: int  # running: admitted, with KV
    max_requests: int  # the running batch's capacity (max_batch_size)
    scheduled_requests: int  # in the last step
    context_requests: int  # in the last step, still prefilling
    waiting_requests: int  # queued, not admitted yet
    # nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=...}
    max_blocks: int
    free_blocks: int
    used_blocks: int
    tokens_per_block: int
    reused_blocks: int  # cumulative: prompt blocks served from the prefix cache
    cached_blocks: int  # free blocks whose K/V are indexed for reuse
    # nv_trt_llm_inflight_batcher_metrics / nv_trt_llm_general_metrics
    total_context_tokens: int  # prefill tokens in the last step
    generation_requests: int  # decoding sequences in the last step
    paused_requests: int  # cumulative preemptions (max_utilization)
    iteration_counter: int
    timestamp_us: int
    prefix_cache_hit_rate: float  # reused / looked-up full prompt blocks, over admitted requests

    @property
    def used_fraction(self) -> float:
        return self.used_blocks / self.max_blocks if self.max_blocks else 0.0


@dataclass(frozen=True)
class StepSummary:
    """What the last engine step ran."""

    scheduled: int = 0
    context: int = 0
    context_tokens: int = 0

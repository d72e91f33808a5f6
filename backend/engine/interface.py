"""The engine interface the serving layer drives (backend/serving/engine_loop.py), and what a step hands back.

Two engines implement it: LLMEngine (ours, backend/engine/llm_engine.py) and TrtllmExecutorEngine (TensorRT-LLM's
executor over a trtllm-build engine dir, backend/engine/trtllm_executor.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from backend.engine.config import EngineConfig
from backend.engine.sequence import FinishReason, Request, TopLogProbs
from backend.engine.stats import EngineStats


# PerfMetrics and RequestOutput are made for every sequence of every step and never changed after: not frozen, since a
# frozen dataclass's __init__ sets each field through object.__setattr__ (~4x the time: ~60 us of a batch-16 decode
# step on the development CPU, 2 % of the demo model's).
@dataclass(slots=True)
class PerfMetrics:
    """The anchor's per-request perf outputs (return_perf_metrics)."""

    kv_cache_alloc_new_blocks: int
    kv_cache_reused_blocks: int
    kv_cache_alloc_total_blocks: int
    arrival_time_ns: int
    first_scheduled_time_ns: int
    first_token_time_ns: int
    last_token_time_ns: int


@dataclass(slots=True)
class RequestOutput:
    """What one step produced for one request: its new tokens, and whether it is done."""

    request_id: str
    new_token_ids: list[int]
    new_log_probs: list[float]
    finished: bool
    finish_reason: FinishReason | None
    num_input_tokens: int
    num_output_tokens: int
    cum_log_prob: float | None = None
    perf: PerfMetrics | None = None
    error: str | None = None  # finish_reason ERROR: why this request failed (the others of its step go on)
    new_top_log_probs: list[TopLogProbs] = field(default_factory=list)  # per new token, with num_top_log_probs


class EngineCore(Protocol):
    """Driven by exactly one thread (the engine loop's): no method needs a lock."""

    config: EngineConfig

    def validate(self, request: Request) -> None:
        """Raise InvalidRequestError (naming the limit) for a request that could never run."""

    def add_request(self, request: Request) -> None: ...

    def abort(self, request_id: str) -> RequestOutput | None:
        """Stop a request and free what it holds; its last output (finish_reason CANCELLED), None if unknown."""

    def has_work(self) -> bool: ...

    def step(self) -> list[RequestOutput]:
        """Run one iteration; the outputs of every request that produced tokens or finished."""

    def stats(self) -> EngineStats: ...

    def close(self) -> None:
        """Release what outlives the object (worker processes, the executor)."""

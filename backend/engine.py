"""The engine: step() = schedule -> run model -> sample -> post-process -> emit."""
from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from backend.block_manager import BlockManager
from backend.checkpoint import load_model
from backend.config import EngineConfig
from backend.memory_plan import free_memory_bytes, plan_kv_cache
from backend.model_config import load_model_config
from backend.model_runner import ModelRunner
from backend.parallel.driver import ParallelModelRunner
from backend.sampler import sample
from backend.sampling_params import InvalidRequestError
from backend.scheduler import Scheduler
from backend.stats import EngineStats, StepSummary, snapshot
from backend.sequence import FinishReason, Request, Sequence, SeqStatus

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PerfMetrics:
    """The anchor's per-request perf outputs (return_perf_metrics)."""

    kv_cache_alloc_new_blocks: int
    kv_cache_reused_blocks: int
    kv_cache_alloc_total_blocks: int
    arrival_time_ns: int
    first_scheduled_time_ns: int
    first_token_time_ns: int
    last_token_time_ns: int


@dataclass(frozen=True)
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


class LLMEngine:
    def __init__(self, ckpt_dir: Path, config: EngineConfig) -> None:
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        self.config = config
        self.device = torch.device(config.device)
        self.model_config = cfg = load_model_config(ckpt_dir)
        # A sharded checkpoint runs on one process per rank (backend/parallel/): no whole model in this one.
        self.model = None if cfg.mapping.world_size > 1 else load_model(ckpt_dir, self.device)
        if config.max_seq_len > cfg.max_position_embeddings:
            raise ValueError(
                f"max_seq_len ({config.max_seq_len}) exceeds the model's max_position_embeddings "
                f"({cfg.max_position_embeddings})"
            )
        self.kv_plan = plan_kv_cache(cfg, config, free_memory_bytes(self.device))
        log.info("%s; 2 x %d layers x %d kv heads x %d dims x %s", self.kv_plan.describe(), cfg.num_hidden_layers,
                 cfg.num_key_value_heads, cfg.head_size, cfg.dtype)
        self.blocks = BlockManager(self.kv_plan.blocks, config.tokens_per_block, config.enable_kv_cache_reuse)
        self.runner = (ModelRunner(self.model, self.blocks, self.device) if self.model is not None
                       else ParallelModelRunner(ckpt_dir, cfg, self.blocks, self.device, config.num_threads or 1))
        self.scheduler = Scheduler(config, self.blocks)
        self.sequences: dict[str, Sequence] = {}
        self.iterations = 0
        self.last_step = StepSummary()

    @property
    def vocab_size(self) -> int:
        return self.model_config.vocab_size

    def close(self) -> None:
        """Release what outlives the object (a parallel engine's worker processes)."""
        self.runner.close()

    def validate(self, request: Request) -> None:
        """Refuse at admission what could never run (raises InvalidRequestError naming the limit)."""
        n, cfg = len(request.prompt_ids), self.config
        if n == 0:
            raise InvalidRequestError("the prompt is empty: at least one input token is needed")
        if n > cfg.max_input_len:
            raise InvalidRequestError(f"the prompt has {n} tokens, more than max_input_len ({cfg.max_input_len})")
        if request.sampling.max_tokens > cfg.max_output_len:
            raise InvalidRequestError(
                f"max_tokens ({request.sampling.max_tokens}) exceeds max_output_len ({cfg.max_output_len})"
            )
        # The KV plan holds at least one max_seq_len sequence: within max_seq_len, a request can always run.
        if n + request.sampling.max_tokens > cfg.max_seq_len:
            raise InvalidRequestError(
                f"prompt ({n} tokens) + max_tokens ({request.sampling.max_tokens}) exceeds max_seq_len ({cfg.max_seq_len})"
            )
        self._check_vocab("input token ids", request.prompt_ids)
        # The sampler indexes logits with these: an id outside the vocabulary would fail the whole batch's step.
        sampling = request.sampling
        self._check_vocab("end_id", [] if sampling.end_id is None else [sampling.end_id])
        self._check_vocab("stop word ids", [t for w in sampling.stop_words for t in w])
        self._check_vocab("bad word ids", [t for w in sampling.bad_words for t in w])
        if request.request_id in self.sequences:
            raise InvalidRequestError(f"request id {request.request_id!r} is already in flight")

    def _check_vocab(self, what: str, ids: Iterable[int]) -> None:
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise InvalidRequestError(f"{what} {bad[:5]} are outside the vocabulary [0, {self.vocab_size})")

    def add_request(self, request: Request) -> None:
        self.validate(request)
        if not request.arrival_time_ns:
            request = dataclasses.replace(request, arrival_time_ns=time.time_ns())
        seq = Sequence.from_request(request)
        self.sequences[request.request_id] = seq
        self.scheduler.add(seq)

    def abort(self, request_id: str) -> RequestOutput | None:
        seq = self.sequences.pop(request_id, None)
        if seq is None:
            return None
        self.scheduler.finish(seq)
        seq.status, seq.finish_reason = SeqStatus.FINISHED, FinishReason.CANCELLED
        return self._output(seq, *seq.take_emittable())

    def stats(self) -> EngineStats:
        return snapshot(self)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def step(self) -> list[RequestOutput]:
        batch = self.scheduler.schedule()
        context = [item for item in batch if item.seq.in_prefill]
        self.last_step = StepSummary(len(batch), len(context), sum(item.num_new_tokens for item in context))
        if not batch:
            return []
        self.iterations += 1
        now = time.time_ns()
        for item in batch:
            item.seq.first_scheduled_time_ns = item.seq.first_scheduled_time_ns or now
        logits = self.runner.run(batch)
        sampling = [item.seq for item in batch if item.samples]
        for item in batch:
            item.seq.num_computed_tokens = item.end
            self.blocks.register_full_blocks(item.seq)
        outputs = []
        now = time.time_ns()
        for seq, result in zip(sampling, sample(logits, sampling)):
            seq.first_token_time_ns = seq.first_token_time_ns or now
            seq.last_token_time_ns = now
            seq.append(result.token, result.log_prob)
            new, lps = seq.take_emittable()
            if seq.status is SeqStatus.FINISHED:
                self.scheduler.finish(seq)
                del self.sequences[seq.request_id]
            outputs.append(self._output(seq, new, lps))
        return outputs

    def _output(self, seq: Sequence, new: list[int], lps: list[float]) -> RequestOutput:
        cum = sum(seq.output_log_probs) if seq.request.sampling.return_log_probs else None
        return RequestOutput(
            request_id=seq.request_id,
            new_token_ids=new,
            new_log_probs=lps,
            finished=seq.status is SeqStatus.FINISHED,
            finish_reason=seq.finish_reason,
            num_input_tokens=seq.num_prompt_tokens,
            num_output_tokens=seq.num_output_tokens,
            cum_log_prob=cum,
            perf=PerfMetrics(
                kv_cache_alloc_new_blocks=seq.new_blocks,
                kv_cache_reused_blocks=seq.reused_blocks,
                kv_cache_alloc_total_blocks=seq.new_blocks + seq.reused_blocks,
                arrival_time_ns=seq.request.arrival_time_ns,
                first_scheduled_time_ns=seq.first_scheduled_time_ns,
                first_token_time_ns=seq.first_token_time_ns,
                last_token_time_ns=seq.last_token_time_ns,
            ),
        )

    def generate(self, requests: list[Request]) -> dict[str, list[int]]:
        """Run requests to completion in-process (tests, benchmarks): request id -> output token ids."""
        for r in requests:
            self.add_request(r)
        out: dict[str, list[int]] = {r.request_id: [] for r in requests}
        while self.has_work():
            for o in self.step():
                out[o.request_id].extend(o.new_token_ids)
        return out
